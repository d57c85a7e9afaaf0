"""The datasets that ship with RouteScope, by name: each family's probe sets (`ProbeTable.sets`: a
prompt file labelled by domain and expected path) and the validation splits of the synthetic corpus
(fixed documents per domain, labelled by domain). The views and `routescope corpus --shipped` list
them; each loads as a `CorpusData` (`analysis.inputs.datasets`).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from routescope.analysis.inputs.datasets import CorpusData, CorpusRow, load_corpus, rows_corpus
from routescope.analysis.runs.family_table import probe_tables
from routescope.corpora.corpus import validation_documents

VALIDATION_DOCS = 200  # documents per domain of a shipped validation split (the corpus' default)


def validation_split(domains: Sequence[str], n_docs: int = VALIDATION_DOCS, max_chars: int | None = None) -> CorpusData:
    """The fixed validation documents of each domain (`corpora.corpus.validation_documents`), one
    row per document, labelled by its domain."""
    rows = [CorpusRow(f"{d}-{k + 1}", doc if max_chars is None else doc[:max_chars], (d,))
            for d in domains for k, doc in enumerate(validation_documents(d, n_docs))]
    return rows_corpus(f"validation split: {' + '.join(domains)} ({n_docs} documents each)", rows, ["domain"])


def _probe_file(path: Any) -> Callable[[], CorpusData]:
    return lambda: load_corpus(path, label_columns=("domain", "expected_path"))


def _validation(*domains: str) -> Callable[[], CorpusData]:
    return lambda: validation_split(domains)


VALIDATIONS: dict[str, Callable[[], CorpusData]] = {
    "validation split: story + math": _validation("story", "math"),
    "validation split: story": _validation("story"),
    "validation split: math": _validation("math"),
}
VALIDATION_IDS = ("validation", "validation-story", "validation-math")


def shipped_datasets() -> dict[str, Callable[[], CorpusData]]:
    """Shown name -> loader: the probe sets that families register (`family_table.probe_tables`:
    `ProbeTable.sets`, labelled by domain and expected path; the first is the views' default: 20
    prompts, instant), then the validation splits."""
    probes = {f"{name} probes": _probe_file(path) for t in probe_tables().values() for name, path in t.sets.items()}
    return {**probes, **VALIDATIONS}


def shipped_ids() -> dict[str, str]:
    """Short names for the command line (`routescope corpus --shipped NAME`) -> shown names: a probe
    set's name in lower case without spaces or hyphens, then VALIDATION_IDS."""
    names = list(shipped_datasets())
    probes = names[:len(names) - len(VALIDATIONS)]
    short = [re.sub(r"[\s-]", "", n.removesuffix(" probes").lower()) for n in probes]
    return dict(zip([*short, *VALIDATION_IDS], names))


def shipped(name: str) -> CorpusData:
    """A shipped dataset by its name or short name."""
    ids, datasets = shipped_ids(), shipped_datasets()
    name = ids.get(name, name)
    if name not in datasets:
        raise ValueError(f"no shipped dataset {name!r} (shipped: {', '.join(ids)})")
    return datasets[name]()
