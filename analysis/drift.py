"""Routing drift over one training run's checkpoints (issue 39): how each layer's top-k settles, how
expert utilisation moves, which experts die or come back, and how routing splits by label.

Every checkpoint routes the same tokens (one dataset, encoded by the run's tokenizer; a checkpoint
without its own tokenizer.json takes its directory's parent's, as `routescope train --snapshots`
writes a run). Per routing layer and checkpoint c:

- `overlap_final`: the mean over tokens of |S_c ∩ S_last| / k, S the token's top-k set: OLMoE's
  "router saturation" (allenai/OLMoE scripts/run_moe_analysis.py, `compare_with_early_results`,
  commit 8eb1b3d: `len(set(_indices) & set(_e_indices)) / 8` averaged per layer); at k = 1 the share
  of tokens whose first choice is the last checkpoint's. `overlap_previous`: the same against the
  checkpoint before c (NaN for the first). Tokens whose top-k is undefined in either are left out.
- utilisation: the corpus statistics' own reduction (`corpus.reductions.utilisation`): `share` is
  the option's share of top-k slots; `dead` / `overloaded` use the corpus definitions (under
  DEAD_FRACTION of the uniform share 1/n, over OVERLOAD_FACTOR times it).
- events: an expert `dies` at the first checkpoint where it is dead after being alive at the one
  before, `revives` where it is alive after being dead; `dead at start` where the first checkpoint
  already has it dead.
- experts: per expert, its share at the first and the last checkpoint, the largest step-to-step
  change, the total variation sum |Δshare| over the run (the view's "changed most" ranking), and
  the steps of its first death and first revival.
- label shares (datasets with label columns): `corpus.reductions.label_shares` per checkpoint, and
  per layer and label column a specialisation index: the token-weighted mean over label values of
  the total variation distance 0.5 * sum_o |P(o | value) - P(o)| between a value's first-choice
  distribution and that of all tokens (0: routing ignores the label; 1: disjoint experts per value).

Memory holds the last checkpoint's and the previous checkpoint's top-k of every token
(L x tokens x k int32) and one model at a time.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from routescope.core_models.checkpoint import (CARD, CONFIG, TOKENIZER, load_checkpoint, load_tokenizer_file,
                                               require_tokenizer, tokenizer_mismatch)
from routescope.analysis.corpus import reductions as RD
from routescope.analysis.corpus import stats as S
from routescope.analysis.corpus.run import Stopped, _chunks, layout_of, traced_batches
from routescope.analysis.inputs.datasets import CorpusData
from routescope.analysis.runs.family_table import route_reader

SORTS = ("given", "step")
STEP_FIELDS = ("step", "global_step", "training_step")  # a config's own step field, where it has one
_CARD_STEP = re.compile(r"^- steps: (\d+)\b", re.M)  # the trainer's card line (`trainer.model_card`)
_NAME_STEP = re.compile(r"(?:step|checkpoint|ckpt|iter)[-_]?(\d+)", re.I)  # step-0050, checkpoint-500, step5000-...
CHANGE_TOP = 20  # experts the "changed most" table keeps


@dataclass(frozen=True)
class DriftSettings:
    """What a drift run depends on besides the checkpoints and the dataset. `sort`: "given" keeps
    the checkpoints' order, "step" sorts them by `checkpoint_step`."""

    max_tokens: int | None = None
    batch_size: int = 32
    chunk_size: int = 1024
    sort: str = "given"

    def __post_init__(self) -> None:
        if self.sort not in SORTS:
            raise ValueError(f"sort {self.sort!r}: one of {', '.join(SORTS)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens = {self.max_tokens}: must be >= 1")
        if self.batch_size < 1 or self.chunk_size < 1:
            raise ValueError("batch_size and chunk_size must be >= 1")


@dataclass
class DriftResult:
    checkpoints: list[str]  # directory names, in the run's order
    steps: list[int | None]
    tables: dict[str, pd.DataFrame]
    provenance: dict[str, Any]


# --- checkpoints ---------------------------------------------------------------------------------------

def checkpoint_step(path: str | Path) -> int | None:
    """The training step of a checkpoint: a step field of its config.json, HF Trainer's
    trainer_state.json `global_step`, the trainer's training.json `steps`, its card's "- steps: N"
    line, else a number in its directory name (step-0050, checkpoint-500); None if none says."""
    path = Path(path)
    for name, fields in ((CONFIG, STEP_FIELDS), ("trainer_state.json", ("global_step",)), ("training.json", ("steps",))):
        try:
            doc = json.loads((path / name).read_text())
        except (OSError, ValueError):
            continue
        for f in fields:
            if isinstance(doc, dict) and isinstance(doc.get(f), int) and not isinstance(doc.get(f), bool):
                return doc[f]
    try:
        if m := _CARD_STEP.search((path / CARD).read_text(errors="replace")):
            return int(m.group(1))
    except OSError:
        pass
    m = _NAME_STEP.search(path.name)
    return int(m.group(1)) if m else None


def run_checkpoints(paths: Sequence[str | Path]) -> list[Path]:
    """`paths` with each run directory (no config.json of its own, checkpoints below it, as `train
    --snapshots` writes them) replaced by its checkpoints in step order (then name)."""
    out = []
    for p in map(Path, paths):
        inner = [d for d in sorted(p.iterdir()) if (d / CONFIG).is_file()] \
            if p.is_dir() and not (p / CONFIG).is_file() else []
        steps = {d: checkpoint_step(d) for d in inner}
        out += sorted(inner, key=lambda d: (steps[d] is None, steps[d] or 0, d.name)) if inner else [p]
    return out


def _shape(model: Any) -> tuple:
    layout = layout_of(model, ())
    return model.config.label, layout.layers, layout.n_options, model.vocab_size


def order_checkpoints(paths: Sequence[str | Path], sort: str = "given") -> tuple[list[Path], list[int | None]]:
    """The checkpoints in the run's order with their steps; ValueError in one line for fewer than
    two, a missing directory, a step that `sort="step"` cannot read, or checkpoints whose routing
    shapes differ (read from config and weight headers: no weight is loaded)."""
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        raise ValueError(f"drift compares checkpoints of one run: give at least two (got {len(paths)})")
    for p in paths:
        if not (p / CONFIG).is_file():
            raise ValueError(f"{p}: not a checkpoint directory (no {CONFIG})")
    if len({p.resolve() for p in paths}) < len(paths):
        raise ValueError("a checkpoint is given twice")
    steps = [checkpoint_step(p) for p in paths]
    if sort == "step":
        missing = [str(p) for p, s in zip(paths, steps) if s is None]
        if missing:
            raise ValueError(f"--sort step: no step in the config, card or name of {missing[0]}")
        order = sorted(range(len(paths)), key=lambda i: steps[i])
        paths, steps = [paths[i] for i in order], [steps[i] for i in order]
    shapes = {}
    for p in paths:
        try:
            model, _ = load_checkpoint(p, device="meta")
            shapes[p] = _shape(model)
        except ValueError as e:  # CheckpointError, no per-token routes
            raise ValueError(f"{p}: {str(e).splitlines()[0]}") from None
    first = shapes[paths[0]]
    for p in paths[1:]:
        if shapes[p] != first:
            raise ValueError(f"{p} has another shape than {paths[0]} ({_describe(shapes[p])} against "
                             f"{_describe(first)}): drift compares checkpoints of one architecture")
    return paths, steps


def _describe(shape: tuple) -> str:
    family, layers, n, vocab = shape
    counts = sorted(set(n))
    return f"{family}, {len(layers)} routing layers of {'/'.join(map(str, counts))} options, vocabulary {vocab}"


def load_run_checkpoint(path: str | Path, **placement: Any) -> tuple[Any, Any]:
    """(model, tokenizer): the checkpoint's own tokenizer, else its run directory's (the parent's
    tokenizer.json, shared by `train --snapshots`); ValueError if there is neither. `placement`:
    `load_checkpoint`'s device, dtype, device_map, max_memory."""
    path = Path(path)
    model, tok = load_checkpoint(path, **placement)
    shared = path.resolve().parent / TOKENIZER
    if tok is None and shared.is_file():
        tok = load_tokenizer_file(shared)
        if problem := tokenizer_mismatch(tok, model.vocab_size):
            raise ValueError(f"{shared} (the run's tokenizer for {path.name}): {problem}")
    return model, require_tokenizer(tok, path)


# --- routes of one checkpoint ------------------------------------------------------------------------

@dataclass
class Routes:
    """One checkpoint's routing over the dataset: the corpus counts and every real token's top-k
    (L, N, k), 1-based options, 0 undefined, tokens in the order the batches ran (the same for every
    checkpoint: rows sorted by length within each chunk), with their ids (N,)."""

    stats: S.RouteStats
    topk: np.ndarray
    ids: np.ndarray


def _host(x: Any) -> np.ndarray:
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


@torch.inference_mode()
def checkpoint_routes(model: Any, tokenizer: Any, data: CorpusData, settings: DriftSettings = DriftSettings(),
                      stop: Callable[[], bool] | None = None) -> Routes:
    """Route `data` through `model` as `routescope corpus` does (first max_tokens tokens of each row,
    right-padded batches, padding never counted) and keep each real token's top-k too. `stop()` True
    (asked before each batch) ends with `Stopped`."""
    layout = layout_of(model, data.label_columns)
    if not layout.routes:
        raise ValueError(f"{model.config.label} has no per-token routes: drift compares top-k choices")
    reader = route_reader(model)
    limit = min(settings.max_tokens or model.context, model.context)
    pad = max(0, model.config.pad_id)

    def batches():
        for encoded in _chunks(iter(data), settings.chunk_size, tokenizer, limit):
            for r, x in encoded:
                if not x:
                    raise ValueError(f"{data.name}: row {r.row_id}: the text encodes to no tokens")
            order = sorted(range(len(encoded)), key=lambda k: len(encoded[k][1]))
            for s in range(0, len(order), settings.batch_size):
                if stop is not None and stop():
                    raise Stopped()
                part = order[s:s + settings.batch_size]
                lengths = [len(encoded[k][1]) for k in part]
                T = max(lengths)
                x = torch.tensor([encoded[k][1] + [pad] * (T - len(encoded[k][1])) for k in part])
                labels = [[encoded[k][0].labels[c] for k in part] for c in range(len(data.label_columns))]
                yield x, (lengths, labels)

    stats, tops, ids = None, [], []
    for b in traced_batches(model, reader, batches()):
        lengths, labels = b.item
        topk = _host(b.topk) if b.topk is not None else _host(b.routes)[..., None]  # (L, B, T, k)
        if stats is None:
            stats = S.RouteStats(dataclasses.replace(layout, k=topk.shape[-1]), b.vocab)
        stats.add(b.routes, lengths, input_ids=b.ids, predicted=b.predicted, topk=b.topk, labels=labels)
        real = np.arange(topk.shape[2])[None, :] < np.asarray(lengths)[:, None]  # (B, T)
        tops.append(topk[:, real].astype(np.int32))  # (L, N_b, k)
        ids.append(_host(b.ids)[real])
    if stats is None:
        raise ValueError(f"{data.name}: no rows")
    return Routes(stats, np.concatenate(tops, axis=1), np.concatenate(ids))


# --- measures --------------------------------------------------------------------------------------------

def topk_overlap(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 15) -> np.ndarray:
    """Per layer, the mean over tokens of |A ∩ B| / k for top-k sets a, b (L, N, k) (1-based, 0
    undefined; tokens undefined in either are left out: NaN where none is left)."""
    L, N, k = a.shape
    total, count = np.zeros(L), np.zeros(L)
    for s in range(0, N, chunk):
        x, y = a[:, s:s + chunk], b[:, s:s + chunk]
        ok = (x > 0).all(-1) & (y > 0).all(-1)  # (L, n)
        inter = (x[..., :, None] == y[..., None, :]).any(-1).sum(-1)  # (L, n): elements of A in B
        total += np.where(ok, inter / k, 0.0).sum(-1)
        count += ok.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def expert_events(util: pd.DataFrame) -> pd.DataFrame:
    """Deaths and revivals (module doc) from the utilisation table, in the run's order."""
    rows = []
    for (layer, option), g in util.groupby(["layer", "option"], sort=False):
        prev = None
        for r in g.itertuples(index=False):
            if r.dead and prev is None:
                rows.append((layer, option, "dead at start", r.checkpoint, r.step, math.nan, r.share))
            elif prev is not None and r.dead != prev.dead:
                rows.append((layer, option, "dies" if r.dead else "revives", r.checkpoint, r.step, prev.share, r.share))
            prev = r
    return pd.DataFrame(rows, columns=["layer", "option", "event", "checkpoint", "step", "share_before", "share"])


def expert_changes(util: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """Per expert: first and last share, the largest step-to-step change, the total variation and the
    steps (checkpoints) of its first death and first revival; the most changed first."""
    rows = []
    for (layer, option), g in util.groupby(["layer", "option"], sort=False):
        share = g["share"].to_numpy(dtype=float)
        delta = np.abs(np.diff(share))
        ev = events[(events["layer"] == layer) & (events["option"] == option)]
        died = ev[ev["event"].isin(["dies", "dead at start"])]
        revived = ev[ev["event"] == "revives"]
        rows.append((layer, option, share[0], share[-1], share[-1] - share[0],
                     float(np.nanmax(delta)) if len(delta) and not np.isnan(delta).all() else math.nan,
                     float(np.nansum(delta)),
                     died["checkpoint"].iloc[0] if len(died) else "", died["step"].iloc[0] if len(died) else None,
                     revived["checkpoint"].iloc[0] if len(revived) else "",
                     revived["step"].iloc[0] if len(revived) else None, bool(g["dead"].iloc[-1])))
    df = pd.DataFrame(rows, columns=["layer", "option", "share_first", "share_last", "change", "max_step_change",
                                     "total_variation", "first_dies_at", "first_dies_step", "first_revives_at",
                                     "first_revives_step", "dead_at_last"])
    for c in ("first_dies_step", "first_revives_step"):
        df[c] = pd.array([None if v is None or pd.isna(v) else int(v) for v in df[c]], dtype="Int64")
    return df.sort_values(["total_variation", "layer", "option"], ascending=[False, True, True],
                          kind="stable").reset_index(drop=True)


def label_specialisation(shares: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint, layer and label column: the token-weighted mean over label values of the total
    variation distance between the value's first-choice distribution and all tokens' (module doc)."""
    tok = shares[shares["reading"] == S.READINGS[0]]
    rows = []
    keys = ["checkpoint", "step", "layer", "label_column"]
    for key, g in tok.groupby(keys, sort=False, dropna=False):
        counts = g.pivot_table(index="label_value", columns="option", values="count", aggfunc="sum", sort=False)
        counts = counts.to_numpy(dtype=float)
        n_v = counts.sum(1)
        if n_v.sum() == 0:
            rows.append((*key, math.nan))
            continue
        p_all = counts.sum(0) / n_v.sum()
        with np.errstate(invalid="ignore", divide="ignore"):
            tv = 0.5 * np.abs(counts / n_v[:, None] - p_all).sum(1)
        keep = n_v > 0
        rows.append((*key, float((tv[keep] * n_v[keep]).sum() / n_v[keep].sum())))
    return pd.DataFrame(rows, columns=[*keys, "specialisation"])


# --- the run ----------------------------------------------------------------------------------------------

def _with(df: pd.DataFrame, name: str, step: int | None) -> pd.DataFrame:
    df = df.copy()
    df.insert(0, "step", pd.array([step] * len(df), dtype="Int64"))
    df.insert(0, "checkpoint", name)
    return df


def _measure(i: int, routes: Routes, final: Routes, prev_topk: np.ndarray | None, name: str, step: int | None,
             sat: dict, util: dict, shares: dict) -> np.ndarray:
    """Checkpoint i's rows of the saturation, utilisation and label tables (into the dicts by i);
    its top-k, the next checkpoint's "previous"."""
    layers = routes.stats.layout.layers
    ov_final = topk_overlap(routes.topk, final.topk)
    ov_prev = topk_overlap(routes.topk, prev_topk) if prev_topk is not None else np.full(len(layers), np.nan)
    sat[i] = [(name, step, layer, float(ov_final[l]), float(ov_prev[l])) for l, layer in enumerate(layers)]
    u = RD.utilisation(routes.stats)
    util[i] = _with(u[["layer", "option", "slot_share", "dead", "overloaded", "token_share", "first_share"]]
                    .rename(columns={"slot_share": "share"}), name, step)
    if routes.stats.layout.label_columns:
        shares[i] = _with(RD.label_shares(routes.stats), name, step)
    return routes.topk


def drift(checkpoints: Sequence[str | Path], data: CorpusData, settings: DriftSettings = DriftSettings(), *,
          placement: Mapping[str, Any] | None = None,
          progress: Callable[[int, int, str], None] | None = None,
          stop: Callable[[], bool] | None = None) -> DriftResult:
    """The drift tables of a run (module doc): saturation, utilisation, events, experts, and where the
    dataset has labels label_shares and label_specialisation. `progress(done, total, name)` after each
    checkpoint; `stop()` True (asked before each checkpoint and each batch) ends with `Stopped`. The
    last checkpoint runs first (every other one is compared with it). `placement`:
    where and in what dtype each model loads (`load_checkpoint`'s keywords; default the CPU)."""
    t0 = time.perf_counter()
    paths, steps = order_checkpoints(checkpoints, settings.sort)
    names = [p.name for p in paths]
    if len(set(names)) < len(names):  # the tables name checkpoints by directory
        names = [f"{p.parent.name}/{p.name}" for p in paths]
    final: Routes | None = None
    prev_topk: np.ndarray | None = None
    sat, util, shares = {}, {}, {}
    last = len(paths) - 1
    for done, i in enumerate([last, *range(last)], start=1):
        if stop is not None and stop():
            raise Stopped()
        model, tok = load_run_checkpoint(paths[i], **(placement or {}))
        routes = checkpoint_routes(model, tok, data, settings, stop)
        del model
        if final is None:
            final = routes
        elif routes.ids.shape != final.ids.shape or not np.array_equal(routes.ids, final.ids):
            raise ValueError(f"{paths[i]} encodes the dataset into other tokens than {paths[last]}: "
                             "the checkpoints of one run share a tokenizer")
        elif routes.topk.shape != final.topk.shape:
            raise ValueError(f"{paths[i]} picks top-{routes.topk.shape[-1]} where {paths[last]} picks "
                             f"top-{final.topk.shape[-1]}: drift compares checkpoints of one architecture")
        if i != last:
            prev_topk = _measure(i, routes, final, prev_topk, names[i], steps[i], sat, util, shares)
        if progress is not None:
            progress(done, len(paths), names[i])
    _measure(last, final, final, prev_topk, names[last], steps[last], sat, util, shares)
    sat = [row for i in sorted(sat) for row in sat[i]]
    util = [util[i] for i in sorted(util)]
    shares = [shares[i] for i in sorted(shares)]
    layers = final.stats.layout.layers
    saturation = pd.DataFrame(sat, columns=["checkpoint", "step", "layer", "overlap_final", "overlap_previous"])
    saturation["step"] = saturation["step"].astype("Int64")
    utilisation = pd.concat(util, ignore_index=True)
    events = expert_events(utilisation)
    tables = {"saturation": saturation, "utilisation": utilisation, "events": events,
              "experts": expert_changes(utilisation, events)}
    if shares:
        tables["label_shares"] = pd.concat(shares, ignore_index=True)
        tables["label_specialisation"] = label_specialisation(tables["label_shares"])
    prov = {"checkpoints": [str(p) for p in paths], "names": names, "steps": steps, "dataset": data.name,
            "dataset_sha256": data.digest, "rows": int(final.stats.n_rows), "tokens": int(final.stats.n_tokens),
            "top_k": int(final.topk.shape[-1]), "layers": list(layers), "sort": settings.sort,
            "max_tokens": settings.max_tokens, "seconds": round(time.perf_counter() - t0, 2)}
    return DriftResult(names, steps, tables, prov)
