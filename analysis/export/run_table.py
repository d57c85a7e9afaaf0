"""A run's long routing table (the export table): every family's routing records in one long format
(`columns.EXPORT_SCHEMA`), and the token texts of its `token` column (`TokenText`).

`routing_table(trace, model, meta=...)` takes the family's rows from `analysis.runs.views` (which
runs the analyses of `analysis.runs.routing` on the trace) and adds the prompt, token and call columns:
(model, family, prompt, position, token, phase, layer, site, kind, option, value, selected,
ablation, seed). What `value` means for each `kind` is documented in `columns.KINDS`; which kinds
each family exports, in `analysis.runs.views`. Pure: the token texts come in with `meta`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from routescope.core_models.base import RouteScopeLM
from routescope.core_models.trace import Trace

from routescope.analysis.export import columns as C
from routescope.analysis.runs.views import RunViews
from routescope.analysis.runs.family_table import family_analysis


class TokenText:
    """Token id -> its decoded text, cached (the `token` column of `RowMeta.tokens`)."""

    def __init__(self, tok) -> None:
        self.tok, self.cache = tok, {}

    def __call__(self, ids) -> list[str]:
        return [self.cache.setdefault(i, self.tok.decode([i])) for i in ids]


@dataclass(frozen=True)
class RowMeta:
    """What the export needs to know about one batch row of the traced call."""

    prompt_id: str
    token_ids: Sequence[int]  # every position as run: prompt, then generated tokens
    tokens: Sequence[str] | None = None  # decoded text per position (None: token column NA)
    n_prompt: int | None = None  # positions >= n_prompt are "generated" (None: all "prompt")


@dataclass(frozen=True)
class ExportMeta:
    model: str  # checkpoint name
    rows: Sequence[RowMeta]  # one per batch row of the trace
    ablation: str = "none"  # Ablation.describe() of the call
    seed: int = 0


def empty_table() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in C.EXPORT_SCHEMA.items()})


def routing_table(trace: Trace, model: RouteScopeLM, *, meta: ExportMeta, views: RunViews | None = None
                  ) -> pd.DataFrame:
    """One traced call (any family, any batch size) as rows of the export schema.

    Per-token rows carry position, token_id, token and phase from `meta`; per-call rows (learned
    weights, betas) have them NA and are repeated for every batch row. Notes (e.g. a layer whose
    cosine is undefined) are in `df.attrs["notes"]`. `views`: the family's views of this same trace
    (`analysis.runs.views.routing_views`), if the caller has them: reused, not recomputed."""
    n_batch = len(meta.rows)
    family = family_analysis(model)
    parts, notes = family.export(trace, model, n_batch, views or family.views(trace, model))
    parts = [p for p in parts if len(p)]
    if not parts:
        out = empty_table()
        out.attrs["notes"] = notes
        return out
    df = pd.concat(parts, ignore_index=True)
    b = df[C.BATCH].to_numpy().astype(int)
    if b.max() >= n_batch:
        raise ValueError(f"the trace has {b.max() + 1} batch rows but meta describes {n_batch}")
    pos = df[C.POSITION].to_numpy().astype(int)
    per_token = pos >= 0
    token_id = np.full(len(df), -1, dtype=np.int64)
    token = np.full(len(df), None, dtype=object)
    phase = np.full(len(df), None, dtype=object)
    for r, rm in enumerate(meta.rows):
        m = (b == r) & per_token
        if not m.any():
            continue
        if pos[m].max() >= len(rm.token_ids):
            raise ValueError(f"prompt {rm.prompt_id!r}: the trace has position {pos[m].max()} but meta gives "
                             f"{len(rm.token_ids)} token ids")
        token_id[m] = np.asarray(rm.token_ids, dtype=np.int64)[pos[m]]
        if rm.tokens is not None:
            token[m] = np.asarray(list(rm.tokens), dtype=object)[pos[m]]
        n_prompt = len(rm.token_ids) if rm.n_prompt is None else rm.n_prompt
        phase[m] = np.where(pos[m] < n_prompt, C.PHASES[0], C.PHASES[1])
    prompt_ids = np.asarray([rm.prompt_id for rm in meta.rows], dtype=object)
    out = pd.DataFrame({
        C.MODEL: meta.model, C.FAMILY: model.config.label, C.PROMPT_ID: prompt_ids[b],
        C.POSITION: pd.array(np.where(per_token, pos, 0), dtype="Int64"),
        C.TOKEN: token, C.TOKEN_ID: pd.array(token_id, dtype="Int64"), C.PHASE: phase,
        C.LAYER: df[C.LAYER], C.SITE: df[C.SITE], C.KIND: df[C.KIND],
        C.OPTION: pd.array(df[C.OPTION].tolist(), dtype="Int64"), C.VALUE: df[C.VALUE].astype(float),
        C.SELECTED: pd.array(df[C.SELECTED].tolist(), dtype="boolean"),
        C.ABLATION: meta.ablation, C.SEED: meta.seed,
    })
    out.loc[~per_token, [C.POSITION, C.TOKEN_ID]] = pd.NA
    # rows: by batch row, position (per-call rows first), layer and kind in forward order, option
    rank = lambda col: pd.factorize(df[col])[0]  # noqa: E731  order of first appearance
    order = np.lexsort((df[C.OPTION].fillna(-1).astype(int).to_numpy(), rank(C.KIND), rank(C.LAYER), pos, b))
    out = conform(out.iloc[order])
    out.attrs["notes"] = notes
    return out


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """Cast to the export schema's columns, order and dtypes; ValueError naming missing/extra columns.
    A frame that already conforms is returned as it is (no copy)."""
    if list(df.columns) == list(C.EXPORT_SCHEMA) and all(
            str(df[c].dtype) == t for c, t in C.EXPORT_SCHEMA.items()) and df.index.equals(pd.RangeIndex(len(df))):
        return df
    missing = [c for c in C.EXPORT_COLUMNS if c not in df.columns]
    extra = [c for c in df.columns if c not in C.EXPORT_SCHEMA]
    if missing or extra:
        raise ValueError("not an export table: " + "; ".join(
            ([f"missing column(s) {', '.join(missing)}"] if missing else [])
            + ([f"unexpected column(s) {', '.join(map(str, extra))}"] if extra else [])))
    out = pd.DataFrame({c: df[c].astype(t) for c, t in C.EXPORT_SCHEMA.items()})
    return out.reset_index(drop=True)
