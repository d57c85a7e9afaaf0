"""Two models' corpus statistics side by side: `comparable` says why they cannot be, `compare_tables`
merges their tables (`reductions`) on their keys with each measure of both and the difference (b - a).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from routescope.analysis.export import columns as C
from routescope.analysis.corpus.stats import (ACCURACY, BY, DEAD, FIRST_SHARE, G2, KIND, LABEL_COLUMN, LABEL_VALUE,
                                              LAYER_A, LAYER_B, LIFT, Layout, MEAN, OVERLOADED, P_B_GIVEN_A, READING,
                                              SCOPE, SELECTED_SHARE, SLOT_SHARE, TOKEN_SHARE)


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
