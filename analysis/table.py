"""The export table: every family's routing records in one long format (`columns.EXPORT_SCHEMA`).

`routing_table(trace, model, meta=...)` dispatches on the family, runs the analyses of
`analysis.routing` on the trace and reshapes their results into rows of
(prompt, position, token, layer, site, kind, option, value, selected). What `value` means for each
`kind` is documented in `columns.KINDS`. Pure: the token texts come in with `meta`.

Per family:
- PaPaformer Gumbel: "prob" per candidate (selected = the recorded choice), "cosine" per path.
- PaPaformer Share-Linear: "cosine" per path (selected = dominant). With fused_grow the last
  layer's cosine is undefined and the layer is skipped (noted in `df.attrs["notes"]`).
- MoEP: "prob" per option of moe_shrink, parallel.{i}, moe_grow (selected = in the top-k), and
  "weight" per selected option.
- ParallelGPT: "weight" per path (per call), "contribution" per token and path.
- Wiola: "gate_mean" per token and DSFF layer, "beta" per GCLA block (per call), and with ATM on
  "adjacent_cos" and "merge" per token and ATM layer.
- PAGMLP (llama with ffn pagmlp): "alpha"/"beta" per layer (per call), "norm" and "contribution"
  per token and pathway.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from core_models.runtime import Trace

from . import columns as C
from . import routing as R


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


def _part(df: pd.DataFrame, *, layer: str | None = None, site: Any, kind: str, value: Any,
          option: Any = C.OPTION, selected: Any = None, per_token: bool = True) -> pd.DataFrame:
    """Reshape an analysis frame into export columns. Column names or arrays/scalars are accepted."""
    def get(v: Any) -> Any:
        if isinstance(v, str) and v in df.columns:
            return df[v].to_numpy()
        return v.to_numpy() if isinstance(v, pd.Series) else v  # never align on a filtered index

    n = len(df)
    return pd.DataFrame({
        C.BATCH: df[C.BATCH].to_numpy() if C.BATCH in df.columns else np.zeros(n, dtype=int),
        C.POSITION: df[C.POSITION].to_numpy() if per_token else np.full(n, -1),
        C.LAYER: df[C.LAYER].to_numpy() if layer is None else layer,
        C.SITE: get(site), C.KIND: kind, C.OPTION: get(option), C.VALUE: get(value),
        C.SELECTED: get(selected) if selected is not None else pd.NA,
    }, index=range(n))


def _per_call(rows: list[tuple[str, str, str, int | None, float]], n_batch: int) -> pd.DataFrame:
    """Per-call values (layer, site, kind, option, value), repeated for every batch row."""
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows * n_batch, columns=[C.LAYER, C.SITE, C.KIND, C.OPTION, C.VALUE])
    df[C.BATCH] = np.repeat(np.arange(n_batch), len(rows))
    df[C.POSITION] = -1
    df[C.SELECTED] = pd.NA
    return df


def _papaformer(trace: Trace, model: Any, n_batch: int, views: dict) -> tuple[list[pd.DataFrame], list[str]]:
    cfg, parts = model.config, []
    if cfg.combiner != "share_linear":
        g = _view(views, "gumbel", lambda: R.gumbel_routes(trace, cfg))
        parts.append(_part(g, site=g[C.LAYER] + ".router.probs", kind="prob", value=C.PROB, selected=C.SELECTED))
    cos = _view(views, "cosine", lambda: R.cosine_dominance(trace))
    notes = list(cos.attrs.get("notes", []))
    cos = cos[cos[C.COSINE].notna()]
    parts.append(_part(cos, site=cos[C.LAYER] + ".paths." + cos[C.OPTION].astype(str) + ".out", kind="cosine",
                       value=C.COSINE, selected=C.DOMINANT))
    return parts, notes


def _moep(trace: Trace, model: Any, n_batch: int, views: dict) -> tuple[list[pd.DataFrame], list[str]]:
    parts = []
    for layer in R.topk_layers(trace):
        probs = trace[f"{layer}.router.probs"].float()  # (B, T, n)
        idx = trace[f"{layer}.router.indices"]  # (B, T, k)
        sel = np.zeros(probs.shape, dtype=bool)
        np.put_along_axis(sel, idx.numpy(), True, axis=-1)
        B, T, n = probs.shape
        b, t, o = R.grid_indices(B, T, n)
        df = pd.DataFrame({C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.OPTION: o,
                           C.PROB: probs.numpy().ravel(), C.SELECTED: sel.ravel()})
        parts.append(_part(df, site=f"{layer}.router.probs", kind="prob", value=C.PROB, selected=C.SELECTED))
    w = _view(views, "topk", lambda: R.topk_routes(trace))
    parts.append(_part(w, site=w[C.LAYER] + ".router.weights", kind="weight", value=C.WEIGHT, selected=True))
    return parts, []


def _pgpt(trace: Trace, model: Any, n_batch: int, views: dict) -> tuple[list[pd.DataFrame], list[str]]:
    p = _view(views, "pgpt", lambda: R.pgpt_paths(trace))
    parts = [_part(p, site="paths." + p[C.OPTION].astype(str) + ".out", kind="contribution", value=C.SHARE,
                   selected=C.DOMINANT)]
    w = trace["mixer.weights"].float().tolist()
    parts.append(_per_call([("paths", "mixer.weights", "weight", j, x) for j, x in enumerate(w)], n_batch))
    return parts, []


def _wiola(trace: Trace, model: Any, n_batch: int, views: dict) -> tuple[list[pd.DataFrame], list[str]]:
    g = _view(views, "dsff", lambda: R.dsff_gates(trace))
    site = g[C.LAYER] + ".gate"
    a = g[C.GATE_MEAN].to_numpy()
    parts = [_part(g, site=site, kind="gate_mean", option=0, value=a, selected=a >= 0.5),
             _part(g, site=site, kind="gate_mean", option=1, value=1.0 - a, selected=a < 0.5)]
    betas = _view(views, "gcla", lambda: R.gcla_betas(trace))
    parts.append(_per_call([(layer, f"{layer}.gcla_beta", "beta", None, b)
                            for layer, b in zip(betas[C.LAYER], betas[C.BETA])], n_batch))
    atm = R.atm_merges(trace)
    if len(atm):
        cos = atm[atm[C.ADJACENT_COS].notna()]
        parts.append(_part(cos, site=cos[C.LAYER] + ".adjacent_cos", kind="adjacent_cos", option=None,
                           value=C.ADJACENT_COS))
        parts.append(_part(atm, site=atm[C.LAYER] + ".merge_map", kind="merge", option=None,
                           value=atm[C.GROUP].astype(float).to_numpy(), selected=C.MERGED))
    return parts, []


def _pagmlp(trace: Trace, model: Any, n_batch: int, views: dict) -> tuple[list[pd.DataFrame], list[str]]:
    p = _view(views, "pagmlp", lambda: R.pagmlp_pathways(trace, model))
    site = p[C.LAYER] + "." + p[C.LABEL] + "_out"
    share = p[C.SHARE].to_numpy()
    dominant = share >= np.repeat(share.reshape(-1, 2).max(1), 2)
    parts = [_part(p, site=site, kind="norm", value=C.OUT_NORM),
             _part(p, site=site, kind="contribution", value=share, selected=dominant)]
    per_call = []
    for layer in dict.fromkeys(p[C.LAYER]):
        per_call += [(layer, f"{layer}.alpha", "alpha", 0, float(trace[f"{layer}.alpha"])),
                     (layer, f"{layer}.beta", "beta", 1, float(trace[f"{layer}.beta"]))]
    parts.append(_per_call(per_call, n_batch))
    return parts, []


def _view(views: dict, key: str, compute) -> pd.DataFrame:
    """An analysis frame the caller already computed from the same trace, or compute it."""
    return views[key] if key in views else compute()


def _family_parts(trace: Trace, model: Any, n_batch: int, views: dict) -> tuple[list[pd.DataFrame], list[str]]:
    cfg = model.config
    fam = cfg.family
    if fam == "papaformer":
        return _papaformer(trace, model, n_batch, views)
    if fam == "moep":
        return _moep(trace, model, n_batch, views)
    if fam == "pgpt":
        return _pgpt(trace, model, n_batch, views)
    if fam == "wiola":
        return _wiola(trace, model, n_batch, views)
    if fam == "llama" and getattr(cfg, "ffn", "") == "pagmlp":
        return _pagmlp(trace, model, n_batch, views)
    return [], [f"family {fam!r} has no routing sites to export"]


def empty_table() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in C.EXPORT_SCHEMA.items()})


def routing_table(trace: Trace, model: Any, *, meta: ExportMeta, views: dict | None = None) -> pd.DataFrame:
    """One traced call (any family, any batch size) as rows of the export schema.

    Per-token rows carry position, token_id, token and phase from `meta`; per-call rows (learned
    weights, betas) have them NA and are repeated for every batch row. Notes (e.g. a layer whose
    cosine is undefined) are in `df.attrs["notes"]`. `views`: analysis frames already computed
    from this same trace (as `analysis.session.family_views` names them), reused, not recomputed."""
    n_batch = len(meta.rows)
    parts, notes = _family_parts(trace, model, n_batch, views or {})
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
        C.MODEL: meta.model, C.FAMILY: model.config.family, C.PROMPT_ID: prompt_ids[b],
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
