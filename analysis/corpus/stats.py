"""Corpus statistics: how a model routes over a whole dataset, as streaming accumulators and pure
reductions to tidy tables (no model, no I/O; `analysis.corpus.run` feeds them batch by batch).

Families with per-token routes (`families.RouteReader`) feed `RouteStats` with each batch's routes
(L, B, T), 1-based with 0 undefined, their top-k picks (L, B, T, k) where the reader has them, the
row lengths (positions at or past a row's length are padding and never count), the input token ids
and the model's predicted next token at each position, and each row's label values. It keeps counts
only, so memory does not grow with the number of prompts. The reductions:

- `utilisation`: per layer and option, the share of (defined) tokens that pick it anywhere in their
  top-k (`token_share`, sums to k), of first choices (`first_share`) and of top-k slots
  (`slot_share`, sums to 1; equal to `first_share` where k = 1). An option is `dead` when its slot
  share is below DEAD_FRACTION of the uniform share 1/n, `overloaded` above OVERLOAD_FACTOR times it.
- `label_shares`: per label column and value, reading ("token": every token; "last token": each
  row's last real token, as a paper's probe table reads a prompt's route), layer and option: first
  choices and their share of the defined routes (the general form of a probe table: any labels,
  any options).
- `accuracy`: where a label value maps to an intended option (`intended`), the share of its defined
  routes that take it, per layer and over all layers, per value and over every mapped value.
- `specialisation`: per layer and option, the tokens (input token, or the model's predicted next
  token) most over-represented among the tokens whose first choice it is: count a, the token's
  count n_t, the share a / n_t of its occurrences routed there, lift = (a / n_t) / (n_o / N), and
  Dunning's log-likelihood ratio G2 of the 2x2 table (token or not, option or not) with its
  chi-square (1 dof) p-value; over-represented tokens (a > n_t n_o / N) seen at least `min_count`
  times, by G2.
- `co_routing`: per pair of layers i < j (every pair up to MAX_ALL_PAIRS layers, adjacent pairs
  beyond) and options a, b: tokens taking a at i and b at j, their share of the tokens defined at
  both, and P(b at j | a at i).

Families without per-token routes (ParallelGPT's learned mix, PAGMLP's alpha/beta, Wiola's gates)
feed `corpus_values.ValueStats` with the rows their family table exports
(`families.FamilyAnalysis.export`): `corpus_values.call_values` gives, per label value, layer,
kind and option, the mean / std / min / max of the value over tokens ("per token" rows) or over prompts ("per call" rows) and the share of rows in
which the option was selected.

`comparable` says why two models' statistics cannot be set side by side; `compare_tables` merges
two models' tables on their keys with each measure of both and the difference (b - a).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
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
    dataset's label columns. `routes` False: per-call values only (`corpus_values.ValueStats`).
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


# --- reductions: route statistics --------------------------------------------------------------------

def _label(layout: Layout, l: int, o: int) -> str:
    names = layout.labels[l]
    return names[o] if 0 <= o < len(names) else f"option {o}"


def utilisation(stats: RouteStats) -> pd.DataFrame:
    """Per layer and option: token, first-choice and top-k slot counts and shares, the uniform
    share and the dead / overloaded flags (module doc). The uniform share is over the options a
    router picks among (`Layout.routed`); an option it never picks because it runs for every token
    (a shared expert) has `routed` False, no shares and no flags."""
    lay = stats.layout
    rows = []
    for l, layer in enumerate(lay.layers):
        n_l, r_l = lay.n_options[l], lay.n_routed(l)
        defined = int(stats.first[l, 1:].sum())
        slots_total = int(stats.slots[l, 1:n_l + 1].sum())
        uniform = 1.0 / r_l
        for o in range(n_l):
            tokens, first = int(stats.slots[l, o + 1]), int(stats.first[l, o + 1])
            routed = o < r_l
            slot_share = tokens / slots_total if slots_total and routed else math.nan
            rows.append((layer, o, _label(lay, l, o), routed, defined, tokens,
                         tokens / defined if defined and routed else math.nan, first,
                         first / defined if defined and routed else math.nan, tokens, slot_share,
                         uniform if routed else math.nan,
                         bool(routed and slots_total and slot_share < DEAD_FRACTION * uniform),
                         bool(routed and slots_total and slot_share > OVERLOAD_FACTOR * uniform)))
    return pd.DataFrame(rows, columns=[C.LAYER, C.OPTION, C.LABEL, ROUTED, C.N_TOKENS, TOKENS, TOKEN_SHARE, FIRST,
                                       FIRST_SHARE, SLOTS, SLOT_SHARE, UNIFORM, DEAD, OVERLOADED])


def label_shares(stats: RouteStats) -> pd.DataFrame:
    """Per label column, value, reading, layer and option: first choices, the defined routes of
    that value and layer (n), and their share."""
    lay = stats.layout
    rows = []
    for c, column in enumerate(lay.label_columns):
        counts = stats.by_label[c]
        for v, value in enumerate(stats.label_index[c].values):
            for k, reading in enumerate(READINGS):
                for l, layer in enumerate(lay.layers):
                    n_l = lay.n_options[l]
                    defined = int(counts[v, k, l, 1:n_l + 1].sum())
                    rows += [(column, value, reading, layer, o, _label(lay, l, o), int(counts[v, k, l, o + 1]), defined,
                              counts[v, k, l, o + 1] / defined if defined else math.nan) for o in range(n_l)]
    return pd.DataFrame(rows, columns=[LABEL_COLUMN, LABEL_VALUE, READING, C.LAYER, C.OPTION, C.LABEL, C.COUNT, N,
                                       C.SHARE])


def default_intended(label_columns: Sequence[str], values: Mapping[str, Sequence[str]]) -> dict[str, dict[str, int]]:
    """The intended options a dataset states itself: a label column `expected_path` holds 1-based
    routes (a probe file's: route r = option r - 1), `expected_option` 0-based options."""
    out: dict[str, dict[str, int]] = {}
    for column, offset in ((EXPECTED_PATH, 1), (EXPECTED_OPTION, 0)):
        if column in label_columns:
            m = {v: int(v) - offset for v in values.get(column, ()) if v.isascii() and v.isdigit()}
            out[column] = {v: o for v, o in m.items() if o >= 0}
    return out


def parse_intended(specs: Sequence[str]) -> dict[str, dict[str, int]]:
    """["domain:story=0,math=1", ...] -> {"domain": {"story": 0, "math": 1}}; ValueError naming
    the spec. Options are 0-based, as everywhere in RouteScope."""
    out: dict[str, dict[str, int]] = {}
    for spec in specs:
        column, sep, pairs = spec.partition(":")
        if not sep or not column.strip():
            raise ValueError(f"intended options {spec!r}: expected COLUMN:VALUE=OPTION,..., e.g. domain:story=0,math=1")
        m = out.setdefault(column.strip(), {})
        for pair in pairs.split(","):
            value, eq, option = pair.partition("=")
            option = option.strip()
            if not eq or not value.strip() or not (option.isascii() and option.isdigit()):
                raise ValueError(f"intended options {spec!r}: {pair.strip()!r} is not VALUE=OPTION with a 0-based "
                                 "option number")
            m[value.strip()] = int(option)
    return out


def label_values(stats: Any) -> dict[str, list[str]]:
    """Label column -> its values in order of appearance (`RouteStats`, or `corpus_values.ValueStats`)."""
    if isinstance(stats, RouteStats):
        return {c: list(ix.values) for c, ix in zip(stats.layout.label_columns, stats.label_index)}
    out: dict[str, list[str]] = {c: [] for c in stats.layout.label_columns}
    for c, v in stats.label_rows:
        out[c].append(v)
    return out


def check_intended(intended: Mapping[str, Mapping[str, int]], layout: Layout) -> None:
    """ValueError for an intended mapping naming a column the dataset lacks or an option no layer has."""
    for column, m in intended.items():
        if column not in layout.label_columns:
            raise ValueError(f"intended options: the dataset has no label column {column!r} "
                             f"(label columns: {', '.join(layout.label_columns) or 'none'})")
        for value, o in m.items():
            if not 0 <= o < layout.n:
                raise ValueError(f"intended options: {column} {value} -> option {o} is out of range "
                                 f"(the routing layers have options 0..{layout.n - 1})")


def accuracy(stats: RouteStats, intended: Mapping[str, Mapping[str, int]]) -> pd.DataFrame:
    """Per label column with intended options, value (and ALL: every mapped value), reading and
    layer (and ALL_LAYERS): routes equal to the intended option over the defined routes."""
    lay = stats.layout
    rows = []
    for c, column in enumerate(lay.label_columns):
        m = intended.get(column)
        if not m:
            continue
        counts = stats.by_label[c]
        mapped = [(v, value, m[value]) for v, value in enumerate(stats.label_index[c].values) if value in m]
        for k, reading in enumerate(READINGS):
            tot_c = np.zeros(len(lay.layers), dtype=np.int64)
            tot_n = np.zeros(len(lay.layers), dtype=np.int64)
            for v, value, o in mapped:
                corr = np.array([counts[v, k, l, o + 1] if o < lay.n_options[l] else 0 for l in range(len(lay.layers))])
                n = np.array([counts[v, k, l, 1:lay.n_options[l] + 1].sum() for l in range(len(lay.layers))])
                tot_c += corr
                tot_n += n
                rows += _accuracy_rows(column, value, o, reading, lay.layers, corr, n)
            if mapped:
                rows += _accuracy_rows(column, ALL, pd.NA, reading, lay.layers, tot_c, tot_n)
    return pd.DataFrame(rows, columns=[LABEL_COLUMN, LABEL_VALUE, INTENDED, READING, C.LAYER, C.CORRECT, N,
                                       ACCURACY]).astype({INTENDED: "Int64"})


def _accuracy_rows(column, value, option, reading, layers, correct, n) -> list[tuple]:
    rows = [(column, value, option, reading, layer, int(c), int(k), c / k if k else math.nan)
            for layer, c, k in zip(layers, correct, n)]
    total_c, total_n = int(correct.sum()), int(n.sum())
    return rows + [(column, value, option, reading, ALL_LAYERS, total_c, total_n,
                    total_c / total_n if total_n else math.nan)]


def g2_statistic(a: np.ndarray, n_t: np.ndarray, n_o: np.ndarray, N: np.ndarray | float) -> np.ndarray:
    """Dunning's log-likelihood ratio G2 = 2 sum O ln(O / E) of the 2x2 table with cells a (token
    and option), n_t - a, n_o - a, N - n_t - n_o + a (0 ln 0 = 0)."""
    a, n_t, n_o = (np.asarray(x, dtype=np.float64) for x in (a, n_t, n_o))
    N = np.asarray(N, dtype=np.float64)
    cells = [(a, n_t * n_o / N), (n_t - a, n_t * (N - n_o) / N), (n_o - a, (N - n_t) * n_o / N),
             (N - n_t - n_o + a, (N - n_t) * (N - n_o) / N)]
    total = np.zeros(np.broadcast(a, n_t, n_o, N).shape)
    for o, e in cells:
        with np.errstate(divide="ignore", invalid="ignore"):
            total += np.where(o > 0, o * np.log(np.where(o > 0, o, 1.0) / np.where(e > 0, e, 1.0)), 0.0)
    return 2.0 * total


def chi2_1_sf(x: float) -> float:
    """P(X > x) for a chi-square variable with one degree of freedom: erfc(sqrt(x / 2))."""
    return math.erfc(math.sqrt(max(float(x), 0.0) / 2.0))


def specialisation(stats: RouteStats, *, top: int = 10, min_count: int = 5,
                   decode: Callable[[int], str] | None = None) -> pd.DataFrame:
    """Per layer, option and `by` (input token / predicted next token): the `top` over-represented
    tokens by G2 (then count, then token id), module doc. `decode`: token id -> text (a `token`
    column)."""
    lay = stats.layout
    n1, V = lay.n + 1, stats.vocab_size
    frames = []
    for by in BY_KINDS:
        keys, counts = stats.spec[by].items()
        if not len(keys):
            continue
        t = keys % V
        lr = keys // V
        df = pd.DataFrame({"l": lr // n1, "r": lr % n1, C.TOKEN_ID: t, C.COUNT: counts})
        df["N"] = df.groupby("l")[C.COUNT].transform("sum")
        df[TOKEN_COUNT] = df.groupby(["l", C.TOKEN_ID])[C.COUNT].transform("sum")
        df["n_o"] = df.groupby(["l", "r"])[C.COUNT].transform("sum")
        expected = df[TOKEN_COUNT] * df["n_o"] / df["N"]
        df = df[(df[C.COUNT] > expected) & (df[C.COUNT] >= min_count)].copy()
        if not len(df):
            continue
        df[G2] = g2_statistic(df[C.COUNT], df[TOKEN_COUNT], df["n_o"], df["N"])
        df = df.sort_values(["l", "r", G2, C.COUNT, C.TOKEN_ID], ascending=[True, True, False, False, True],
                            kind="stable").groupby(["l", "r"], sort=False).head(top)
        df[BY] = by
        frames.append(df)
    cols = [C.LAYER, C.OPTION, C.LABEL, BY, RANK, C.TOKEN_ID] + ([C.TOKEN] if decode else []) + \
        [C.COUNT, TOKEN_COUNT, OF_TOKEN, OPTION_SHARE, LIFT, G2, P_VALUE]
    if not frames:
        return pd.DataFrame(columns=cols)
    df = pd.concat(frames, ignore_index=True).sort_values(["l", "r", BY], kind="stable").reset_index(drop=True)
    out = pd.DataFrame({
        C.LAYER: np.array(lay.layers)[df["l"].to_numpy()], C.OPTION: (df["r"] - 1).to_numpy(),
        C.LABEL: [_label(lay, l, r - 1) for l, r in zip(df["l"], df["r"])], BY: df[BY].to_numpy(),
        RANK: df.groupby(["l", "r", BY], sort=False).cumcount().to_numpy(), C.TOKEN_ID: df[C.TOKEN_ID].to_numpy()})
    if decode:
        out[C.TOKEN] = [decode(int(i)) for i in df[C.TOKEN_ID]]
    out[C.COUNT] = df[C.COUNT].to_numpy()
    out[TOKEN_COUNT] = df[TOKEN_COUNT].to_numpy()
    out[OF_TOKEN] = (df[C.COUNT] / df[TOKEN_COUNT]).to_numpy()
    out[OPTION_SHARE] = (df["n_o"] / df["N"]).to_numpy()
    out[LIFT] = out[OF_TOKEN] / out[OPTION_SHARE]
    out[G2] = df[G2].to_numpy()
    out[P_VALUE] = [chi2_1_sf(x) for x in out[G2]]
    return out


def co_routing(stats: RouteStats) -> pd.DataFrame:
    """Per counted layer pair (i < j) and options a, b: tokens routed a at i and b at j, their share
    of the tokens defined at both layers, and P(b at j | a at i)."""
    lay = stats.layout
    rows = []
    for p, (i, j) in enumerate(stats.pairs):
        m = stats.co[p, 1:lay.n_options[i] + 1, 1:lay.n_options[j] + 1]
        both = int(m.sum())
        row_tot = m.sum(1)
        for a in range(m.shape[0]):
            for b in range(m.shape[1]):
                c = int(m[a, b])
                rows.append((lay.layers[i], a, _label(lay, i, a), lay.layers[j], b, _label(lay, j, b), c,
                             c / both if both else math.nan, c / row_tot[a] if row_tot[a] else math.nan))
    return pd.DataFrame(rows, columns=[LAYER_A, C.OPTION_A, LABEL_A, LAYER_B, C.OPTION_B, LABEL_B, C.COUNT, C.SHARE,
                                       P_B_GIVEN_A])


# --- comparison --------------------------------------------------------------------------------------

def comparable(a: Layout, b: Layout, names: tuple[str, str] = ("A", "B")) -> str | None:
    """Why the statistics of two models cannot be set side by side, or None when they can: both
    read per-token routes (or both per-call values) over the same routing layers with the same
    number of options each."""
    na, nb = names
    if a.routes != b.routes:
        has, lacks = (na, nb) if a.routes else (nb, na)
        return f"{has} has per-token routes and {lacks} only per-call values: their statistics differ in kind"
    if a.layers != b.layers:
        return (f"their routing layers differ: {na} has {', '.join(a.layers) or 'none'}; "
                f"{nb} has {', '.join(b.layers) or 'none'}")
    for layer, x, y in zip(a.layers, a.n_options, b.n_options):
        if x != y:
            return f"{layer} has {x} options in {na} and {y} in {nb}"
    return None


# table -> (key columns, measures compared); flags are shown for both models, not differenced
COMPARE_KEYS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "utilisation": ([C.LAYER, C.OPTION, C.LABEL], [TOKEN_SHARE, FIRST_SHARE, SLOT_SHARE], [DEAD, OVERLOADED]),
    "label_shares": ([LABEL_COLUMN, LABEL_VALUE, READING, C.LAYER, C.OPTION, C.LABEL], [C.SHARE], []),
    "accuracy": ([LABEL_COLUMN, LABEL_VALUE, READING, C.LAYER], [ACCURACY], []),
    "specialisation": ([C.LAYER, C.OPTION, C.LABEL, BY, C.TOKEN], [C.COUNT, LIFT, G2], []),
    "co_routing": ([LAYER_A, C.OPTION_A, LAYER_B, C.OPTION_B], [C.SHARE, P_B_GIVEN_A], []),
    "call_values": ([LABEL_COLUMN, LABEL_VALUE, C.LAYER, KIND, C.OPTION, SCOPE], [MEAN, SELECTED_SHARE], []),
}


def compare_tables(a: Mapping[str, pd.DataFrame], b: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Tables of two models side by side: per table both have, the rows of either (an outer merge
    on its keys; specialisation by token text, so models with different tokenizers compare), each
    measure as `<m>_a`, `<m>_b` and `<m>_diff` = b - a."""
    out = {}
    for name, (keys, measures, flags) in COMPARE_KEYS.items():
        if name not in a or name not in b:
            continue
        ta, tb = a[name], b[name]
        keys = [k for k in keys if k in ta.columns and k in tb.columns]
        cols = [m for m in measures + flags if m in ta.columns and m in tb.columns]
        left = ta[keys + cols].assign(_ia=np.arange(len(ta)))
        right = tb[keys + cols].assign(_ib=np.arange(len(tb)))
        m = left.merge(right, on=keys, how="outer", suffixes=("_a", "_b"), sort=False)
        m = m.sort_values(["_ia", "_ib"], na_position="last", kind="stable")  # a's order, then rows only b has
        for c in cols:
            if pd.api.types.is_integer_dtype(ta[c].dtype):  # counts stay integers where one side has none
                m[f"{c}_a"], m[f"{c}_b"] = m[f"{c}_a"].astype("Int64"), m[f"{c}_b"].astype("Int64")
        for c in measures:
            if c in cols:
                m[f"{c}_diff"] = m[f"{c}_b"].astype("float64") - m[f"{c}_a"].astype("float64")
        order = keys + [f"{c}_{s}" for c in cols for s in (("a", "b", "diff") if c in measures else ("a", "b"))]
        out[name] = m[order].reset_index(drop=True)
    return out
