"""How corpus tables are shown (the app's tables, corpus.html): the dead / overloaded flags first,
compared columns named by checkpoint instead of `_a` / `_b`, and a sentence of help per column.
The files (CSV, Parquet, the page's JSON) keep the tables' own column names; no Streamlit here."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from routescope.analysis.export import columns as C
from routescope.analysis.corpus import stats as S
from routescope.analysis.corpus import compare as CMP

FLAGS = (S.DEAD, S.OVERLOADED)
SIDES = ("a", "b")

HELP: dict[str, str] = {
    C.LAYER: "The routing layer (the model's own name for it).",
    C.OPTION: "The option's index in its layer, from 0 (as in ablation specs).",
    C.LABEL: "The option's name (path, block, expert, ...).",
    S.ROUTED: "Whether a router picks this option (False: it runs for every token, e.g. a shared expert).",
    C.N_TOKENS: "Tokens with a defined route at this layer.",
    S.TOKENS: "Tokens that picked this option anywhere in their top-k.",
    S.TOKEN_SHARE: "Share of the tokens that picked this option anywhere in their top-k (sums to k over options).",
    S.FIRST: "Tokens whose first choice was this option.",
    S.FIRST_SHARE: "Share of first choices taken by this option.",
    S.SLOTS: "Top-k slots this option filled.",
    S.SLOT_SHARE: "Share of the layer's top-k slots this option filled (sums to 1 over options).",
    S.UNIFORM: "The share each option would get if routing were uniform: 1 / number of routed options.",
    S.DEAD: f"Dead: its slot share is under {S.DEAD_FRACTION:.0%} of the uniform share.",
    S.OVERLOADED: f"Overloaded: its slot share is over {S.OVERLOAD_FACTOR:g} times the uniform share.",
    S.LABEL_COLUMN: "The dataset's label column.",
    S.LABEL_VALUE: "The label's value (\"(all)\": every mapped value together).",
    S.READING: "token: every token; last token: each row's last real token (how a probe prompt's route is read).",
    C.COUNT: "How many tokens (or rows) this row counts.",
    S.N: "The number this row's share is out of.",
    C.SHARE: "count / n.",
    S.INTENDED: "The option the label value should take (0-based).",
    C.CORRECT: "Routes that took the intended option.",
    S.ACCURACY: "correct / n: the share of routes taking the intended option.",
    S.BY: "input: the token routed; predicted: the model's next token at that position.",
    S.RANK: "The token's rank for this option, by G2 (0: most over-represented).",
    C.TOKEN_ID: "The token's id in the tokenizer.",
    C.TOKEN: "The token's text (whitespace made visible).",
    S.TOKEN_COUNT: "How often the token occurs over the corpus.",
    S.OF_TOKEN: "Share of the token's occurrences routed to this option.",
    S.OPTION_SHARE: "Share of all tokens routed to this option.",
    S.LIFT: "share_of_token / option_share: over 1, the token goes to this option more than the average token.",
    S.G2: "Dunning's log-likelihood ratio G2 of token vs option (higher: less likely by chance).",
    S.P_VALUE: "The chi-square (1 dof) p-value of G2.",
    S.LAYER_A: "The earlier layer of the pair.",
    C.OPTION_A: "The option taken at the earlier layer.",
    S.LABEL_A: "Its name.",
    S.LAYER_B: "The later layer of the pair.",
    C.OPTION_B: "The option taken at the later layer.",
    S.LABEL_B: "Its name.",
    S.P_B_GIVEN_A: "P(option_b at the later layer | option_a at the earlier layer).",
    S.KIND: "The value the family exports (weight, scale, share, gate, ...).",
    S.SCOPE: "per call: one value per prompt; per token: one per token.",
    S.MEAN: "Mean of the value.",
    S.STD: "Its standard deviation.",
    S.MIN: "Its smallest value.",
    S.MAX: "Its largest value.",
    S.SELECTED_SHARE: "Share of rows where this option was the selected (largest) one.",
}


ROW_NAMES = (C.LAYER, C.OPTION, C.LABEL)  # what a utilisation row is about: kept before its flags


def flags_first(df: pd.DataFrame) -> pd.DataFrame:
    """The dead / overloaded columns (either model's, in a comparison) first, after only the columns
    naming the row (layer, option, label), where a wide table cannot push them off-screen."""
    flags = [c for f in FLAGS for c in df.columns if c == f or (isinstance(c, str) and c.startswith(f + " ("))]
    names = [c for c in ROW_NAMES if c in df.columns] if flags else []
    front = names + flags
    return df[front + [c for c in df.columns if c not in front]]  # a new frame, also without flags


def compare_names(columns: Sequence[str], measures: Sequence[str], names: tuple[str, str]) -> dict[str, str]:
    """`<m>_a`, `<m>_b`, `<m>_diff` of a compared table (`corpus.compare_tables`) as
    "<m> (checkpoint a)", "<m> (checkpoint b)", "<m> (b − a)"; key columns keep their names."""
    a, b = names
    out = {}
    for m in measures:
        for suffix, shown in (("_a", a), ("_b", b), ("_diff", f"{b} − {a}")):
            if f"{m}{suffix}" in columns:
                out[f"{m}{suffix}"] = f"{m} ({shown})"
    return out


def shown_compare(df: pd.DataFrame, table: str, names: tuple[str, str]) -> pd.DataFrame:
    """A compared table as the app and corpus.html show it: columns named by checkpoint, flags first,
    and each column's help in `attrs["help"]`. Two checkpoints of one name become "<name> (A)" and "(B)"."""
    if names[0] == names[1]:
        names = (f"{names[0]} (A)", f"{names[1]} (B)")
    keys, measures, flags = CMP.COMPARE_KEYS.get(table, ([], [], []))
    renamed = compare_names(list(df.columns), [*measures, *flags], names)
    out = flags_first(df.rename(columns=renamed))
    a, b = names
    side = {f"{m}{s}": w for m in [*measures, *flags] for s, w in (("_a", a), ("_b", b))}
    helps = {}
    for old, new in renamed.items():
        m = next(x for x in [*measures, *flags] if old.startswith(x + "_") and old[len(x):] in ("_a", "_b", "_diff"))
        what = HELP.get(m, m)
        helps[new] = f"{what} Of {side[old]}." if old in side else f"{b} minus {a}: {what[0].lower()}{what[1:]}"
    out.attrs = {**out.attrs, "help": {**{c: HELP[c] for c in out.columns if c in HELP}, **helps}}
    return out


def named_compared(compared: Mapping[str, pd.DataFrame], names: tuple[str, str]) -> dict[str, pd.DataFrame]:
    """Compared tables as they are written (CLI files, app downloads) and shown: each measure's columns
    named by the checkpoint they come from, so a CSV read on its own says which model is which."""
    return {name: shown_compare(df, name, names) for name, df in compared.items()}


def shown_table(df: pd.DataFrame) -> pd.DataFrame:
    """A corpus table as shown: flags first, each column's help in `attrs["help"]`."""
    out = flags_first(df)
    out.attrs = {**out.attrs, "help": {c: HELP[c] for c in out.columns if c in HELP}}
    return out


def column_help(df: pd.DataFrame) -> Mapping[str, str]:
    return df.attrs.get("help", {})
