"""Broken-trace checks: faults engines are known to produce, found per request (`check_row`) and
counted over a trace (`Checks`, the `checks.csv` frame `check, count, rows`).

The faults (check name: what it finds; the report that motivated it):
- "all_zeros": every expert id of the row is 0 (vllm-project/vllm#54730, returned routed experts
  silently all zeros);
- "duplicated_position": a position whose experts equal the previous position's at every layer, in
  the same order (sgl-project/sglang#12162, duplicated rows under CUDA graphs);
- "length_off_by_one": the routing covers one position more or fewer than the token ids;
- "length_mismatch": ... any other number of positions;
- "expert_out_of_range": an expert id < 0 or >= the model's expert count;
- "repeated_expert": an id appearing twice in one position's top-k;
- "layer_count": the routing's layer count is not the model's routing-layer count;
- "top_k": the routing's k is not the model's top-k;
- "token_out_of_range": a token id outside the model's vocabulary (only when it is given).

One fault gets one name: an all-zeros row is not also reported for its repeated ids (k > 1) or its
duplicated positions. A duplicated position can happen by chance in a small model (few experts,
few layers); give `check_row` the reference routing and a position the reference routes the same
way as its predecessor is not reported.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from routescope.analysis.replay.row import TraceRow

CHECKS = ("all_zeros", "duplicated_position", "length_off_by_one", "length_mismatch", "expert_out_of_range",
          "repeated_expert", "layer_count", "top_k", "token_out_of_range")
MAX_ROWS_NAMED = 1000  # a check names at most this many rows in `rows` (then "... (+N more)"): memory stays bounded


def duplicated_positions(experts: np.ndarray) -> np.ndarray:
    """[T'] bool: position t has the same experts, in order, at every layer as t - 1 (never t = 0).

    experts: [T', L, k]."""
    dup = np.zeros(experts.shape[0], dtype=bool)
    if experts.shape[0] > 1:
        dup[1:] = (experts[1:] == experts[:-1]).reshape(experts.shape[0] - 1, -1).all(axis=1)
    return dup


def repeated_in_topk(experts: np.ndarray) -> np.ndarray:
    """[T', L] bool: the position's top-k at that layer names an expert more than once. experts: [T', L, k]."""
    s = np.sort(experts, axis=-1)
    return (s[..., 1:] == s[..., :-1]).any(axis=-1)


def check_row(row: TraceRow, *, n_layers: int, n_experts: int, top_k: int, vocab_size: int | None = None,
              reference: np.ndarray | None = None) -> list[str]:
    """Names of the checks (`CHECKS`) the row fails, in `CHECKS` order; [] for a sound row.

    n_layers, n_experts, top_k: the model's routing-layer count, experts per layer and k.
    vocab_size: when given, token ids are checked against it.
    reference: [T, L, k] the reference model's expert ids for every token of the row (any order
        within k); when given, a duplicated position the reference also routes like its predecessor
        is not reported.
    """
    e = np.asarray(row.experts)
    failed: set[str] = set()
    if e.ndim != 3:
        raise ValueError(f"row {row.row!r}: routing of shape {tuple(e.shape)}, expected [positions, layers, k]")
    zeros = e.size > 0 and not e.any()
    if zeros:
        failed.add("all_zeros")
    n_tok = len(row.token_ids)
    expected = n_tok - row.start  # positions the routing should cover
    if abs(e.shape[0] - expected) == 1:
        failed.add("length_off_by_one")
    elif e.shape[0] != expected:
        failed.add("length_mismatch")
    if e.shape[1] != n_layers:
        failed.add("layer_count")
    if e.shape[2] != top_k:
        failed.add("top_k")
    if e.size and (e.min() < 0 or e.max() >= n_experts):
        failed.add("expert_out_of_range")
    if not zeros and e.size:
        if repeated_in_topk(e).any():
            failed.add("repeated_expert")
        dup = duplicated_positions(e)
        if reference is not None and dup.any():
            ref = np.sort(np.asarray(reference), axis=-1)[row.start:]  # aligned with the routing
            n = min(len(ref), len(dup))
            same_ref = np.zeros_like(dup)
            if ref.ndim == 3 and n > 1 and ref.shape[1:] == e.shape[1:]:
                same_ref[1:n] = (ref[1:n] == ref[:n - 1]).reshape(n - 1, -1).all(axis=1)
            dup &= ~same_ref
        if dup.any():
            failed.add("duplicated_position")
    if vocab_size is not None and n_tok:
        t = np.asarray(row.token_ids)
        if t.min() < 0 or t.max() >= vocab_size:
            failed.add("token_out_of_range")
    return [c for c in CHECKS if c in failed]


class Checks:
    """Counts the checks over a trace: `add` each row's failures, `frame` the `checks.csv` table.

    The frame has one row per check in `CHECKS` order (count 0 for those never failed): `check`,
    `count` (rows failing it), `rows` (their ids in trace order, joined by ";"; at most
    `MAX_ROWS_NAMED`, then "... (+N more)")."""

    def __init__(self) -> None:
        self.counts = {c: 0 for c in CHECKS}
        self.rows: dict[str, list[str]] = {c: [] for c in CHECKS}

    def add(self, row: str, failed: list[str]) -> None:
        """Record that request `row` failed the checks `failed` (names from `CHECKS`)."""
        for c in failed:
            if c not in self.counts:
                raise ValueError(f"unknown check {c!r} (expected one of {', '.join(CHECKS)})")
            self.counts[c] += 1
            if len(self.rows[c]) < MAX_ROWS_NAMED:
                self.rows[c].append(str(row))

    def check(self, row: TraceRow, **model) -> list[str]:
        """`check_row(row, **model)`, recorded; returns the failures."""
        failed = check_row(row, **model)
        self.add(row.row, failed)
        return failed

    def frame(self) -> pd.DataFrame:
        """The `checks.csv` table: check (string), count (int64), rows (string)."""
        def named(c: str) -> str:
            more = self.counts[c] - len(self.rows[c])
            return ";".join(self.rows[c]) + (f";... (+{more} more)" if more else "")
        return pd.DataFrame({"check": pd.Series(CHECKS, dtype="string"),
                             "count": pd.Series([self.counts[c] for c in CHECKS], dtype="int64"),
                             "rows": pd.Series([named(c) for c in CHECKS], dtype="string")})
