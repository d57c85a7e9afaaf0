"""`replay`: a whole trace against the model, streamed batch by batch (`rs.replay`, `routescope replay`,
the app's Replay view).

Rows are read one at a time, grouped into batches of about `batch_tokens` tokens, and each batch is
run through the model (and its float32 copy where asked) in one forward (`compare.reference_routes`);
the broken-trace checks (`checks.Checks`) and the comparison (`compare.compare_row`) follow on the
CPU. What is kept grows with rows and layers, never with positions: the tallies, one summary line
per row, the per-position maps of the first `keep_rows` rows, and the mismatches, which go to `sink`
as each batch finishes (the CLI writes them straight to its files) and are kept only up to
`MAX_KEPT` when a sink takes them.

Which rows are compared, and which end the run:
- the first row decides whether the trace is this model's: token ids outside the vocabulary, a
  layer count, k or an expert id the model cannot have there end the run in one line naming the row
  (a trace of another model); a token outside the vocabulary in a later row ends it too (the model
  cannot run it);
- later rows with another layer count or k, and rows of all zeros (an engine that returned nothing),
  are counted by their check and left out of the comparison; every other row is compared over the
  positions both the trace and its token ids hold (a length off by one compares the common prefix).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pandas as pd
import torch

from routescope.analysis.replay.checks import Checks
from routescope.analysis.replay.compare import (DTYPES, MISMATCH_COLUMNS, Reference, ReplaySettings, RowResult, Shape,
                                                Tally, aligned, compare_row, model_shape, reference_routes)
from routescope.analysis.replay.row import TraceRow

MAX_KEPT = 100_000  # mismatches kept in the result when a sink takes them all (the page shows the first ones)
LEFT_OUT = ("all_zeros", "layer_count", "top_k")  # checks whose rows are not compared

Batch = list[tuple[TraceRow, np.ndarray]]  # rows with their engine ids in depth order
# batches in -> (batch, reference per row with tokens, float32 reference ids per such row or None) out, in order
References = Callable[[Iterator[Batch]], Iterator[tuple[Batch, list[Reference], list[np.ndarray] | None]]]


class Stopped(Exception):
    """A replay stopped on request (`stop()` returned True)."""


@dataclass
class ReplayResult:
    """tables: agreement, mismatches, checks, first_divergence, rows (frames by output name); details:
    the first rows' `RowResult`s (per-position maps, for the view and the page); summary: the corpus
    figures (`Tally.summary`); provenance: what ran."""

    tables: dict[str, pd.DataFrame]
    details: list[RowResult]
    summary: dict[str, Any]
    provenance: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]


def model_dtype(model: Any) -> torch.dtype:
    return next(model.parameters()).dtype


def triage(row: TraceRow, shape: Shape, first: bool, context: int) -> np.ndarray:
    """The row's engine ids in depth order, or ValueError naming the row where the run cannot go on
    (module doc)."""
    tokens = np.asarray(row.token_ids)
    e = aligned(row, shape)
    if e.ndim != 3:
        raise ValueError(f"row {row.row!r}: routing of shape {tuple(e.shape)}, expected [positions, layers, k]")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= shape.vocab):
        bad = int(tokens.min() if tokens.min() < 0 else tokens.max())
        raise ValueError(f"row {row.row!r}: token id {bad} is outside the vocabulary of {shape.label} "
                         f"(0..{shape.vocab - 1}): a trace of another model?")
    if len(tokens) > context:
        raise ValueError(f"row {row.row!r}: {len(tokens)} tokens exceed the context of {shape.label} ({context})")
    if first:
        L, k = e.shape[1], e.shape[2]
        if L != len(shape.layers):
            raise ValueError(f"row {row.row!r}: routing of {L} layers, {shape.label} has {len(shape.layers)} routing "
                             "layers: a trace of another model?")
        if k != shape.k:
            raise ValueError(f"row {row.row!r}: top-{k} routing, {shape.label} routes top-{shape.k}: a trace of another "
                             "model?")
        if e.size and e.max() >= shape.n:
            raise ValueError(f"row {row.row!r}: expert id {int(e.max())}, {shape.label} has {shape.n} experts per "
                             "layer (0..{}): a trace of another model?".format(shape.n - 1))
    return e


def _batches(rows: Iterable[TraceRow], tokens: int) -> Iterator[list[TraceRow]]:
    batch, size = [], 0
    for row in rows:
        n = len(row.token_ids)
        if batch and size + n > tokens:
            yield batch
            batch, size = [], 0
        batch.append(row)
        size += n
    if batch:
        yield batch


def local_references(model: Any, shape: Shape, float32_model: Any | None) -> References:
    """References computed in this process: `model`, and `float32_model` where given."""
    def refs(batches: Iterator[Batch]):
        for batch in batches:
            ids = [row.token_ids for row, _ in batch if len(row.token_ids)]
            if not ids:
                yield batch, [], None
                continue
            r32 = [r.ids for r in reference_routes(float32_model, shape, ids)] if float32_model is not None else None
            yield batch, reference_routes(model, shape, ids), r32
    return refs


def replay(model: Any, rows: Iterable[TraceRow], *, settings: ReplaySettings = ReplaySettings(),
           float32_model: Any | None = None, progress: Callable[[int, int], None] | None = None,
           stop: Callable[[], bool] | None = None, sink: Callable[[pd.DataFrame], None] | None = None,
           references: Callable[[Shape], References] | None = None,
           name: str = "model", trace: str = "") -> ReplayResult:
    """Replay `rows` (a trace's requests, `trace.read_trace`) against `model` (module doc).

    float32_model: the same model in float32 (`model.float32_copy()`): the mismatches' gone_in_float32.
    progress(rows done, tokens done) after each batch; stop() True ends with `Stopped`. sink: takes
    each batch's mismatches (the result then keeps the first `MAX_KEPT`). references: given the
    model's `Shape`, where the references are computed (`References`; Ray workers: `ray_replay`);
    default this process."""
    t0 = time.perf_counter()
    shape = model_shape(model)
    dtype = DTYPES[settings.trace_dtype] if settings.trace_dtype else model_dtype(model)
    context = int(getattr(model, "context", 1 << 62))
    checks, tally = Checks(), Tally(shape, float32=float32_model is not None)
    details: list[RowResult] = []
    kept: list[pd.DataFrame] = []
    n_kept = rows_done = tokens_done = 0
    first = True

    def triaged() -> Iterator[list[tuple[TraceRow, np.ndarray]]]:
        nonlocal first
        for batch in _batches(rows, settings.batch_tokens):
            if stop is not None and stop():
                raise Stopped()
            out = []
            for row in batch:
                out.append((row, triage(row, shape, first, context)))
                first = False
            yield out

    stream = (references(shape) if references is not None else local_references(model, shape, float32_model))
    for batch, refs, refs32 in stream(triaged()):
        tally.float32 = tally.float32 or refs32 is not None
        it = iter(range(len(refs)))
        for row, engine in batch:
            if not len(row.token_ids):
                checks.add(row.row, ["length_mismatch"] if len(engine) else [])
                continue
            j = next(it)
            failed = checks.check(row, n_layers=len(shape.layers), n_experts=shape.n, top_k=shape.k,
                                  vocab_size=shape.vocab, reference=refs[j].ids)
            if any(c in LEFT_OUT for c in failed):
                continue
            res = compare_row(row, engine, refs[j], shape, dtype=dtype, tie_ulps=settings.tie_ulps,
                              ref32=None if refs32 is None else refs32[j])
            tally.add(res)
            if len(details) < settings.keep_rows:
                details.append(res)
            m = res.mismatches
            if sink is not None and len(m):
                sink(m)
            if len(m) and (sink is None or n_kept < MAX_KEPT):
                kept.append(m if sink is None else m.head(MAX_KEPT - n_kept))
                n_kept += len(kept[-1])
            rows_done += 1
            tokens_done += len(res.first)
        if progress is not None:
            progress(rows_done, tokens_done)
    mismatches = pd.concat(kept, ignore_index=True) if kept else \
        pd.DataFrame({c: pd.Series([], dtype=t) for c, t in MISMATCH_COLUMNS.items()})
    notes = []
    if sink is not None and tally.mismatches > n_kept:
        notes.append(f"The page lists the first {n_kept:,} of {tally.mismatches:,} mismatches; the files have all.")
    summary = tally.summary()
    left_out = int(checks.frame().set_index("check").loc[list(LEFT_OUT), "count"].sum())
    provenance = {"model": name, "family": shape.label, "trace": trace, "layers": len(shape.layers), "top_k": shape.k,
                  "experts": shape.n, "dtype": str(model_dtype(model)).removeprefix("torch."),
                  "trace_dtype": str(dtype).removeprefix("torch."), "tie_ulps": settings.tie_ulps,
                  "reference_float32": tally.float32, "rows_left_out": left_out,
                  "seconds": round(time.perf_counter() - t0, 3), **summary}
    tables = {"agreement": tally.agreement(), "mismatches": mismatches, "checks": checks.frame(),
              "first_divergence": tally.first_divergence(), "rows": tally.rows()}
    return ReplayResult(tables, details, summary, provenance, notes)
