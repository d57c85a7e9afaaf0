"""Merging against pruning: the N least important experts of each layer merged into their most similar
kept expert (M-SMoE, Li et al. 2024) instead of dropped, both judged on the held-out rows.

- Similarity of a merged expert d and a kept expert t: the mean over the tokens routed to d (in the
  ranking rows; over every token of those rows where d got none) of the cosine of their outputs,
  each expert run alone on the token's input to the experts module (`HFModel.every_expert_output`).
- The merge: t's weights become the usage-weighted mean of t's and those of every expert merged into
  it (usage: top-k slots over the ranking rows), every tensor of the experts module alike
  (`HFModel.merged_copy`); d's router row is dropped, so its tokens go to their next choice.
- The curve (`merge_curve`): per N, the held-out loss with the N experts pruned (the same ablation as
  the pruning curve's causal line) and with them merged, and which expert went into which.

The ranking is the pruning curve's causal one (ranking rows); the similarity and usage come from the
same ranking rows, so the held-out rows judge both strategies unseen.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from routescope.analysis.corpus.run import Stopped
from routescope.analysis.reports.importance.measure import Sums
from routescope.analysis.reports.importance.plan import ImportanceSettings, Tokens, batches, pruning_ablation


TOKEN_CHUNK = 256  # tokens whose [experts x experts] cosines are taken at once


@dataclass
class MergeStats:
    """Per routing layer: `usage` [n] top-k slots of each expert over the real tokens, `similarity`
    [n, n] (row d, column t) the mean cosine of d's and t's outputs over the tokens routed to d (over
    every token where d got none)."""

    usage: dict[str, np.ndarray]
    similarity: dict[str, np.ndarray]


def merge_problem(model: Any, n: int) -> str | None:
    """Why this model's experts cannot be merged N at a time (None: they can)."""
    if not hasattr(model, "merged_copy"):
        return f"merging averages transformers expert weights: {model.config.label} is not a Hugging Face model"
    return model.merge_problem(n)


def merge_stats(model: Any, tokens: Tokens, settings: ImportanceSettings,
                stop: Callable[[], bool] | None = None, progress: Callable[[int], None] | None = None) -> MergeStats:
    """Usage and output similarity of every expert pair per layer over `tokens` (unablated forwards of
    batches, each layer's experts run on its captured input); `stop()` True ends with `Stopped`;
    `progress(rows done)` after each batch."""
    pad = max(0, int(getattr(model.config, "pad_id", 0)))
    n = {l: m.n_experts for l, m in model.routing_modules.items()}
    use = {l: np.zeros(n[l]) for l in n}
    on_d = {l: np.zeros((n[l], n[l])) for l in n}
    on_all = {l: np.zeros((n[l], n[l])) for l in n}
    total, done = 0, 0
    with torch.inference_mode():
        for rows, x, lengths in batches(tokens, settings.batch_size, pad):
            if stop is not None and stop():
                raise Stopped()
            prefix = model.capture(x.to(model.device))
            for l in n:
                hidden, idx, _ = prefix.experts[l]
                h = hidden.reshape(-1, hidden.shape[-1])
                T = h.shape[0] // len(lengths)
                real = (torch.arange(T)[None, :] < lengths[:, None]).reshape(-1).to(h.device)
                h, idx = h[real], idx.reshape(h.shape[0], -1)[real].long()
                for s in range(0, h.shape[0], TOKEN_CHUNK):
                    y = model.every_expert_output(l, h[s:s + TOKEN_CHUNK]).double()
                    y = torch.nn.functional.normalize(y, dim=-1)
                    cos = y @ y.transpose(1, 2)  # [tokens, n, n]
                    part = idx[s:s + TOKEN_CHUNK]
                    routed = torch.zeros(part.shape[0], n[l], dtype=torch.float64, device=cos.device)
                    ok = (part >= 0) & (part < n[l])  # -1 / n: an empty slot some routers leave
                    routed.scatter_add_(1, part.clamp(0, n[l] - 1), ok.double())
                    use[l] += routed.sum(0).cpu().numpy()
                    on_d[l] += torch.einsum("td,tde->de", (routed > 0).double(), cos).cpu().numpy()
                    on_all[l] += cos.sum(0).cpu().numpy()
            total += int(lengths.sum())
            done += len(rows)
            if progress is not None:
                progress(done)
    sim = {}
    for l in n:
        sim[l] = np.where(use[l][:, None] > 0, on_d[l] / np.maximum(use[l][:, None], 1), on_all[l] / max(total, 1))
    return MergeStats(use, sim)


def merge_plan(stats: MergeStats, order: dict[str, list[int]], n: int) -> dict[str, dict[int, int]]:
    """layer -> {merged expert: the kept expert it goes into}: the first `n` of each layer's `order`
    (least important first), each into the kept expert of highest similarity (ties: the lower id)."""
    plan = {}
    for l, os_ in order.items():
        gone, kept = os_[:n], sorted(set(range(len(stats.usage[l]))) - set(os_[:n]))
        plan[l] = {int(d): int(kept[int(np.argmax(stats.similarity[l][d, kept]))]) for d in gone}
    return plan


def merge_curve(measure: Callable[..., Sums], model: Any, tokens: Tokens, order: dict[str, list[int]],
                stats: MergeStats, ns: list[int], progress: Callable[[float, int], None] | None = None,
                done_before: int = 0, total: int | None = None, **measure_kw: Any) -> tuple[pd.DataFrame, dict]:
    """(`merge_curve` table, the plans by N): per N of `ns`, the mean next-token NLL over `tokens` (the
    held-out rows) with the N experts of `order` pruned and with them merged (`merge_plan`);
    `measure(model, tokens, ablations, **measure_kw)` as the sweep measures. `progress(rows done,
    total)`: from `done_before`, one pass over `tokens` for the pruned runs, then one per merged model."""
    n_pos, R = tokens.positions.sum(), len(tokens.ids)
    with torch.inference_mode():
        prune = measure(model, tokens, [pruning_ablation(order, n) for n in ns], progress=progress,
                        done_before=done_before, total=total, **measure_kw)
    base = float(prune.base_nll.sum() / n_pos)
    rows = [{"strategy": s, "n_removed": 0, "loss": base, "delta_loss": 0.0, "merged": ""}
            for s in ("prune", "merge")]
    plans = {}
    for j, n in enumerate(ns):
        plans[n] = plan = merge_plan(stats, order, n)
        loss = float((prune.base_nll.sum() + prune.d_nll[j].sum()) / n_pos)
        rows.append({"strategy": "prune", "n_removed": n, "loss": loss, "delta_loss": loss - base, "merged": ""})
        with torch.no_grad():  # a new model: built outside inference mode, run inside it
            merged = model.merged_copy(plan, {l: stats.usage[l] for l in plan})
        with torch.inference_mode():
            s = measure(merged, tokens, [pruning_ablation(order, n)], progress=progress,
                        done_before=done_before + R * (j + 1), total=total, **measure_kw)
        loss = float((s.base_nll.sum() + s.d_nll[0].sum()) / n_pos)
        rows.append({"strategy": "merge", "n_removed": n, "loss": loss, "delta_loss": loss - base,
                     "merged": ", ".join(f"{l}:{d}->{t}" for l, p in plan.items() for d, t in p.items())})
        del merged
    table = pd.DataFrame(rows)
    table = table.sort_values(["strategy", "n_removed"], key=lambda c: c.map({"prune": 0, "merge": 1}) if
                              c.name == "strategy" else c, kind="stable").reset_index(drop=True)
    return table.assign(evaluated_on="heldout", rows=len(tokens.ids)), plans
