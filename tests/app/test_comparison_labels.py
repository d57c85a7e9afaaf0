"""The Corpus view's comparison names both checkpoints wherever it names one (issue 41, item 5): the
summary (on the page and in summary.csv), the download panel's title and corpus.html's title; the
caption over the compared tables says what the downloaded files hold; and the summary's
ablation_specs are the ablation it records (a Drop box ticked at the left, not "none")."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pandas as pd

from test_corpus_view import CK, TSV, corpus_view, downloads, tables_of, until_done, upload  # noqa: F401

from routescope.analysis.corpus.run import run_corpus
from routescope.analysis.inputs import datasets as D
from routescope.app import state as K
from routescope.app.views.ablation import spec_lines
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint
from routescope.rendering.corpus_report import page

A, B = "papaformer-gumbel-v1", "papaformer-gumbel-v2"


def csv(data: bytes) -> pd.DataFrame:
    return pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False)


def test_a_comparison_names_both_checkpoints_and_its_files_match_the_caption(downloads):
    at = corpus_view(A)
    path = at.selectbox(key=K.CHECKPOINT).value
    at.checkbox(key=K.drop_global_key(path, 1)).check().run()  # an ablation from a box, not a typed spec
    upload(at, "probes.tsv", TSV)
    box = at.selectbox(key=K.CORPUS_COMPARE)
    box.set_value(next(p for p in box.options if Path(p).name == B)).run()
    until_done(at)
    assert not at.error, [e.value for e in at.error]
    # the summary on the page: a value column per checkpoint
    summary = next(t for t in tables_of(at) if "metric" in t.columns).set_index("metric")
    assert list(summary.loc["model"]) == [A, B]
    # summary.csv: the same, and named by both
    name, data = next((n, d) for n, d in downloads.values() if n and n.endswith("_summary.csv"))
    assert A in name and B in name
    assert list(csv(data).set_index("metric").loc["model"]) == [A, B]
    # the download panel's title
    title = next(e.label for e in at.expander if e.label.startswith("Download the tables"))
    assert A in title and B in title
    # the caption over the compared tables says how the files name the columns: as the files do
    files = {n: csv(d) for n, d in downloads.values() if n and "_compare_" in n and n.endswith(".csv")}
    assert files
    shown = [set(t.columns) for t in tables_of(at)]
    for n, f in files.items():
        assert set(f.columns) in shown, n  # each file's columns are those of a table on the page
        assert any(A in c for c in f.columns) and any(B in c for c in f.columns), n
    captions = [c.value for c in at.caption if "downloaded files" in c.value]
    assert captions
    for claim in captions:
        for suffix in re.findall(r"(?<![A-Za-z0-9])_(?:a|b|diff)\b", claim):  # a suffix the caption promises
            assert any(c.endswith(suffix) for f in files.values() for c in f.columns), (suffix, claim)
    # ablation_specs are the ablation recorded beside them, read back through the spec grammar
    model, _ = load_checkpoint(CK / A)
    for col in summary.columns:
        specs = summary.loc["ablation_specs", col]
        ablation = Ablation.parse(*spec_lines(specs), layers=model.routing_layers())
        assert ablation.describe() == summary.loc["ablation", col] == "drop *:1", (col, specs)


def test_the_page_title_names_both_checkpoints():
    data = D.load_corpus(TSV, "probes.tsv")
    results = []
    for name in (A, B):
        model, tok = load_checkpoint(CK / name)
        results.append(run_corpus(model, tok, data, name=name, decode=lambda i, t=tok: t.decode([i])))
    html = page(results[0], results[0].tables(min_count=1), model.option_labels(), other=results[1], compared={})
    title = re.search(r"<title>(.*?)</title>", html, re.S)[1]
    assert A in title and B in title, title
    alone = page(results[0], results[0].tables(min_count=1), model.option_labels())
    assert B not in re.search(r"<title>(.*?)</title>", alone, re.S)[1]
