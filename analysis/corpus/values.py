"""Corpus statistics of families without per-token routes: running sums of the rows their family
table exports (`families.FamilyAnalysis.export`: kind, option, value, selected, per token or per
call), per label value, reduced by `call_values` (module doc of `analysis.corpus.stats`)."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from routescope.analysis.export import columns as C
from routescope.analysis.corpus.stats import (ALL, KIND, LABEL_COLUMN, LABEL_VALUE, MAX, MEAN, MIN, N, SCOPE, SELECTED_SHARE, STD,
                     Layout)


class ValueStats:
    """Running sums of a family's exported rows (kind, option, value, selected per token or per
    call) over a corpus, per label value, for families without per-token routes."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.n_rows = self.n_tokens = 0
        self.sums: dict[tuple, np.ndarray] = {}  # key -> [n, mean, m2, min, max, n_selected, n_with_selected]
        self.label_rows: dict[tuple[str, str], int] = {}

    def add(self, rows: pd.DataFrame, lengths: Sequence[int], labels: Sequence[Sequence[str]] = ()) -> None:
        """rows: the family's export rows of one batch (batch, position (-1 per call), layer, kind,
        option, value, selected); lengths (B,) real tokens per row: rows at padded positions are
        dropped."""
        lengths = np.asarray(lengths, dtype=np.int64)
        self.n_rows += len(lengths)
        self.n_tokens += int(lengths.sum())
        for c, values in zip(self.layout.label_columns, labels):
            for v in values:
                self.label_rows[(c, v)] = self.label_rows.get((c, v), 0) + 1
        if not len(rows):
            return
        pos = pd.to_numeric(rows[C.POSITION], errors="coerce").fillna(-1).to_numpy(dtype=np.int64)
        b = rows[C.BATCH].to_numpy(dtype=np.int64)
        keep = (pos < 0) | (pos < lengths[b])
        pos, b = pos[keep], b[keep]
        sel = rows[C.SELECTED].to_numpy(dtype=object)[keep]
        df = pd.DataFrame({
            C.LAYER: rows[C.LAYER].to_numpy()[keep], KIND: rows[C.KIND].to_numpy()[keep],
            C.OPTION: pd.to_numeric(rows[C.OPTION], errors="coerce").fillna(-1).to_numpy(dtype=np.int64)[keep],
            SCOPE: np.where(pos < 0, "per call", "per token"),
            C.VALUE: rows[C.VALUE].to_numpy(dtype=np.float64)[keep],
            "_sel": np.array([s is True or s is np.True_ for s in sel], dtype=np.float64),
            "_has_sel": np.array([not (s is None or s is pd.NA) for s in sel], dtype=np.float64)})
        groups = [(ALL, np.full(len(df), ALL, dtype=object))]
        groups += [(c, np.asarray(values, dtype=object)[b]) for c, values in zip(self.layout.label_columns, labels)]
        for column, per_row in groups:
            g = df.assign(_v=per_row).groupby(["_v", C.LAYER, KIND, C.OPTION, SCOPE], sort=False)
            agg = pd.DataFrame({"n": g.size(), "mean": g[C.VALUE].mean(), "m2": g[C.VALUE].var(ddof=0) * g.size(),
                                "lo": g[C.VALUE].min(), "hi": g[C.VALUE].max(), "sel": g["_sel"].sum(),
                                "has": g["_has_sel"].sum()})
            for key, row in zip(agg.index, agg.to_numpy(dtype=np.float64)):
                self._merge((column, *key), row)

    def _merge(self, key: tuple, row: np.ndarray) -> None:
        """Fold one batch's [n, mean, m2, min, max, selected, with selected] into the running ones
        (Chan et al.'s pairwise update: no cancellation for a constant value)."""
        old = self.sums.get(key)
        if old is None:
            self.sums[key] = row.copy()
            return
        n_a, n_b = old[0], row[0]
        n = n_a + n_b
        delta = row[1] - old[1]
        old[2] += row[2] + delta * delta * n_a * n_b / n
        old[1] += delta * n_b / n
        old[0] = n
        old[3], old[4] = min(old[3], row[3]), max(old[4], row[4])
        old[5:] += row[5:]


def call_values(stats: ValueStats) -> pd.DataFrame:
    """Per label column and value (ALL: every row), layer, kind, option and scope (per token / per
    call): rows counted, mean, std (population), min, max of the value and the share of rows where
    the option was selected (NaN where the kind selects nothing)."""
    lay = stats.layout
    labels = dict(zip(lay.layers, lay.labels))
    rows = []
    for (column, value, layer, kind, option, scope), (n, mean, m2, lo, hi, sel, has) in stats.sums.items():
        names = labels.get(layer, ())
        rows.append((column, value, layer, kind, pd.NA if option < 0 else int(option),
                     names[option] if 0 <= option < len(names) else "", scope, int(n), mean,
                     math.sqrt(max(m2, 0.0) / n), lo, hi, sel / has if has else math.nan))
    df = pd.DataFrame(rows, columns=[LABEL_COLUMN, LABEL_VALUE, C.LAYER, KIND, C.OPTION, C.LABEL, SCOPE, N, MEAN, STD,
                                     MIN, MAX, SELECTED_SHARE])
    return df.astype({C.OPTION: "Int64"})
