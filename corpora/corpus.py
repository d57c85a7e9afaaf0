"""Deterministic, streamed synthetic training text in two domains.

- ``story``: TinyStories-like children's stories (see `stories` and the `plots_*` modules).
- ``math``: OpenMathInstruct-1-like questions with code-interpreter solutions (see `math_problems`).

Everything is drawn from explicit `random.Random` instances seeded from a stable hash, so the same
(domain, seed, split) always yields the same documents, on any machine and Python version. Nothing
is written to disk.
"""

from __future__ import annotations

import functools
import random
import zlib
from collections.abc import Iterator, Mapping
from itertools import islice

from routescope.corpora import story_plots_events, story_plots_home, story_plots_outdoors, story_plots_outings
from routescope.corpora.math_problems import KINDS, MathProblem
from routescope.corpora.math_word_problems import WORD_KINDS
from routescope.corpora.stories import Plot, Story, make_story

EOT = "<|endoftext|>"
PAD = "<|pad|>"
DOMAINS = ("story", "math")
SPLITS = ("train", "val")

VALIDATION_SEED = 20240601
# A document belongs to the validation split iff crc32(text) % _VAL_BUCKETS == 0. Train streams drop
# those documents and validation streams keep only them, so the splits can never share a document,
# even for short math questions that a generator may well draw twice.
_VAL_BUCKETS = 20

PLOT_TEMPLATES: tuple[Plot, ...] = story_plots_home.PLOTS + story_plots_outdoors.PLOTS + story_plots_outings.PLOTS + story_plots_events.PLOTS
# Word problems are about half of OpenMathInstruct-1 (GSM8K); the other half is MATH-style, where
# equations and exact arithmetic are the most common kinds.
_MATH_KINDS = KINDS + WORD_KINDS
_EMPHASIS = {"linear_equation": 3.0, "arithmetic": 2.0, "fraction_arithmetic": 2.0}
_MATH_STYLE = [_EMPHASIS.get(kind.__name__, 1.0) for kind in KINDS]
_MATH_WEIGHTS = [w / sum(_MATH_STYLE) for w in _MATH_STYLE] + [1.0 / len(WORD_KINDS)] * len(WORD_KINDS)


def stable_seed(*parts: object) -> int:
    """A seed from `parts` that is the same in every process (unlike the salted built-in hash())."""
    return zlib.crc32("|".join(map(str, parts)).encode("utf-8"))


def story(rng: random.Random) -> Story:
    return make_story(rng, PLOT_TEMPLATES)


def story_document(rng: random.Random) -> str:
    return story(rng).text


def math_problem(rng: random.Random) -> MathProblem:
    kind = rng.choices(_MATH_KINDS, weights=_MATH_WEIGHTS)[0]
    return kind(rng)


def math_document(rng: random.Random) -> str:
    return math_problem(rng).document


_GENERATORS = {"story": story_document, "math": math_document}


def is_validation(document: str) -> bool:
    return zlib.crc32(document.encode("utf-8")) % _VAL_BUCKETS == 0


def iter_documents(domain: str, seed: int, split: str = "train") -> Iterator[str]:
    """An endless stream of documents of one domain (without EOT)."""
    if domain not in _GENERATORS:
        raise ValueError(f"unknown domain {domain!r}; expected one of {DOMAINS}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    generate = _GENERATORS[domain]
    rng = random.Random(stable_seed(domain, split, seed))
    want_val = split == "val"
    while True:
        document = generate(rng)
        if is_validation(document) == want_val:
            yield document


@functools.lru_cache(maxsize=8)
def _validation(domain: str, n: int) -> tuple[str, ...]:
    return tuple(islice(iter_documents(domain, VALIDATION_SEED, "val"), n))


def validation_documents(domain: str, n: int = 200) -> list[str]:
    """The fixed validation set of a domain: the first `n` documents of its validation stream."""
    return list(_validation(domain, n))


def validation_rows(tokenizer, domain: str, n_docs: int, seq_len: int) -> list[list[int]]:
    """A domain's validation documents (each followed by EOT) as token ids packed into rows of
    seq_len + 1 (input and shifted target); the tail that fills no row is dropped. `tokenizer`: any
    object whose `encode(text).ids` gives ids (an HF tokenizers Tokenizer)."""
    ids: list[int] = []
    for doc in validation_documents(domain, n_docs):
        ids.extend(tokenizer.encode(doc + EOT).ids)
    width = seq_len + 1
    return [ids[i:i + width] for i in range(0, len(ids) // width * width, width)]


def iter_text(domains: Mapping[str, float] | str, seed: int, split: str = "train") -> Iterator[str]:
    """Documents from several domains mixed by weight, each followed by EOT.

    Each domain keeps its own stream, so a domain's documents do not depend on the weights.
    """
    return (text for _, text in iter_labelled_text(domains, seed, split))


def iter_labelled_text(domains: Mapping[str, float] | str, seed: int,
                       split: str = "train") -> Iterator[tuple[str, str]]:
    """(domain, document + EOT) pairs of the `iter_text` stream (the same documents, same order)."""
    weights = {domains: 1.0} if isinstance(domains, str) else dict(domains)
    if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"weights must be non-negative and not all zero, got {weights}")
    names = sorted(weights)
    streams = {name: iter_documents(name, seed, split) for name in names}
    rng = random.Random(stable_seed("mix", split, seed))
    probs = [weights[name] for name in names]
    while True:
        name = rng.choices(names, weights=probs)[0]
        yield name, next(streams[name]) + EOT
