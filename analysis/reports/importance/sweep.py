"""The whole expert-importance sweep (package doc): the dataset measured under every ablation, with the
cache and on Ray where asked, then the importance, control, proxy and pruning tables.
"""
from __future__ import annotations

import time
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch

from routescope.core_models.ablation import Ablation

from routescope.analysis.inputs.datasets import CorpusData
from routescope.analysis.reports.importance.cache import cache_key, load_cache, save_cache
from routescope.analysis.reports.importance.holdout import (Split, orders, parts_of, pruning_tables,
                                                            ranking_effects, split_of, subset)
from routescope.analysis.reports.importance.holdout import provenance as holdout_provenance
from routescope.analysis.reports.importance.merge import merge_curve, merge_problem, merge_stats
from routescope.analysis.reports.importance.measure import (Sums, Usage, measure_batch, per_forward_default,
                                                            resume_agrees, reuse_agrees)
from routescope.analysis.reports.importance.plan import (ImportanceResult, ImportanceSettings, Scope, Tokens,
                                                         batches, control_draws, drop, prune_range, pruning_ablation,
                                                         scope_of, tokens_of)
from routescope.analysis.reports.importance.ray_workers import RaySpec, on_ray
from routescope.analysis.reports.importance import methods as M


PHASES = {"estimate": "Estimating every expert (one forward and backward a batch)",
          "exact": "Dropping experts one at a time",
          "prune": "Pruning curve on the held-out rows",
          "merge": "Merging experts, then the held-out rows again"}


def measure(model: Any, tokens: Tokens, ablations: Sequence[Ablation], settings: ImportanceSettings, *,
            fast: bool, progress: Callable[[int, int], None] | None = None, stop: Callable[[], bool] | None = None,
            on_prefix: Callable[[Any, Any], None] | None = None, cache: Path | None = None,
            key: str = "", done_before: int = 0, total: int | None = None, ray: RaySpec | None = None,
            reuse: bool = False) -> Sums:
    """Per-row sums of every ablation's effects over the dataset (package doc); with `cache`, rows
    measured by an earlier (interrupted) call with the same `key` are not measured again. `ray`: the
    batches are measured by Ray actors (`on_ray`) instead of here, with the same cache, progress and
    stop; `on_prefix` is then not called. `reuse`: `measure_batch`'s (prefix reuse answering the
    ablated layer's experts call from the captured experts outputs)."""
    pad = max(0, int(getattr(model.config, "pad_id", 0)))
    sums = load_cache(cache, key, len(ablations), len(tokens.ids))
    todo = [b for b in batches(tokens, settings.batch_size, pad) if not sums.done[b[0]].all()]
    total = total if total is not None else len(tokens.ids)
    done = done_before + int(sums.done.sum())
    if ray is not None:
        results = on_ray(ray, todo, ablations, settings, fast, stop, reuse) if ablations and todo else iter(())
        if not ablations:
            sums.done[:] = True
    else:
        # within a batch, progress in fractions of its rows (one report per forward: `measure_batch`)
        results = ((rows, *measure_batch(model, x, lengths, ablations, settings, fast, stop, on_prefix,
                                         tick=None if progress is None else
                                         lambda i, n, r=len(rows): progress(done + r * i / n, total), reuse=reuse))
                   for rows, x, lengths in todo)
    saved = time.monotonic()
    try:
        for rows, base, effects in results:
            sums.base_nll[rows] = base
            for j, (d, k, f) in enumerate(effects):
                sums.d_nll[j, rows], sums.kl[j, rows], sums.flips[j, rows] = d, k, f
            sums.done[rows] = True
            done += len(rows)
            if progress is not None:
                progress(done, total)
            if cache is not None and time.monotonic() - saved > 5:
                save_cache(cache, key, sums)
                saved = time.monotonic()
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()  # Ray: its actors and the cluster it started end here
        if cache is not None and sums.done.any():
            save_cache(cache, key, sums)  # whole or not at all (temporary renamed)
    return sums


# --- tables ------------------------------------------------------------------------------------------------

def bootstrap_weights(n_rows: int, draws: int, seed: int) -> np.ndarray:
    """[draws, rows] counts of each row in each resample of the rows (with replacement), seeded."""
    return np.random.default_rng(seed).multinomial(n_rows, np.full(n_rows, 1.0 / n_rows), size=draws).astype(float)


def ratio_interval(values: np.ndarray, positions: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """95% percentile bootstrap interval of sum(values) / sum(positions) over rows, per row of `values`."""
    stats = (weights @ values.T) / np.maximum(weights @ positions, 1e-300)[:, None]
    return np.percentile(stats, 2.5, axis=0), np.percentile(stats, 97.5, axis=0)


def effect_table(sums: Sums, index: Sequence[int], positions: np.ndarray, weights: np.ndarray) -> pd.DataFrame:
    """Per ablation in `index`: token-weighted mean delta NLL with its bootstrap interval, KL and flip rate."""
    n = positions.sum()
    d, kl, fl = sums.d_nll[list(index)], sums.kl[list(index)], sums.flips[list(index)]
    low, high = ratio_interval(d, positions, weights)
    return pd.DataFrame({"delta_nll": d.sum(1) / n, "delta_nll_low": low, "delta_nll_high": high,
                         "kl": kl.sum(1) / n, "flip_rate": fl.sum(1) / n})


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Rank correlation of two columns over rows where both are known; NaN with under 3 or no spread."""
    ok = a.notna() & b.notna()
    if ok.sum() < 3 or a[ok].nunique() < 2 or b[ok].nunique() < 2:
        return float("nan")
    return float(a[ok].rank().corr(b[ok].rank()))


def outside_control(importance: pd.DataFrame, control_summary: pd.DataFrame) -> pd.Series:
    """True where an effect's interval lies wholly above (or below) its layer's control interval."""
    c = importance[["layer"]].merge(control_summary, on="layer", how="left")
    return pd.Series((importance["delta_nll_low"].to_numpy() > c["control_high"].to_numpy())
                     | (importance["delta_nll_high"].to_numpy() < c["control_low"].to_numpy()), index=importance.index)


# --- the whole sweep ---------------------------------------------------------------------------------------

def float32_copy(model: Any) -> Any:
    """`model` itself when its parameters are float32, else the family's float32 copy."""
    return model.float32_copy()


def importance(model: Any, tokenizer: Any, data: CorpusData, settings: ImportanceSettings = ImportanceSettings(), *,
               name: str = "model", weights_sha256: str | None = None, cache_dir: Path | None = None,
               progress: Callable[[int, int], None] | None = None,
               stop: Callable[[], bool] | None = None, engine: str = "local", checkpoint: str | Path | None = None,
               workers: int = 2, phase: Callable[[str], None] | None = None) -> ImportanceResult:
    """Every table of the sweep (package doc): importance, control, control_summary, proxies,
    proxy_agreement, pruning, pruning_curve. `progress(done, total)` counts rows x passes (a batch's rows
    in fractions as its forwards finish); `stop()`
    True ends with `corpus_run.Stopped`; `cache_dir` keeps measured rows so a rerun resumes.
    `engine="ray"`: the batches of rows are measured by `workers` Ray actors, each loading
    `checkpoint` itself (`on_ray`), with the same cache, progress and stop as one process and the
    same numbers. `phase(what)` as each pass starts (`PHASES`'s texts): what the progress counts now."""
    say = phase if phase is not None else (lambda what: None)
    if engine not in ("local", "ray"):
        raise ValueError(f"engine {engine!r}: use local or ray")
    if engine == "ray" and checkpoint is None:
        raise ValueError("engine ray: the workers load the checkpoint: give its directory")
    t0 = time.perf_counter()
    scope = scope_of(model, settings.layers, settings.options)
    notes: list[str] = []
    run_model = float32_copy(model) if settings.float32 else model
    if run_model is not model:
        notes.append(f"effects measured on a float32 copy of the model (it runs in "
                     f"{next(model.parameters()).dtype})".replace("torch.", ""))
    tokens = tokens_of(data, tokenizer, model.context, settings.max_tokens)
    fast = settings.sweep == "fast" and run_model.can_resume
    if settings.sweep == "fast" and not fast:
        notes.append(f"{model.config.label}: no prefix reuse for this family: one forward per ablation")
    if fast:
        fast = resume_agrees(run_model, tokens, settings)
        if not fast:
            notes.append("a forward restarted at a routing layer did not reproduce the plain forward on this model: "
                         "one full forward per ablation instead")
    reuse = fast and reuse_agrees(run_model, tokens, settings)
    if fast and not reuse:
        notes.append("the ablated layer runs all its experts again: answering its experts call from the captured "
                     "experts outputs did not reproduce it on this model")

    draws = control_draws(scope, settings.control_draws, settings.seed) if settings.method != "estimate" else []
    n_est = len(tokens.ids) if settings.method != "exact" else 0  # the estimate's pass over the rows
    prune_n = prune_range(scope, settings)
    split, why = split_of(len(tokens.ids), settings)  # pruning and merging judged on held-out rows (`holdout`)
    parts = parts_of(split, len(tokens.ids), settings.in_sample_curve)
    if why and (prune_n or settings.merge_max):
        notes.append(why)
    prune_n = prune_n if parts else []
    prune_rows = len({int(r) for _, rs in parts for r in rs}) if prune_n else 0
    merging = bool(settings.merge_max and split is not None and merge_problem(run_model, settings.merge_max) is None
                   and prune_range(scope, replace(settings, prune_max=None)))  # as `_judged` decides
    merge_rows = len(split.ranking) + len(split.heldout) * (1 + settings.merge_max) if merging else 0
    total = n_est + len(tokens.ids) + prune_rows + merge_rows
    t_est = time.perf_counter()
    if settings.method != "exact":
        say(PHASES["estimate"])
    est = M.estimates_of(run_model, tokens, scope, settings, progress, stop, total)
    t_est = time.perf_counter() - t_est
    singles = M.exact_options(scope, settings, est, tokens.positions.sum(), draws)
    ablations: dict[Ablation, int] = {}
    for ab in [drop(p) for p in singles] + [drop((l, o)) for l, _, o in draws]:
        ablations.setdefault(ab, len(ablations))
    usage = Usage(run_model, scope)
    key_parts = {"weights": weights_sha256, "data": data.digest, "model": model.config.label,
                 "settings": {k: v for k, v in asdict(settings).items()
                              if k not in ("method", "sweep", "confirm", "holdout", "in_sample_curve",
                                           "merge_max")}}
    key = cache_key({**key_parts, "ablations": [a.describe() for a in ablations]})
    cache = cache_dir / f"effects-{key}.safetensors" if cache_dir is not None and weights_sha256 else None
    usage_done: list[bool] = []

    def on_prefix(prefix: Any, lengths: torch.Tensor) -> None:
        usage.add(prefix, lengths)
        usage_done.append(True)

    ray = RaySpec(checkpoint, workers, str(next(run_model.parameters()).dtype).removeprefix("torch.")) \
        if engine == "ray" else None
    say(PHASES["exact"])
    with torch.inference_mode():
        sums = measure(run_model, tokens, list(ablations), settings, fast=fast, progress=progress, stop=stop,
                       on_prefix=on_prefix, cache=cache, key=key, total=total, ray=ray, done_before=n_est,
                       reuse=reuse)
        if len(usage_done) < len(batches(tokens, settings.batch_size, 0)):
            # rows measured before an interruption, or by Ray workers: usage and REAP counted here by one plain pass
            usage = Usage(run_model, scope)
            measure(run_model, tokens, [], settings, fast=fast, on_prefix=lambda p, n: usage.add(p, n))
    positions = tokens.positions
    weights = bootstrap_weights(len(tokens.ids), settings.bootstrap, settings.seed)
    labels = scope.labels
    use = usage.table()

    imp = pd.DataFrame(singles, columns=["layer", "option"])
    imp.insert(2, "label", [labels[l][o] for l, o in singles])
    eff = effect_table(sums, [ablations[drop(p)] for p in singles], positions, weights)
    imp = M.full_table(pd.concat([imp, eff], axis=1), scope, use, est, positions.sum())

    ctl = pd.DataFrame(draws, columns=["layer", "draw", "option"])
    ctl.insert(0, "kind", "control")
    ctl["label"] = [labels[l][o] for l, _, o in draws]
    if len(ctl):
        ceff = effect_table(sums, [ablations[drop((l, o))] for l, _, o in draws], positions, weights)
        ctl = pd.concat([ctl, ceff[["delta_nll", "delta_nll_low", "delta_nll_high"]]], axis=1)
        csum = ctl.groupby("layer", sort=False)["delta_nll"].agg(
            draws="count", control_mean="mean", control_low=lambda v: np.percentile(v, 2.5),
            control_high=lambda v: np.percentile(v, 97.5)).reset_index()
    else:
        ctl = ctl.assign(delta_nll=[], delta_nll_low=[], delta_nll_high=[])
        csum = pd.DataFrame(columns=["layer", "draws", "control_mean", "control_low", "control_high"])
    csum.insert(0, "kind", "control")

    prox = imp[["layer", "option", "label", "delta_nll"]].merge(use, on=["layer", "option"], how="left")
    agree = pd.DataFrame([{"layer": l, "proxy": p, "spearman": spearman(g[p], g["delta_nll"]),
                           "options": int(g[p].notna().sum())}
                          for l, g in prox.groupby("layer", sort=False) for p in ("usage", "gate_usage", "reap")])
    n = positions.sum()
    base_loss = float(sums.base_nll.sum() / n)
    tables = {"importance": imp, "control": ctl, "control_summary": csum, "proxies": prox, "proxy_agreement": agree}
    if est is not None:
        tables["estimate_agreement"] = M.agreement(imp)
        notes += M.notes_of(est, tables["estimate_agreement"], settings)
    rank_sums, rank_index = M.ranking_sums(imp, sums, {p: ablations[drop(p)] for p in singles}, est)
    judged = _judged(run_model, tokens, scope, imp, rank_sums, rank_index, split, parts,
                     prune_n, settings, fast, tables, notes, progress=progress, stop=stop,
                     done_before=n_est + len(tokens.ids), merge_before=n_est + len(tokens.ids) + prune_rows,
                     total=total, cache=cache_dir if cache is not None else None, key_parts=key_parts, ray=ray,
                     say=say)
    prov = {"model": name, "family": model.config.family, "label": model.config.label,
            "weights_sha256": weights_sha256, "dataset": data.name, "dataset_sha256": data.digest,
            "rows": len(tokens.ids), "tokens": int(sum(len(x) for x in tokens.ids)),
            "predicted_positions": int(n), "base_loss": base_loss,
            "effects_dtype": str(next(run_model.parameters()).dtype).removeprefix("torch."),
            "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "method": (f"prefix reuse, {settings.ablations_per_forward or per_forward_default(run_model.device)} "
                       "ablation(s) per forward") if fast else "one full forward per ablation",
            "experts_outputs_reused": reuse,
            "estimate_seconds": round(t_est, 3) if est is not None else None,
            "exact_options": len(singles), "settings": asdict(settings), "holdout": judged,
            "seconds": round(time.perf_counter() - t0, 3),
            "routescope": _version()}
    return ImportanceResult(tables, prov, notes)


def _version() -> str:
    try:
        return metadata.version("routescope")
    except metadata.PackageNotFoundError:
        return "unknown"


def _judged(model: Any, tokens: Tokens, scope: Scope, imp: pd.DataFrame, sums: Sums, index: list[int],
            split: Split | None, parts: list, prune_n: list[int], settings: ImportanceSettings, fast: bool,
            tables: dict[str, pd.DataFrame], notes: list[str], *, progress, stop, done_before, merge_before, total,
            cache, key_parts, ray: RaySpec | None, say: Callable[[str], None]) -> dict:
    """Pruning and merging, ranked on the ranking rows and judged on the held-out rows (`holdout`,
    `merge`): the pruning and merge_curve tables added to `tables`, why not to `notes`; the split's
    provenance."""
    if not prune_n and not settings.merge_max:
        return holdout_provenance(split, tokens, None)
    if not prune_range(scope, replace(settings, prune_max=None)):
        if settings.prune_max != 0 or settings.merge_max:
            notes.append("no pruning curve: it needs every routed option of each layer measured (no --options)")
        return holdout_provenance(None, tokens, None)
    rank_rows = split.ranking if split is not None else np.arange(len(tokens.ids))
    with torch.inference_mode():
        rank_use = Usage(model, scope)  # usage over the ranking rows only (one plain pass over them)
        measure(model, subset(tokens, rank_rows), [], settings, fast=fast, on_prefix=rank_use.add)
    # the per-row values the table's effects sum: ranked on the ranking rows' share of them only
    effects = ranking_effects(imp, sums.d_nll[index], tokens.positions, rank_rows)
    order_of = orders(effects, rank_use.table(), scope, settings)
    if prune_n:
        key = cache_key({**key_parts, "pruning": [pruning_ablation(o, n).describe() for o in order_of.values()
                                                  for n in prune_n], "rows": [[p, r.tolist()] for p, r in parts]})
        say(PHASES["prune"])
        with torch.inference_mode():
            tables.update(pruning_tables(measure, model, tokens, scope, order_of, prune_n, parts, settings=settings,
                                         fast=fast, progress=progress, stop=stop, done_before=done_before,
                                         total=total, key=key, ray=ray,
                                         cache=cache / f"pruning-{key}.safetensors" if cache is not None else None))
    causal = order_of[("causal", 0)]
    if settings.merge_max:
        why = merge_problem(model, settings.merge_max) or (None if split is not None else "too few rows to hold out")
        if why:
            notes.append(f"no merge curve: {why}")
        else:
            ranked = len(split.ranking)
            say(PHASES["merge"])
            stats = merge_stats(model, subset(tokens, split.ranking), settings, stop, progress=None if progress is None
                                else lambda d: progress(merge_before + d, total))
            curve, plans = merge_curve(measure, model, subset(tokens, split.heldout), causal, stats,
                                       list(range(1, settings.merge_max + 1)), progress=progress,
                                       done_before=merge_before + ranked, total=total, settings=settings, fast=fast,
                                       stop=stop)
            tables["merge_curve"] = curve
            out = holdout_provenance(split, tokens, causal, effects)
            return {**out, "merge": {"usage": {l: u.tolist() for l, u in stats.usage.items()},
                                     "plans": {str(n): {l: {str(d): t for d, t in p.items()} for l, p in plan.items()}
                                               for n, plan in plans.items()}}}
    return holdout_provenance(split, tokens, causal, effects)


def dataset_loss(model: Any, tokenizer: Any, data: CorpusData, settings: ImportanceSettings,
                 ablation: Ablation, rows: Sequence[int] | None = None) -> tuple[float, float]:
    """(unablated, ablated) mean next-token NLL over the dataset's tokens as the sweep takes them (only
    the token rows `rows`, indices, where given: the held-out rows of `holdout.split_rows`)."""
    run_model = float32_copy(model) if settings.float32 else model
    tokens = tokens_of(data, tokenizer, model.context, settings.max_tokens)
    tokens = tokens if rows is None else subset(tokens, rows)
    with torch.inference_mode():
        sums = measure(run_model, tokens, [ablation], replace(settings, sweep="naive"), fast=False)
    n = tokens.positions.sum()
    return float(sums.base_nll.sum() / n), float((sums.base_nll.sum() + sums.d_nll[0].sum()) / n)
