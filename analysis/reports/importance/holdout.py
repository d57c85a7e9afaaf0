"""Pruning judged on held-out rows: the dataset's rows split in two (seeded), the experts ranked by their
effect on one part (the ranking rows) and the pruning curve measured on the other (the held-out rows).

Ranking and judging on the same rows makes noise look like gain: the experts whose dropping happened
to lower the loss on those rows are dropped first, so the in-sample curve can fall below the unpruned
loss (issue 40: on a 20-row dataset dropping 4 experts per layer "improved" 6.85 to 6.58). The
`importance` table stays measured over every row; the ranking for pruning is read from the same
per-row sums (`Sums.d_nll[ablation, row]`) restricted to the ranking rows, so nothing is measured
twice. The curve can also be measured on the ranking rows, labelled in-sample (optimistic).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from routescope.analysis.reports.importance.measure import Sums
from routescope.analysis.reports.importance.plan import (ImportanceSettings, Scope, Tokens, pruning_ablation,
                                                         ranked)


MIN_ROWS = 20  # below this a split leaves too few rows on either side to say anything
HELDOUT, IN_SAMPLE = "heldout", "in-sample"
IN_SAMPLE_LABEL = "in-sample (optimistic)"  # how a page or view names the in-sample curve


@dataclass(frozen=True)
class Split:
    """Row indices (into the sweep's token rows, sorted) that rank the experts and that judge pruning."""

    ranking: np.ndarray
    heldout: np.ndarray
    fraction: float
    seed: int


def split_rows(n_rows: int, fraction: float, seed: int) -> Split:
    """A seeded split of `n_rows` rows: round(fraction * n_rows) held out (at least one on each side),
    the rest ranking; ValueError (one line) under `MIN_ROWS` rows."""
    if n_rows < MIN_ROWS:
        raise ValueError(f"{n_rows} rows: a held-out pruning curve needs at least {MIN_ROWS} rows to split into "
                         "ranking and held-out rows")
    k = min(n_rows - 1, max(1, round(fraction * n_rows)))
    perm = np.random.default_rng([seed, 40]).permutation(n_rows)  # its own stream: not the bootstrap's
    return Split(np.sort(perm[k:]), np.sort(perm[:k]), fraction, seed)


def split_of(n_rows: int, settings: ImportanceSettings) -> tuple[Split | None, str | None]:
    """(the split, None), or (None, why) where the rows are too few."""
    try:
        return split_rows(n_rows, settings.holdout, settings.seed), None
    except ValueError as e:
        return None, f"no held-out pruning curve: {e}"


def subset(tokens: Tokens, rows: Sequence[int]) -> Tokens:
    """The token rows `rows` (indices, in that order)."""
    return Tokens([tokens.row_ids[r] for r in rows], [tokens.ids[r] for r in rows])


def ranking_effects(table: pd.DataFrame, per_row: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> pd.DataFrame:
    """`table`'s (layer, option) rows with `delta_nll` over the rows `rows` only: the sum of their per-row
    delta NLL (`per_row` [table rows, dataset rows], e.g. `Sums.d_nll` of each option's ablation) over
    their predicted positions."""
    d = np.asarray(per_row)[:, rows].sum(1) / positions[rows].sum()
    return table[["layer", "option"]].reset_index(drop=True).assign(delta_nll=d)


def orders(rank_effects: pd.DataFrame, rank_usage: pd.DataFrame, scope: Scope, settings: ImportanceSettings
           ) -> dict[tuple[str, int], dict[str, list[int]]]:
    """(ranking, draw) -> each layer's routed options, least important first: by causal effect and by
    usage (both over the ranking rows), and `prune_draws` seeded random permutations."""
    rng = np.random.default_rng(settings.seed + 1)
    out = {("causal", 0): ranked(rank_effects, scope, "delta_nll"),
           ("usage", 0): ranked(rank_usage.fillna(0), scope, "usage")}
    for d in range(settings.prune_draws):
        out[("random", d)] = {l: [int(o) for o in rng.permutation(scope.routed[l])] for l in scope.layers}
    return out


def pruning_tables(measure: Callable[..., Sums], model: Any, tokens: Tokens, scope: Scope,
                   order_of: dict[tuple[str, int], dict[str, list[int]]], prune_n: list[int],
                   parts: list[tuple[str, np.ndarray]], **measure_kw: Any) -> dict[str, pd.DataFrame]:
    """The pruning tables: per ranking (causal, usage, random draws), N and part (`parts`: (evaluated_on,
    row indices)), the mean next-token NLL over those rows with the N least important routed experts of
    every layer dropped at once, and the curve of their means (95% band over random draws).
    `measure(model, tokens, ablations, **measure_kw)`: the sweep's measuring (cache, Ray, progress);
    only the rows of `parts` are measured."""
    ablations: dict[Any, int] = {}
    plan = []
    for (ranking, d), order in order_of.items():
        for n in prune_n:
            ab = pruning_ablation(order, n)
            if n:
                ablations.setdefault(ab, len(ablations))
            plan.append((ranking, n, d, ab, ", ".join(f"{l}:{o}" for l, os_ in order.items() for o in os_[:n])))
    rows = sorted({int(r) for _, rs in parts for r in rs})
    at = {r: i for i, r in enumerate(rows)}
    sums = measure(model, subset(tokens, rows), list(ablations), **measure_kw)
    out, base_of = [], {}
    for evaluated_on, part in parts:
        idx = np.array([at[int(r)] for r in part])
        n_pos = tokens.positions[np.asarray(part)].sum()
        base_of[evaluated_on] = base = float(sums.base_nll[idx].sum() / n_pos)
        for ranking, n, d, ab, dropped in plan:
            delta = float(sums.d_nll[ablations[ab]][idx].sum() / n_pos) if n else 0.0
            out.append({"ranking": ranking, "n_pruned": n, "draw": d, "loss": base + delta, "delta_loss": delta,
                        "dropped": dropped, "evaluated_on": evaluated_on, "rows": len(part)})
    pr = pd.DataFrame(out)
    curve = pr.groupby(["evaluated_on", "ranking", "n_pruned"], sort=False).agg(
        loss=("loss", "mean"), loss_low=("loss", lambda v: np.percentile(v, 2.5)),
        loss_high=("loss", lambda v: np.percentile(v, 97.5)), draws=("loss", "count"),
        rows=("rows", "first")).reset_index()
    curve["delta_loss"] = curve["loss"] - curve["evaluated_on"].map(base_of)
    curve = curve[["ranking", "n_pruned", "loss", "loss_low", "loss_high", "draws", "delta_loss", "evaluated_on",
                   "rows"]]
    return {"pruning": pr, "pruning_curve": curve}


def parts_of(split: Split | None, n_rows: int, in_sample: bool) -> list[tuple[str, np.ndarray]]:
    """(evaluated_on, rows) the curve is measured on: the held-out rows where there is a split, and the
    ranking rows (every row without a split) when the in-sample curve is asked for."""
    parts = [(HELDOUT, split.heldout)] if split is not None else []
    if in_sample:
        parts.append((IN_SAMPLE, split.ranking if split is not None else np.arange(n_rows)))
    return parts


def provenance(split: Split | None, tokens: Tokens, causal: dict[str, list[int]] | None,
               effects: pd.DataFrame | None = None) -> dict:
    """What the pruning curve, a pruned or merged checkpoint's card and `pruning.json` say about the
    split: the share held out, the seed, the rows (by row id) on each side, the causal order and the
    effects it sorts (`ranking_effects`: delta NLL over the ranking rows, layer -> option -> value)."""
    if split is None:
        return {"heldout": None}
    return {"heldout": split.fraction, "seed": split.seed,
            "ranking_rows": len(split.ranking), "heldout_rows": len(split.heldout),
            "ranking_positions": int(tokens.positions[split.ranking].sum()),
            "heldout_positions": int(tokens.positions[split.heldout].sum()),
            "ranked_on": [tokens.row_ids[r] for r in split.ranking],
            "evaluated_on": [tokens.row_ids[r] for r in split.heldout],
            "causal_order": causal,
            "ranking_delta_nll": None if effects is None else
            {l: {str(int(o)): float(d) for o, d in zip(g["option"], g["delta_nll"])}
             for l, g in effects.groupby("layer", sort=False)}}
