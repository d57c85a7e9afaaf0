"""Routing report of any checkpoint (`routescope report`): the corpus view's page over each
domain's validation split, with two sections of its own.

1. The corpus view (`analysis.corpus.stats`, `analysis.corpus.run`) over the first `n_docs` validation
   documents of each domain (`corpus_data.validation_split`, labelled by domain), each cut to its
   first `seq_len` tokens: utilisation with dead and overloaded options, routes by domain, token
   specialisation, co-routing; per-call values for families without per-token routes. Where the
   family's spec declares probe prompts (`analysis.runs.family_table.ProbeTable`), each domain's intended
   option is the one its probes expect, so the page also shows accuracy on validation tokens.
2. Routing accuracy (where the spec declares probes): each probe set's routes against their
   expected paths and the paper's printed routes (`ProbeTable.accuracy`).
3. Dropping each option (any family with routing layers): validation loss per domain with option j
   dropped in every routing layer (`Ablation(drop=(("*", j),))`: a path not run, a block/expert
   never selected, a pathway or stream switched off) beside the unablated loss, and the mean
   KL(base || dropped) of the next-token distributions (`effects.ablation_effects`), on the
   trainer's validation text (`corpora.corpus.validation_rows`: rows of seq_len + 1 tokens), so with
   the trainer's settings (100 documents, seq_len 256) the unablated loss is the one in training.json.

`collect` runs the model; `rendering.report_sections` renders sections 2 and 3 as HTML (the page itself is
`rendering.corpus_report.report_page`, drawn by the drawer table like the app's view).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from routescope.corpora import corpus
from routescope.core_models.ablation import Ablation
from routescope.core_models.specs import AblationError

from routescope.analysis.export import columns as C
from routescope.analysis.corpus.shipped import validation_split
from routescope.analysis.corpus.run import CorpusResult, CorpusSettings, run_corpus
from routescope.analysis.runs import family_table as FT
from routescope.analysis.runs.effects import ablation_effects
from routescope.analysis.export.run_table import TokenText
from routescope.analysis.runs.routing import option_names

# report-specific columns
LOSS, BASE_LOSS, DELTA, MEAN_KL = "loss", "base_loss", "delta", "mean_kl"
PROBE_SET, ROUTE_AT_COL, DROPPED = C.PROBE_SET, C.ROUTE_AT, "dropped"


@dataclass
class ReportData:
    """Everything the page shows: the corpus statistics and their tables, the option labels, and
    the report's own tables (accuracy and probe tables empty where the family declares no probes;
    drops empty for a model without routing layers). `probe_sets`, `probe_note`: the probe sets
    run and what the page says of their accuracy."""

    name: str
    config: dict[str, Any]
    settings: dict[str, Any]
    corpus: CorpusResult
    tables: dict[str, pd.DataFrame]
    labels: dict[str, list[str]]
    accuracy: pd.DataFrame  # probe_set, route_at, source, metric, value
    probe_tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # "<probe set>, last" -> per-probe routes
    drops: pd.DataFrame = field(default_factory=pd.DataFrame)  # dropped, label, domain, loss, base_loss, ...
    notes: list[str] = field(default_factory=list)
    probe_sets: tuple[str, ...] = ()
    probe_note: str = ""


# --- pure parts ------------------------------------------------------------------------------------

def accuracy_wide(acc: pd.DataFrame) -> pd.DataFrame:
    """One row per (probe set, reading, source): the route shares, accuracy and route count."""
    wide = acc.pivot_table(index=[PROBE_SET, ROUTE_AT_COL, C.SOURCE], columns=C.METRIC, values=C.VALUE,
                           sort=False).reset_index()
    wide.columns.name = None
    if "n_routes" in wide:
        wide["n_routes"] = wide["n_routes"].astype("int64")
    return wide


# --- running the model -------------------------------------------------------------------------------

def validation_rows(tokenizer: Any, n_docs: int, seq_len: int) -> dict[str, torch.Tensor]:
    """Domain -> (rows, seq_len + 1) token ids of the trainer's validation text."""
    return {d: torch.tensor(corpus.validation_rows(tokenizer, d, n_docs, seq_len), dtype=torch.long)
            .view(-1, seq_len + 1) for d in corpus.DOMAINS}


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def mean_loss(model: Any, rows: torch.Tensor, ablation: Ablation | None = None, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats) of rows (N, T + 1), as the trainer's evaluate computes it."""
    total, count, rows = 0.0, 0, rows.to(_device(model))
    for k in range(0, len(rows), batch_size):
        chunk = rows[k:k + batch_size]
        logits = model(chunk[:, :-1], ablation=ablation).logits
        total += F.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="sum").item()
        count += chunk[:, 1:].numel()
    return total / max(1, count)


def droppable(model: Any) -> list[tuple[int, str]]:
    """(option j, its label) for every j that `Ablation(drop=(("*", j),))` accepts on this model."""
    labels = option_names(model.option_labels())
    out = []
    for j, label in enumerate(labels if model.routing_layers() else []):
        try:
            Ablation(drop=(("*", j),)).validate(model.routing_layers())
        except AblationError:
            continue
        out.append((j, label))
    return out


def drop_effects(model: Any, rows: dict[str, torch.Tensor], options: Sequence[tuple[int, str]],
                 batch_size: int = 16) -> pd.DataFrame:
    """Per option j (dropped in every routing layer) and domain: validation loss, the unablated
    loss, their difference and the mean KL(base || dropped) over every position."""
    base = {d: mean_loss(model, r, None, batch_size) for d, r in rows.items()}
    out = []
    for j, label in options:
        ab = Ablation(drop=(("*", j),))
        for d, r in rows.items():
            loss = mean_loss(model, r, ab, batch_size)
            kl = np.concatenate([ablation_effects(model, r[k:k + batch_size, :-1].to(_device(model)), ab)[C.KL].to_numpy()
                                 for k in range(0, len(r), batch_size)]).mean()
            out.append((j, label, d, loss, base[d], loss - base[d], float(kl)))
    return pd.DataFrame(out, columns=[DROPPED, C.LABEL, C.DOMAIN, LOSS, BASE_LOSS, DELTA, MEAN_KL])


def collect(model: Any, tokenizer: Any, *, name: str, n_docs: int = 100, seq_len: int = 256, min_count: int = 5,
            top: int = 10, probe_sets: dict[str, Any] | None = None, batch_size: int = 16,
            progress: Any = None) -> ReportData:
    """Run every analysis of the report on `model` (any family)."""
    cfg = model.config
    seq_len = min(seq_len, model.context)
    text = TokenText(tokenizer)
    data = validation_split(corpus.DOMAINS, n_docs)
    result = run_corpus(model, tokenizer, data, name=name, settings=CorpusSettings(max_tokens=seq_len,
                                                                                  batch_size=batch_size),
                        decode=lambda i: text([i])[0], progress=progress)
    probes = FT.probe_table(cfg.family) if result.layout.routes else None
    intended = dict(probes.intended()) if probes else {}
    tables = result.tables(top=top, min_count=min_count, intended=intended)
    sets = dict(probes.sets if probe_sets is None else probe_sets) if probes else {}
    accuracy, probe_tables = probes.accuracy(model, tokenizer, sets) if probes else \
        (pd.DataFrame(columns=[PROBE_SET, ROUTE_AT_COL, C.SOURCE, C.METRIC, C.VALUE]), {})
    options = droppable(model)
    rows = validation_rows(tokenizer, n_docs, seq_len) if options else {}
    drops = drop_effects(model, rows, options, batch_size) if options else \
        pd.DataFrame(columns=[DROPPED, C.LABEL, C.DOMAIN, LOSS, BASE_LOSS, DELTA, MEAN_KL])
    return ReportData(name=name, config=cfg.to_dict(), settings=dict(n_docs=n_docs, seq_len=seq_len,
                      min_count=min_count, top=top, n_tokens={d: int(r[:, :-1].numel()) for d, r in rows.items()}),
                      corpus=result, tables=tables, labels=model.option_labels(), accuracy=accuracy,
                      probe_tables=dict(probe_tables), drops=drops, probe_sets=tuple(sets),
                      probe_note=probes.note if probes else "")


def report_tables(data: ReportData) -> dict[str, pd.DataFrame]:
    """Every table of the report by name (embedded in the page as JSON)."""
    out = dict(data.tables)
    out["probe_accuracy"] = data.accuracy
    out["drops"] = data.drops
    out.update({f"probes: {k}": v for k, v in data.probe_tables.items()})
    return out

