"""The held-out probe set (analysis/data/heldout_probes.tsv): prompts written for this project after
training, in the Table 6 format, half story half math, sharing no phrase with the corpus templates
and never appearing in generated training text."""
from __future__ import annotations

import re
from itertools import islice
from pathlib import Path

import pytest

import routescope.core_models.training as training
from routescope.analysis.runs import domain as D

from routescope.corpora import corpus

HELDOUT_PROBES = D.HELDOUT_PROBES  # the PaPaformer spec's held-out set
TEMPLATE_FILES = sorted(Path(training.__file__).parent.glob("*.py"))
N = 4  # no run of N words of a prompt may occur in the template files


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9$^%/=+().,:'*-]+", text.lower())


@pytest.fixture(scope="module")
def probes():
    return D.read_probes(HELDOUT_PROBES)


def test_format_and_balance(probes):
    assert list(probes.columns[:4]) == ["prompt_id", "domain", "expected_path", "prompt"]
    assert len(probes) == 40
    assert (probes["domain"].value_counts() == 20).all() and set(probes["domain"]) == {"story", "math"}
    assert ((probes["domain"] == "story") == (probes["expected_path"] == 1)).all()  # story path 1, math path 2
    assert not set(probes["prompt"]) & set(D.read_probes(D.DEFAULT_PROBES)["prompt"])


def test_no_prompt_shares_a_phrase_with_the_corpus_templates(probes):
    assert TEMPLATE_FILES
    template_text = " ".join(_words(" ".join(f.read_text() for f in TEMPLATE_FILES)))
    for pid, prompt in zip(probes["prompt_id"], probes["prompt"]):
        w = _words(prompt)
        runs = [" ".join(w[i:i + N]) for i in range(len(w) - N + 1)] or [" ".join(w)]
        found = [r for r in runs if f" {r} " in f" {template_text} "]
        assert not found, (pid, found)


def test_no_prompt_occurs_in_generated_training_text(probes):
    docs = [d.lower() for dom in corpus.DOMAINS for d in islice(corpus.iter_documents(dom, 0, "train"), 3000)]
    for pid, prompt in zip(probes["prompt_id"], probes["prompt"]):
        p = prompt.lower()
        assert not any(p in d for d in docs), pid
