"""The estimate and the exact sweep together (`ImportanceSettings.method`): which options the sweep
measures exactly, the importance table's `delta_nll_estimate` and `method` columns, per-row effects
for ranking (exact where measured, else the estimate), and how well the estimate ranks on this
model and data (`estimate_agreement`, and a note per layer where it ranks badly).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pandas as pd

from routescope.analysis.reports.importance.estimate import Estimates, estimate
from routescope.analysis.reports.importance.measure import Sums
from routescope.analysis.reports.importance.plan import COLUMNS, ImportanceSettings, Scope, Tokens

AGREEMENT_LOW = 0.5  # Spearman below this in a layer: the note says to measure it exactly
TOP = 10  # top10_recall: of the exact top 10 of a layer, the share the estimate also puts in its top 10
AGREEMENT_COLUMNS = ["layer", "options_measured", "spearman", "top10_recall"]


def estimates_of(model: Any, tokens: Tokens, scope: Scope, settings: ImportanceSettings,
                 progress: Callable[[int, int], None] | None, stop: Callable[[], bool] | None,
                 total: int) -> Estimates | None:
    """The first-order estimates (`estimate` module) unless the method is exact; `progress(done, total)`
    counts the estimate's pass over the rows (the first pass of `total`)."""
    if settings.method == "exact":
        return None
    return estimate(model, tokens, scope, settings.batch_size, stop=stop,
                    progress=(lambda done: progress(done, total)) if progress is not None else None)


def exact_options(scope: Scope, settings: ImportanceSettings, est: Estimates | None, positions: float,
                  draws: list[tuple[str, int, int]]) -> list[tuple[str, int]]:
    """(layer, option) measured exactly, in scope order: every option (exact, or a layer without an
    estimate); with both, the `confirm` largest by |estimate| of each layer and the control's draws
    (measured anyway: the same ablation); with estimate, none."""
    if est is None:
        return [(l, o) for l in scope.layers for o in scope.options[l]]
    mean = est.mean(positions)
    drawn = {(l, o) for l, _, o in draws} if settings.method == "both" else set()
    out = []
    for l in scope.layers:
        if l in est.reasons:
            out += [(l, o) for o in scope.options[l]]
            continue
        top = set()
        if settings.method == "both":
            known = [o for o in scope.options[l] if np.isfinite(mean[(l, o)])]
            top = set(sorted(known, key=lambda o: (-abs(mean[(l, o)]), o))[:settings.confirm])
            top |= {o for o in scope.options[l] if not np.isfinite(mean[(l, o)])}  # no estimate: exact
        out += [(l, o) for o in scope.options[l] if o in top or (l, o) in drawn]
    return out


def full_table(measured: pd.DataFrame, scope: Scope, use: pd.DataFrame, est: Estimates | None,
               positions: float) -> pd.DataFrame:
    """The importance table over every option of `scope` (`COLUMNS`): the exact columns of `measured`
    (rows of the options measured) and NaN elsewhere, usage, `delta_nll_estimate` (NaN without one) and
    `method` (exact, estimate or both: how the row's effect was had)."""
    keys = [(l, o) for l in scope.layers for o in scope.options[l]]
    base = pd.DataFrame(keys, columns=["layer", "option"])
    base["label"] = [scope.labels[l][o] for l, o in keys]
    exact = measured.drop(columns=[c for c in ("label", "usage") if c in measured], errors="ignore")
    t = base.merge(exact, on=["layer", "option"], how="left")
    t = t.merge(use[["layer", "option", "usage"]], on=["layer", "option"], how="left")
    mean = est.mean(positions) if est is not None else {}
    t["delta_nll_estimate"] = [mean.get(k, np.nan) for k in keys]
    has_exact, has_est = t["delta_nll"].notna(), t["delta_nll_estimate"].notna()
    t["method"] = np.where(has_exact & has_est, "both", np.where(has_exact, "exact", "estimate"))
    return t[COLUMNS]


def ranking_sums(table: pd.DataFrame, sums: Sums, index_of: dict[tuple[str, int], int],
                 est: Estimates | None) -> tuple[Sums, list[int]]:
    """Per-row effects of `table`'s rows for ranking (pruning): the exact per-row delta NLL where the
    option was measured, else its estimate; (sums, index of each table row in them)."""
    rows = sums.d_nll.shape[1]
    out = Sums.empty(len(table), rows)
    at = {k: i for i, k in enumerate(est.keys)} if est is not None else {}
    for i, (l, o) in enumerate(zip(table["layer"], table["option"])):
        j = index_of.get((l, int(o)))
        out.d_nll[i] = sums.d_nll[j] if j is not None else est.d_nll[at[(l, int(o))]]
    return out, list(range(len(table)))


def _spearman(a: pd.Series, b: pd.Series) -> float:
    if len(a) < 3 or a.nunique() < 2 or b.nunique() < 2:
        return float("nan")
    return float(a.rank().corr(b.rank()))


def agreement(table: pd.DataFrame) -> pd.DataFrame:
    """`estimate_agreement`: per layer, over the options measured both ways, the Spearman correlation of
    the estimate with the exact delta NLL and the share of the exact top 10 (largest rise of the loss)
    that the estimate's top 10 holds (NaN with 10 or fewer options: it would be 1 by construction)."""
    rows = []
    both = table[table["delta_nll"].notna() & table["delta_nll_estimate"].notna()]
    for l in dict.fromkeys(table["layer"]):
        g = both[both["layer"] == l]
        recall = float("nan")
        if len(g) > TOP:
            top_exact = set(g.nlargest(TOP, "delta_nll")["option"])
            top_est = set(g.nlargest(TOP, "delta_nll_estimate")["option"])
            recall = len(top_exact & top_est) / TOP
        rows.append({"layer": l, "options_measured": len(g),
                     "spearman": _spearman(g["delta_nll_estimate"], g["delta_nll"]), "top10_recall": recall})
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)


def notes_of(est: Estimates | None, agree: pd.DataFrame, settings: ImportanceSettings) -> list[str]:
    """One note per reason layers have no estimate, and one per layer whose estimate ranks badly."""
    if est is None:
        return []
    out = []
    by_reason: dict[str, list[str]] = {}
    for l, why in est.reasons.items():
        by_reason.setdefault(why, []).append(l)
    for why, layers in by_reason.items():
        out.append(f"no first-order estimate for {', '.join(layers)}: {why}"
                   + ("; measured exactly" if settings.method != "exact" else ""))
    for r in agree.itertuples():
        if np.isfinite(r.spearman) and r.spearman < AGREEMENT_LOW:
            out.append(f"{r.layer}: the first-order estimate ranks this layer's experts poorly (Spearman "
                       f"{r.spearman:.2f} with the exact delta NLL over {r.options_measured} options): measure it "
                       f"with --method exact --layers {r.layer}")
    return out
