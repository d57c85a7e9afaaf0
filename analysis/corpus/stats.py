"""Corpus statistics: how a model routes over a whole dataset, as streaming accumulators (`Layout`,
`RouteStats`) and the names of their tables' columns (no model, no I/O; `analysis.corpus.run` feeds
them batch by batch).

Families with per-token routes (`families.RouteReader`) feed `RouteStats` with each batch's routes
(L, B, T), 1-based with 0 undefined, their top-k picks (L, B, T, k) where the reader has them, the
row lengths (positions at or past a row's length are padding and never count), the input token ids
and the model's predicted next token at each position, and each row's label values. It keeps counts
only, so memory does not grow with the number of prompts.

Families without per-token routes (ParallelGPT's learned mix, PAGMLP's alpha/beta, Wiola's gates)
feed `values.ValueStats` with the rows their family table exports (`FamilyAnalysis.export`):
`values.call_values` gives, per label value, layer, kind and option, the mean / std / min / max of
the value over tokens ("per token" rows) or over prompts ("per call" rows) and the share of rows in
which the option was selected.

The reductions of the counts to tables are in `reductions`; two models' tables are set side by side
by `compare`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from routescope.analysis.export import columns as C

DEAD_FRACTION = 0.01
OVERLOAD_FACTOR = 2.0
MAX_ALL_PAIRS = 8  # layers up to which co-routing counts every pair (beyond: adjacent layers only)
READINGS = ("token", "last token")
ALL = "(all)"
ALL_LAYERS = "(all layers)"
DENSE_MAX = 2**21  # keys: counted in a dense array up to this many, sparsely beyond (large vocabularies)

# column names of corpus tables (the others are analysis.export.columns')
LABEL_COLUMN, LABEL_VALUE, READING = "label_column", "label_value", "reading"
TOKENS, TOKEN_SHARE, FIRST, FIRST_SHARE, SLOTS, SLOT_SHARE = "tokens", "token_share", "first", "first_share", "slots", \
    "slot_share"
UNIFORM, DEAD, OVERLOADED, N, ROUTED = "uniform", "dead", "overloaded", "n", "routed"
INTENDED, ACCURACY = "intended", "accuracy"
BY, RANK, TOKEN_COUNT, OF_TOKEN, OPTION_SHARE, LIFT, G2, P_VALUE = "by", "rank", "token_count", "share_of_token", \
    "option_share", "lift", "g2", "p_value"
LAYER_A, LAYER_B, LABEL_A, LABEL_B, P_B_GIVEN_A = "layer_a", "layer_b", "label_a", "label_b", "p_b_given_a"
KIND, SCOPE, MEAN, STD, MIN, MAX, SELECTED_SHARE = "kind", "scope", "mean", "std", "min", "max", "selected_share"
BY_KINDS = ("input", "predicted")
# label columns whose values name the intended option themselves: 1-based (a probe file's) or 0-based
EXPECTED_PATH, EXPECTED_OPTION = C.EXPECTED_PATH, "expected_option"


@dataclass(frozen=True)
class Layout:
    """What a model's corpus statistics are over: its routing layers, each one's option count and
    labels (0-based options), the top-k picks recorded per token (1: first choices only), and the
    dataset's label columns. `routes` False: per-call values only (`values.ValueStats`).
    `routed`: per layer, the options its router picks among (the first ones; a shared expert after
    them runs for every token); None: every option."""

    layers: tuple[str, ...]
    n_options: tuple[int, ...]
    labels: tuple[tuple[str, ...], ...]
    k: int
    label_columns: tuple[str, ...]
    routes: bool = True
    routed: tuple[int, ...] | None = None

    def n_routed(self, l: int) -> int:
        return self.n_options[l] if self.routed is None else self.routed[l]

    @property
    def n(self) -> int:
        return max(self.n_options, default=1)


# --- counting ---------------------------------------------------------------------------------------
# Counts are torch tensors kept where the batches arrive: a GPU corpus counts on the GPU, and no step
# of `RouteStats.add` waits for it (no data-dependent shape, no `.item()`: the real tokens are picked
# by index lists made on the CPU from the row lengths, and undefined routes get a key past the end),
# so the next batch's forward is launched while this one is counted. The reductions read numpy.

def _accelerated(device: torch.device) -> bool:
    """Whether counts on `device` are kernels queued behind the forwards (not the CPU's own work)."""
    return device.type != "cpu"


def _count_into(acc: torch.Tensor, keys: torch.Tensor) -> None:
    """acc[k] += 1 for every k in keys (each in [0, acc.numel()), as int64)."""
    if _accelerated(acc.device):  # bincount sizes its output from the largest key: a wait for the device
        acc.index_add_(0, keys, torch.ones_like(keys))
    else:
        acc += torch.bincount(keys, minlength=acc.numel())  # a CPU's faster count


def _to(x: Any, device: torch.device) -> torch.Tensor:
    """An int64 tensor on `device` (a CPU array or tensor is sent without a wait)."""
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    return t.to(device=device, dtype=torch.int64, non_blocking=True)


class KeyCounts:
    """Counts of integer keys in [0, size) (a key of `size` is skipped): a dense tensor when small,
    else sorted unique keys with counts on the CPU, compacted as batches arrive (memory bounded by
    the distinct keys seen). On an accelerator the keys of several batches are held there and counted
    together (up to `DEVICE_KEYS`): taking unique keys waits for the device, which would stall the
    next batch's forward at every batch."""

    DEVICE_KEYS = 2**25  # keys held on an accelerator before they are counted (256 MiB)

    def __init__(self, size: int) -> None:
        self.size = size
        self.is_dense = size <= DENSE_MAX
        self.dense: torch.Tensor | None = None  # [size + 1] where dense (made at the first batch)
        self.keys = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self._held: list[torch.Tensor] = []  # keys not counted yet (an accelerator's)
        self._n_held = 0
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._n_pending = 0

    def add(self, keys: Any) -> None:
        keys = keys if isinstance(keys, torch.Tensor) else torch.from_numpy(np.asarray(keys, dtype=np.int64))
        if self.is_dense:
            if self.dense is None:
                self.dense = torch.zeros(self.size + 1, dtype=torch.int64, device=keys.device)
            _count_into(self.dense, keys.reshape(-1))
            return
        self._held.append(keys.reshape(-1))
        self._n_held += keys.numel()
        if not _accelerated(keys.device) or self._n_held > self.DEVICE_KEYS:
            self._count_held()

    def _count_held(self) -> None:
        if not self._held:
            return
        keys = self._held[0] if len(self._held) == 1 else torch.cat(self._held)  # a CPU holds one batch: no copy
        self._held, self._n_held = [], 0
        if _accelerated(keys.device):
            u, c = torch.unique(keys, sorted=True, return_counts=True)
            u, c = u.cpu().numpy(), c.cpu().numpy().astype(np.int64)
        else:  # numpy's unique: about 4x torch's on a CPU (32k int64 keys: 0.5 against 2.0 ms)
            u, c = np.unique(keys.numpy(), return_counts=True)
        if len(u) and u[-1] == self.size:  # undefined routes
            u, c = u[:-1], c[:-1]
        self._pending.append((u, c))
        self._n_pending += len(u)
        if self._n_pending > max(2**18, len(self.keys)):
            self._compact()

    def _compact(self) -> None:
        self._count_held()
        if not self._pending:
            return
        k = np.concatenate([self.keys] + [u for u, _ in self._pending])
        c = np.concatenate([self.counts] + [c for _, c in self._pending])
        # every part is sorted already: a stable sort (timsort for int64) merges the runs, where a full
        # unique(return_inverse) re-sorted every key at random (2.5x the time on 16 layers x 2,048 tokens)
        order = np.argsort(k, kind="stable")
        k, c = k[order], c[order]
        start = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]])) if len(k) else np.zeros(0, dtype=np.int64)
        self.keys = k[start]
        self.counts = np.add.reduceat(c, start).astype(np.int64) if len(k) else np.zeros(0, dtype=np.int64)
        self._pending, self._n_pending = [], 0

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, counts) of every key counted at least once, keys ascending."""
        if self.is_dense:
            dense = self.dense[:self.size].cpu().numpy() if self.dense is not None else np.zeros(0, dtype=np.int64)
            keys = np.flatnonzero(dense)
            return keys, dense[keys]
        self._compact()
        return self.keys, self.counts


class LabelIndex:
    """Label value -> 0-based index in order of first appearance, for one label column."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def of(self, values: Sequence[str]) -> np.ndarray:
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            j = self._index.get(v)
            if j is None:
                j = self._index[v] = len(self.values)
                self.values.append(v)
            out[i] = j
        return out


def _grow(a: np.ndarray, n: int) -> np.ndarray:
    return a if a.shape[0] >= n else np.concatenate([a, np.zeros((n - a.shape[0], *a.shape[1:]), a.dtype)])


def layer_pairs(n_layers: int) -> list[tuple[int, int]]:
    """The layer pairs co-routing counts: every i < j up to MAX_ALL_PAIRS layers, else adjacent ones."""
    if n_layers <= MAX_ALL_PAIRS:
        return [(i, j) for i in range(n_layers) for j in range(i + 1, n_layers)]
    return [(i, i + 1) for i in range(n_layers - 1)]


class RouteStats:
    """Running counts of per-token routes over a corpus (module doc). Index 0 of every option axis
    counts undefined routes; option o is index o + 1. The counts are kept on the device the first
    batch's routes are on (see "counting" above) and read as numpy arrays (`first`, `slots`, `co`,
    `by_label`)."""

    def __init__(self, layout: Layout, vocab_size: int) -> None:
        self.layout, self.vocab_size = layout, vocab_size
        self.n_rows = self.n_tokens = 0
        self.pairs = layer_pairs(len(layout.layers))
        self.label_index = [LabelIndex() for _ in layout.label_columns]
        self.label_rows = [np.zeros(0, dtype=np.int64) for _ in layout.label_columns]
        self.label_tokens = [np.zeros(0, dtype=np.int64) for _ in layout.label_columns]
        self.spec = {by: KeyCounts(len(layout.layers) * (layout.n + 1) * vocab_size) for by in BY_KINDS}
        self._counts: dict[str, torch.Tensor] = {}  # first, slots, co: flat, on the batches' device
        self._by_label: list[torch.Tensor] = []  # per label column: [values, readings, L, n1] flat
        self._host: dict[str, Any] | None = None  # numpy copies, until the next batch

    def _start(self, device: torch.device) -> None:
        L, n1 = len(self.layout.layers), self.layout.n + 1
        z = lambda n: torch.zeros(n, dtype=torch.int64, device=device)  # noqa: E731
        self._counts = {"first": z(L * n1), "slots": z(L * n1), "co": z(len(self.pairs) * n1 * n1)}
        self._by_label = [z(0) for _ in self.layout.label_columns]

    def add(self, routes: Any, lengths: Sequence[int], *, input_ids: Any, predicted: Any = None, topk: Any = None,
            labels: Sequence[Sequence[str]] = ()) -> None:
        """One batch: routes (L, B, T) 1-based, 0 undefined; lengths (B,) real tokens per row (the
        rest is padding); input_ids, predicted (B, T) token ids; topk (L, B, T, k) or None;
        labels: one sequence of B values per label column. Arrays are numpy arrays or torch tensors;
        tensors on a GPU are counted there."""
        routes = routes if isinstance(routes, torch.Tensor) else torch.from_numpy(np.asarray(routes))
        dev = routes.device
        if not self._counts:
            self._start(dev)
        self._host = None
        L, B, T = routes.shape
        n1, V = self.layout.n + 1, self.vocab_size
        lengths = np.asarray(lengths, dtype=np.int64)
        rows = np.repeat(np.arange(B), lengths)  # batch row of each real token
        N = len(rows)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if B else np.zeros(0, np.int64)
        flat = _to(rows * T + np.arange(N) - np.repeat(starts, lengths), dev)  # [N] real tokens in (B * T)
        self.n_rows += B
        self.n_tokens += N
        r = routes.reshape(L, B * T).index_select(1, flat).long()  # (L, N)
        base = (torch.arange(L, device=dev) * n1)[:, None]  # (L, 1)
        lr = base + r  # (L, N): layer * n1 + route
        _count_into(self._counts["first"], lr.reshape(-1))
        if topk is not None:
            tk = _to(topk, dev)
            tk = tk.reshape(L, B * T, tk.shape[-1]).index_select(1, flat)  # (L, N, k)
            _count_into(self._counts["slots"], (base[:, :, None] + tk).reshape(-1))
        else:
            _count_into(self._counts["slots"], lr.reshape(-1))
        if self.pairs:
            i, j = (_to([p[s] for p in self.pairs], dev) for s in (0, 1))
            p = torch.arange(len(self.pairs), device=dev)[:, None]
            _count_into(self._counts["co"], ((p * n1 + r.index_select(0, i)) * n1 + r.index_select(0, j)).reshape(-1))
        last = routes.reshape(L, B * T).index_select(1, _to(np.arange(B) * T + np.maximum(lengths - 1, 0), dev)).long()
        layer = torch.arange(L, device=dev)[:, None]
        for c, values in enumerate(labels):
            vi = self.label_index[c].of(list(values))  # (B,)
            nv = len(self.label_index[c].values)
            self.label_rows[c] = _grow(self.label_rows[c], nv) + np.bincount(vi, minlength=nv)
            self.label_tokens[c] = _grow(self.label_tokens[c], nv) + np.bincount(vi, weights=lengths, minlength=nv).astype(np.int64)
            size = nv * len(READINGS) * L * n1
            acc = self._by_label[c]
            if acc.numel() < size:
                acc = self._by_label[c] = torch.cat([acc, acc.new_zeros(size - acc.numel())])
            tok_keys = ((_to(vi[rows], dev)[None, :] * len(READINGS) + 0) * L + layer) * n1 + r
            last_keys = ((_to(vi, dev)[None, :] * len(READINGS) + 1) * L + layer) * n1 + last
            _count_into(acc, torch.cat([tok_keys.reshape(-1), last_keys.reshape(-1)]))
        spec_size = L * n1 * V
        for by, ids in (("input", input_ids), ("predicted", predicted)):
            if ids is None:
                continue
            t = _to(ids, dev).reshape(B * T).index_select(0, flat)[None, :]  # (1, N)
            self.spec[by].add(torch.where(r > 0, lr * V + t, spec_size).reshape(-1))  # undefined: skipped

    def _numpy(self) -> dict[str, Any]:
        if self._host is None:
            L, n1 = len(self.layout.layers), self.layout.n + 1
            got = {k: v.cpu().numpy() for k, v in self._counts.items()}
            self._host = {"first": got.get("first", np.zeros(L * n1, np.int64)).reshape(L, n1),
                          "slots": got.get("slots", np.zeros(L * n1, np.int64)).reshape(L, n1),
                          "co": got.get("co", np.zeros(len(self.pairs) * n1 * n1, np.int64)).reshape(
                              len(self.pairs), n1, n1),
                          "by_label": [a.cpu().numpy().reshape(-1, len(READINGS), L, n1) for a in self._by_label]
                          or [np.zeros((0, len(READINGS), L, n1), np.int64) for _ in self.layout.label_columns]}
        return self._host

    @property
    def first(self) -> np.ndarray:  # (L, n1) first choices
        return self._numpy()["first"]

    @property
    def slots(self) -> np.ndarray:  # (L, n1) top-k slots
        return self._numpy()["slots"]

    @property
    def co(self) -> np.ndarray:  # (pairs, n1, n1) first choices at layer i and at layer j
        return self._numpy()["co"]

    @property
    def by_label(self) -> list[np.ndarray]:  # per label column: (values, readings, L, n1)
        return self._numpy()["by_label"]
