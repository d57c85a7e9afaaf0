"""Corpus statistics as tidy tables: pure reductions of a `stats.RouteStats` (no model, no I/O).

The reductions:

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
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from routescope.analysis.export import columns as C
from routescope.analysis.corpus.stats import (ACCURACY, ALL, ALL_LAYERS, BY, BY_KINDS, DEAD, DEAD_FRACTION,
                                              EXPECTED_OPTION, EXPECTED_PATH, FIRST, FIRST_SHARE, G2, INTENDED, LABEL_A,
                                              LABEL_B, LABEL_COLUMN, LABEL_VALUE, LAYER_A, LAYER_B, LIFT, Layout, N,
                                              OF_TOKEN, OPTION_SHARE, OVERLOADED, OVERLOAD_FACTOR, P_B_GIVEN_A, P_VALUE,
                                              RANK, READING, READINGS, ROUTED, RouteStats, SLOTS, SLOT_SHARE, TOKENS,
                                              TOKEN_COUNT, TOKEN_SHARE, UNIFORM)


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
    """Label column -> its values in order of appearance (`RouteStats`, or `values.ValueStats`)."""
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
