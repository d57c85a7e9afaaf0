"""The reference routing of a trace's token ids and its comparison with the engine's, row by row.

`reference_routes` runs rows through the model teacher-forced (as transformers runs it, for an HF
model; our own top-k families alike) and reads each routing layer's recorded top-k ids (the INDICES
role: what the block routed with) and the margin of its router: the k-th minus the (k+1)-th largest
router logit (the LOGITS role), the gap a change of numerics must cross to swap an expert in or out.

`compare_row` sets one row's engine ids [T', L, k] against the reference [T, L, k]: per (position,
layer) whether the top-k SETS are equal and their overlap |S_engine & S_ref|; each position's first
divergent layer; and one record per mismatch with the reference's margin, its swap gap, whether the
mismatch is a near-tie and, where a float32 reference ran too, whether the engine's set equals the
float32 reference's (the mismatch "goes away in float32").

The margin (k-th minus (k+1)-th logit) says how close the reference was to another top-k; it does not
say which: at 128 experts the (k+1)-th is often close to the k-th while the engine took an expert far
below both. The swap gap does (`swap_gap`): the reference's lowest logit among the experts the engine
left out minus its highest among those the engine took instead. Where the engine swapped the k-th for
the (k+1)-th it equals the margin; it is never below it.

A mismatch is a near-tie when its swap gap is at most `tie_ulps` units of the trace dtype's resolution
at the score's size: gap <= tie_ulps * eps(dtype) * max(1, |s_k|), eps the spacing of that dtype's
numbers at 1 (`torch.finfo(dtype).eps`: 2^-7 for bfloat16, 2^-10 for float16, 2^-23 for float32).
With the default 8 ulps a bfloat16 engine's near-ties are gaps up to 0.0625 at logits of size 1 or
less: the rounding of a bfloat16 router's inputs and logits moves logits by a few ulps. Any larger gap
is flagged: numerics alone should not swap those experts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from routescope.core_models.sites import INDICES, LOGITS
from routescope.core_models.trace import tracing

from routescope.analysis.replay.row import TraceRow

MISMATCH_COLUMNS = {"row": "string", "position": "int64", "token_id": "int64", "layer": "string",
                    "engine_experts": "string", "reference_experts": "string", "margin": "float64",
                    "near_tie": "bool", "gone_in_float32": "boolean", "swap_gap": "float64"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ReplaySettings:
    """tie_ulps: a margin of at most this many ulps of `trace_dtype` (at the score's size) is a
    near-tie. trace_dtype: the dtype the engine routed in (float32, bfloat16, float16); None: the
    reference model's own. batch_tokens: tokens per forward (rows padded to the longest of a batch).
    keep_rows: rows whose per-position maps are kept for the view and the page (the first ones)."""

    tie_ulps: float = 8.0
    trace_dtype: str | None = None
    batch_tokens: int = 4096
    keep_rows: int = 64

    def __post_init__(self) -> None:
        if not self.tie_ulps >= 0:
            raise ValueError(f"tie_ulps {self.tie_ulps}: expected a number >= 0")
        if self.trace_dtype is not None and self.trace_dtype not in DTYPES:
            raise ValueError(f"trace dtype {self.trace_dtype!r}: expected one of {', '.join(DTYPES)}")


@dataclass(frozen=True)
class Shape:
    """What a trace of this model must match: its top-k routing layers (names, depth order), their
    k, routed experts n and the vocabulary."""

    layers: tuple[str, ...]
    k: int
    n: int
    vocab: int
    label: str


def model_shape(model: Any) -> Shape:
    """The model's `Shape`; ValueError where it routes no fixed top-k or its layers differ in k or n
    (a trace holds one k for every layer)."""
    topk = model.routing_top_k()
    idx, logits = model.sites_of(INDICES), model.sites_of(LOGITS)
    layers = tuple(n for n in topk if n in idx and n in logits)
    label = model.config.label
    if not layers:
        raise ValueError(f"{label}: no routing layer picks a fixed top-k of experts with recorded ids and logits: "
                         "nothing to replay")
    kn = {topk[n] for n in layers}
    if len(kn) > 1:
        raise ValueError(f"{label}: its routing layers differ in (k, experts): {sorted(kn)}; a trace has one k")
    k, n = kn.pop()
    return Shape(layers, k, n, int(model.vocab_size), label)


def near_tie_threshold(kth: np.ndarray, dtype: torch.dtype, ulps: float) -> np.ndarray:
    """The largest margin that is a near-tie at k-th scores `kth` (module doc)."""
    return ulps * torch.finfo(dtype).eps * np.maximum(1.0, np.abs(kth))


@dataclass
class Reference:
    """One row's reference routing. ids: [T, L, k] int64 (rank order); margin: [T, L] the k-th minus
    the (k+1)-th largest logit (inf where a layer has k experts only); kth: [T, L] the k-th logit;
    logits: [T, L, n] float32, the router's logits (the swap gap of a mismatch reads them)."""

    ids: np.ndarray
    margin: np.ndarray
    kth: np.ndarray
    logits: np.ndarray


@torch.inference_mode()
def reference_routes(model: Any, shape: Shape, rows: Sequence[np.ndarray]) -> list[Reference]:
    """Each row's `Reference`, the rows run in one right-padded batch (causal: padding after a row
    changes none of its positions). rows: token-id arrays [T_i], each within the vocabulary."""
    idx_sites, logit_sites = model.sites_of(INDICES), model.sites_of(LOGITS)
    pad = max(0, int(getattr(model.config, "pad_id", 0) or 0))
    lengths = [len(r) for r in rows]
    x = torch.full((len(rows), max(lengths)), pad, dtype=torch.int64)
    for i, r in enumerate(rows):
        x[i, :len(r)] = torch.tensor(np.asarray(r), dtype=torch.int64)  # a copy: trace arrays may be read-only
    with tracing([idx_sites[n] for n in shape.layers] + [logit_sites[n] for n in shape.layers]) as tr:
        model(x, float_logits=False)
    ids = torch.stack([tr[idx_sites[n]].reshape(x.shape[0], x.shape[1], -1) for n in shape.layers], dim=2)
    logits = torch.stack([tr[logit_sites[n]].reshape(x.shape[0], x.shape[1], -1) for n in shape.layers], dim=2)
    logits = logits.float()
    top = torch.topk(logits, min(shape.k + 1, logits.shape[-1]), dim=-1).values  # [B, T, L, k+1]
    kth = top[..., shape.k - 1]
    margin = kth - top[..., shape.k] if top.shape[-1] > shape.k else torch.full_like(kth, float("inf"))
    ids, margin, kth, logits = ids.long().numpy(), margin.numpy(), kth.numpy(), logits.numpy()
    return [Reference(ids[i, :t], margin[i, :t], kth[i, :t], logits[i, :t]) for i, t in enumerate(lengths)]


def aligned(row: TraceRow, shape: Shape) -> np.ndarray:
    """The row's engine ids [T', L, k] with its layers in the model's depth order: a trace naming its
    layers (by the model's names or by 0-based index) is reordered; ValueError naming the row and the
    layer for a name the model does not have."""
    e = np.asarray(row.experts)
    if row.layer_names is None:
        return e
    order = []
    for name in row.layer_names:
        name = str(name)
        if name in shape.layers:
            order.append(shape.layers.index(name))
        elif name.isascii() and name.isdigit() and int(name) < len(shape.layers):
            order.append(int(name))
        else:
            raise ValueError(f"row {row.row!r}: layer {name[:80]!r} is not a routing layer of {shape.label} "
                             f"({', '.join(shape.layers[:4])}{', ...' if len(shape.layers) > 4 else ''})")
    if sorted(order) != list(range(len(order))) or len(order) != len(shape.layers):
        raise ValueError(f"row {row.row!r}: its layers {', '.join(map(str, row.layer_names[:6]))} are not the "
                         f"{len(shape.layers)} routing layers of {shape.label} once each")
    out = np.empty_like(e)
    out[:, order] = e
    return out


def swap_gap(logits: np.ndarray, ref: np.ndarray, engine: np.ndarray) -> np.ndarray:
    """[m] the reference's lowest logit among the experts the engine left out minus its highest among
    those the engine took instead: how far the engine's set is from a top-k the reference could have
    picked with its scores moved by that much (the margin, where it swapped the k-th for the (k+1)-th).
    inf where the engine took an id the layer does not have, or fewer distinct ids than k.
    logits: [m, n]; ref, engine: [m, k]."""
    n = logits.shape[-1]
    left = ~(ref[:, :, None] == engine[:, None, :]).any(-1)  # [m, k] reference ids the engine left out
    took = ~(engine[:, :, None] == ref[:, None, :]).any(-1)  # [m, k] engine ids outside the reference's set
    valid = ((engine >= 0) & (engine < n)).all(-1)
    rows = np.arange(len(ref))[:, None]
    low = np.where(left, logits[rows, ref], np.inf).min(-1)
    high = np.where(took & valid[:, None], logits[rows, np.clip(engine, 0, n - 1)], -np.inf).max(-1)
    distinct = np.array([len(set(x)) == engine.shape[1] for x in engine.tolist()], dtype=bool)
    return np.where(valid & distinct, low - high, np.inf)


def _ids_text(a: np.ndarray) -> list[str]:
    return ["[" + ", ".join(map(str, r)) + "]" for r in a.tolist()]


@dataclass
class RowResult:
    """One compared row. equal, overlap: [n, L] over the n positions from `start` that both the trace
    and the token ids hold; first: [n] each position's first divergent layer (-1: none); mismatches:
    the `MISMATCH_COLUMNS` records (positions within the row's token ids)."""

    row: str
    token_ids: np.ndarray
    equal: np.ndarray
    overlap: np.ndarray
    first: np.ndarray
    mismatches: pd.DataFrame
    start: int = 0


def compare_row(row: TraceRow, engine: np.ndarray, ref: Reference, shape: Shape, *, dtype: torch.dtype,
                tie_ulps: float, ref32: np.ndarray | None = None) -> RowResult:
    """The row's comparison (module doc). engine: [T', L, k] in depth order (`aligned`), engine[i] the
    routing of position `row.start + i`; ref: the reference over every position of the row's token
    ids; ref32: [T, L, k] the float32 reference's ids, or None (then gone_in_float32 is missing)."""
    s = int(row.start)
    n = max(0, min(len(engine), len(ref.ids) - s))
    e, r = engine[:n], ref.ids[s:s + n]
    overlap = (r[..., :, None] == e[..., None, :]).any(-1).sum(-1)  # reference ids are distinct
    equal = overlap == shape.k
    first = np.where(equal.all(1), -1, np.argmax(~equal, axis=1)) if n else np.zeros(0, dtype=np.int64)
    t, l = np.nonzero(~equal)
    margin, kth = ref.margin[s + t, l], ref.kth[s + t, l]
    gap = swap_gap(ref.logits[s + t, l], r[t, l], e[t, l]).astype(np.float64)
    if ref32 is not None:
        r32 = ref32[s + t, l]
        gone = pd.array((r32[:, :, None] == e[t, l][:, None, :]).any(-1).sum(-1) == shape.k, dtype="boolean")
    else:
        gone = pd.array([pd.NA] * len(t), dtype="boolean")
    tokens = np.asarray(row.token_ids, dtype=np.int64)
    mism = pd.DataFrame({
        "row": pd.array([row.row] * len(t), dtype="string"), "position": (s + t).astype(np.int64),
        "token_id": tokens[s + t], "layer": pd.array([shape.layers[i] for i in l], dtype="string"),
        "engine_experts": pd.array(_ids_text(e[t, l]), dtype="string"),
        "reference_experts": pd.array(_ids_text(r[t, l]), dtype="string"),
        "margin": margin.astype(np.float64), "near_tie": gap <= near_tie_threshold(kth, dtype, tie_ulps),
        "gone_in_float32": gone, "swap_gap": gap})
    return RowResult(row.row, tokens, equal, overlap, first, mism, s)


class Tally:
    """Corpus-level sums over compared rows, in memory bounded by layers and rows (never positions):
    per layer the tokens, equal sets and overlaps; tokens equal at every layer; first divergent layers;
    one summary per row."""

    def __init__(self, shape: Shape, float32: bool = False) -> None:
        L = len(shape.layers)
        self.shape, self.float32 = shape, float32  # float32: a float32 reference ran too
        self.tokens = 0
        self.equal = np.zeros(L, dtype=np.int64)
        self.overlap = np.zeros(L, dtype=np.int64)
        self.all_equal = 0
        self.first = np.zeros(L, dtype=np.int64)
        self.mismatches = self.near_ties = self.gone = 0
        self.row_records: list[tuple] = []

    def add(self, res: RowResult) -> None:
        n = len(res.first)
        self.tokens += n
        self.equal += res.equal.sum(0)
        self.overlap += res.overlap.sum(0)
        self.all_equal += int((res.first < 0).sum())
        self.first += np.bincount(res.first[res.first >= 0], minlength=len(self.first))
        m = res.mismatches
        self.mismatches += len(m)
        self.near_ties += int(m["near_tie"].sum())
        self.gone += int(m["gone_in_float32"].fillna(False).sum())
        self.row_records.append((res.row, n, int((res.first >= 0).sum()), len(m)))

    def agreement(self) -> pd.DataFrame:
        """`agreement.csv`: layer, tokens, agreement (share of tokens whose top-k set equals the
        reference's), mean_overlap (mean |S_e & S_ref| / k); then layer "all": the share of tokens
        equal at every layer, and the mean overlap over every (token, layer)."""
        k, T, L = self.shape.k, self.tokens, len(self.shape.layers)
        div = max(T, 1)
        agree = list(self.equal / div) + [self.all_equal / div]
        over = list(self.overlap / (div * k)) + [self.overlap.sum() / (max(T * L, 1) * k)]
        nan = T == 0
        return pd.DataFrame({"layer": pd.array([*self.shape.layers, "all"], dtype="string"),
                             "tokens": np.full(L + 1, T, dtype=np.int64),
                             "agreement": np.array(agree, dtype=np.float64) if not nan else np.full(L + 1, np.nan),
                             "mean_overlap": np.array(over, dtype=np.float64) if not nan else np.full(L + 1, np.nan)})

    def first_divergence(self) -> pd.DataFrame:
        """The histogram of each token's first divergent layer (layer "none": equal at every layer)."""
        return pd.DataFrame({"layer": pd.array([*self.shape.layers, "none"], dtype="string"),
                             "tokens": np.array([*self.first, self.all_equal], dtype=np.int64)})

    def rows(self) -> pd.DataFrame:
        """One line per compared row: positions compared, tokens differing in at least one layer, mismatches."""
        r = self.row_records
        return pd.DataFrame({"row": pd.array([x[0] for x in r], dtype="string"),
                             "tokens": np.array([x[1] for x in r], dtype=np.int64),
                             "differing_tokens": np.array([x[2] for x in r], dtype=np.int64),
                             "mismatches": np.array([x[3] for x in r], dtype=np.int64)})

    def summary(self) -> dict[str, Any]:
        T = self.tokens
        return {"tokens": T, "rows_compared": len(self.row_records),
                "differing_share": (T - self.all_equal) / T if T else float("nan"),
                "mismatches": self.mismatches, "near_ties": self.near_ties,
                "large_margin": self.mismatches - self.near_ties,
                "gone_in_float32": self.gone if self.float32 else None}
