"""Which experts matter on a dataset: the causal effect of dropping each routing option, teacher-forced
on the dataset's text, beside a random-expert control, cheap proxies and a pruning what-if.

For every chosen (layer, option) the dataset is run with that option dropped alone (`Ablation`), and
compared position by position with the unablated run over every predicted position (each row's
tokens after its first):
- `delta_nll`: mean next-token NLL ablated minus unablated, token-weighted, with a 95% bootstrap
  interval over rows (`delta_nll_low` / `delta_nll_high`, `bootstrap` resamples, seeded);
- `kl`: mean KL(unablated || ablated) of the next-token distributions;
- `flip_rate`: the share of positions whose top-1 prediction changes;
- `usage`: the option's share of the top-k slots of the layer over the dataset's tokens (unablated).
The control drops a random expert of the same layer (`control_draws` seeded draws): where an effect's
interval lies above the control's, that expert stands out (`outside_control`). Proxies: gate-weighted
usage (the option's share of routing weight) and REAP (mean over the tokens routed to the expert of
router weight x the norm of the expert's own output, HF models), each with its Spearman correlation
with `delta_nll` per layer. Pruning: per N, the dataset loss with the N least important experts of
every layer dropped at once, ranked by causal effect, by usage and at random.

Effects are measured in float32 by default (`float32_copy`): in bfloat16 rounding alone moves log p
by about as much as one expert's effect (README "Which experts matter").

Two mechanisms make the sweep cheaper than one full forward per ablation, both equal to it (tests):
prefix reuse (HF models: `HFModel.capture` keeps each decoder layer's input, `resume` restarts there,
so an ablation at layer l runs layers l.. only) and many ablations per forward (the batch repeated,
each copy under its own ablation: `row_ablations`). Families without them run the naive loop.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch

from routescope.core_models.ablation import Ablation
from routescope.core_models.sites import INDICES, OPTION_WEIGHTS, WEIGHTS
from routescope.core_models.trace import tracing

from routescope.analysis.corpus.data import CorpusData
from routescope.analysis.corpus.run import Stopped, encode_head

METHODS = ("fast", "naive")
COLUMNS = ["layer", "option", "label", "delta_nll", "delta_nll_low", "delta_nll_high", "kl", "flip_rate", "usage"]
CHUNK_LOGITS = 2**20  # float32 logits reduced at once (4 MiB: 256 positions of a 4,096 vocabulary; in cache)


@dataclass(frozen=True)
class ImportanceSettings:
    """What the tables depend on besides the model and the dataset (hashable: a cache key).
    `max_tokens`: tokens taken from the dataset in row order (None: all; each row at most the
    model's context). `method`: "fast" (prefix reuse and batched ablations where the model has
    them) or "naive" (one full forward per ablation). `prune_max`: largest N of the pruning curve
    (None: half the routed experts; 0: no curve)."""

    layers: tuple[str, ...] | None = None
    options: tuple[int, ...] | None = None
    max_tokens: int | None = None
    batch_size: int = 8
    ablations_per_forward: int | None = None  # None: 1 on a CPU, 16 on an accelerator (see below)
    control_draws: int = 8
    prune_draws: int = 8
    prune_max: int | None = None
    bootstrap: int = 1000
    seed: int = 0
    method: str = "fast"
    float32: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r}: use {', '.join(METHODS)}")
        for f in ("batch_size", "ablations_per_forward", "bootstrap"):
            if getattr(self, f) is not None and getattr(self, f) < 1:
                raise ValueError(f"{f} = {getattr(self, f)}: must be >= 1")
        for f in ("control_draws", "prune_draws"):
            if getattr(self, f) < 0:
                raise ValueError(f"{f} = {getattr(self, f)}: must be >= 0")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError(f"max_tokens = {self.max_tokens}: must be >= 2 (one predicted position)")
        if self.prune_max is not None and self.prune_max < 0:
            raise ValueError(f"prune_max = {self.prune_max}: must be >= 0")


@dataclass
class ImportanceResult:
    """The tables of one sweep (name -> frame) and how they were made."""

    tables: dict[str, pd.DataFrame]
    provenance: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]


# --- the dataset ------------------------------------------------------------------------------------

@dataclass
class Tokens:
    """The dataset's token rows (row ids, ids), in dataset order."""

    row_ids: list[str]
    ids: list[list[int]]

    @property
    def positions(self) -> np.ndarray:  # predicted positions per row
        return np.array([max(0, len(x) - 1) for x in self.ids], dtype=np.float64)


def tokens_of(data: CorpusData, tokenizer: Any, context: int, max_tokens: int | None) -> Tokens:
    """The dataset's rows encoded, each cut to `context`, until `max_tokens` tokens in all; ValueError
    for a dataset without one predicted position."""
    out = Tokens([], [])
    total = 0
    rows = iter(data)
    while max_tokens is None or total < max_tokens:
        chunk = [r for _, r in zip(range(256), rows)]
        if not chunk:
            break
        for r in chunk:  # each row tokenized only as far as it is used (a row may be 1 MiB)
            x = encode_head(tokenizer, r.text, context if max_tokens is None else min(context, max_tokens - total))
            if x:
                out.row_ids.append(r.row_id)
                out.ids.append(x)
                total += len(x)
            if max_tokens is not None and total >= max_tokens:
                break
    if not out.ids or out.positions.sum() == 0:
        raise ValueError(f"{data.name}: no row has two tokens: nothing to predict")
    return out


def _batches(tokens: Tokens, size: int, pad: int) -> list[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """(row indices, right-padded ids [R, T], lengths [R]) by length, `size` rows each."""
    order = sorted(range(len(tokens.ids)), key=lambda k: len(tokens.ids[k]))
    out = []
    for s in range(0, len(order), size):
        part = order[s:s + size]
        T = max(len(tokens.ids[k]) for k in part)
        x = torch.tensor([tokens.ids[k] + [pad] * (T - len(tokens.ids[k])) for k in part])
        out.append((np.array(part), x, torch.tensor([len(tokens.ids[k]) for k in part])))
    return out


# --- what a sweep runs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scope:
    layers: tuple[str, ...]  # in model order
    options: dict[str, tuple[int, ...]]  # layer -> options measured
    routed: dict[str, int]  # layer -> routed options (the first ones; a shared expert after them)
    labels: dict[str, list[str]]


def scope_of(model: Any, layers: Sequence[str] | None, options: Sequence[int] | None) -> Scope:
    """The layers and options to measure; ValueError (one line) for an unknown one or a model without
    routing layers."""
    known = model.routing_layers()
    if not known:
        raise ValueError(f"{model.config.label} has no routing layers: no expert to measure")
    chosen = list(known) if not layers else list(dict.fromkeys(layers))
    bad = [l for l in chosen if l not in known]
    if bad:
        raise ValueError(f"no routing layer {', '.join(map(repr, bad))} (layers: {', '.join(known)})")
    chosen = [l for l in known if l in chosen]
    opts = {}
    for l in chosen:
        want = range(known[l]) if options is None else list(dict.fromkeys(int(o) for o in options))
        out = [o for o in want if not 0 <= o < known[l]]
        if out:
            raise ValueError(f"option {out[0]} out of range 0..{known[l] - 1} of layer {l!r}")
        opts[l] = tuple(want)
    routed = {l: int(getattr(model.routing_modules[l], "n_routed", known[l])) for l in chosen}
    return Scope(tuple(chosen), opts, routed, {l: model.option_labels()[l] for l in chosen})


def _drop(*pairs: tuple[str, int]) -> Ablation:
    return Ablation(drop=tuple(pairs))


def control_draws(scope: Scope, draws: int, seed: int) -> list[tuple[str, int, int]]:
    """(layer, draw, routed option) of the random-expert control, seeded."""
    rng = np.random.default_rng(seed)
    return [(l, d, int(rng.integers(scope.routed[l]))) for l in scope.layers for d in range(draws)]


# --- measuring ablations over the dataset -----------------------------------------------------------------

@dataclass
class Sums:
    """Per ablation and row: sums over the row's predicted positions."""

    d_nll: np.ndarray  # [A, R] ablated minus unablated NLL
    kl: np.ndarray
    flips: np.ndarray
    base_nll: np.ndarray  # [R]
    done: np.ndarray  # [R] bool: rows measured

    @classmethod
    def empty(cls, n_ablations: int, n_rows: int) -> "Sums":
        z = lambda: np.zeros((n_ablations, n_rows))  # noqa: E731
        return cls(z(), z(), z(), np.zeros(n_rows), np.zeros(n_rows, dtype=bool))


class _Positions:
    """The unablated next-token distributions of one batch at its predicted positions (each row's
    positions but its last; padding never enters), and the effects of an ablated run against them.
    An ablated run's logits are taken a chunk of positions at a time (`CHUNK_LOGITS` values) and
    reduced while the chunk is in the CPU's cache, with one log_softmax per chunk: delta NLL from the
    target's log-probability, KL(p0 || q) = p0 . log p0 - p0 . log q, a flip where the unablated top-1
    token's logit is below the chunk's largest (an exact tie keeps it). No vocabulary-sized tensor of
    the whole batch is made. From final hidden states (`effects_of_hidden`) each chunk's logits come
    from the output embedding itself, at the predicted positions only. The unablated terms are taken
    the same way, so an ablation that changes no logit gives exactly 0. (p0 . z taken as h . (p0 W)
    would save a pass over the chunk, but it mixes exact and float32-rounded logits: on olmoe-tiny KL
    then moved by ~3e-5 nats per position from KL of float64 logits, against ~1e-7 from the chunk.)"""

    def __init__(self, logits: torch.Tensor, x: torch.Tensor, lengths: torch.Tensor,
                 head: torch.nn.Module | None = None) -> None:
        R, T = x.shape
        dev = logits.device
        valid = torch.arange(T)[None, :] < (lengths[:, None] - 1)  # [R, T]: a next token follows
        self.flat = valid.reshape(-1).nonzero()[:, 0].to(dev)  # predicted positions in [R * T]
        self.row = (self.flat // T).cpu()
        self.rows, self.T = R, T
        self.target = x.reshape(-1).to(dev)[self.flat + 1]
        z = logits.reshape(R * T, -1).index_select(0, self.flat).float()  # [N, V]
        lp = torch.log_softmax(z, -1)
        self.p = lp.exp()
        self.p_log_p = (lp * self.p).sum(-1)
        self.log_p = lp.gather(-1, self.target[:, None])[:, 0]
        self.top = z.argmax(-1)
        self.chunk = max(1, CHUNK_LOGITS // z.shape[-1])
        self.head = head

    @property
    def nll(self) -> torch.Tensor:
        return -self.log_p

    def per_row(self, v: torch.Tensor) -> np.ndarray:
        out = torch.zeros(self.rows, dtype=torch.float64)
        return out.index_add_(0, self.row, v.double().cpu()).numpy()

    def _reduce(self, chunk: Callable[[slice], torch.Tensor]) -> tuple[np.ndarray, ...]:
        """`chunk(part)`: the ablated logits [c, V] (float32) of those positions."""
        n = len(self.flat)
        d_nll, kl, flips = (torch.empty(n, device=self.p.device) for _ in range(3))
        for s in range(0, n, self.chunk):
            part = slice(s, s + self.chunk)
            z = chunk(part)
            lq = torch.log_softmax(z, -1)
            d_nll[part] = self.log_p[part] - lq.gather(-1, self.target[part, None])[:, 0]
            kl[part] = self.p_log_p[part] - (lq * self.p[part]).sum(-1)
            flips[part] = z.gather(-1, self.top[part, None])[:, 0] < z.amax(-1)
        return self.per_row(d_nll), self.per_row(kl), self.per_row(flips)

    def effects(self, logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-row sums of (delta NLL, KL(unablated || ablated), top-1 flips) of ablated logits [R, T, V]."""
        flat = logits.reshape(self.rows * self.T, -1)
        return self._reduce(lambda part: flat.index_select(0, self.flat[part]).float())

    def effects_of_hidden(self, hidden: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The same from an ablated run's final hidden states [R, T, hidden] (the output embedding's
        input): its logits are made a chunk at a time by the output embedding."""
        flat = hidden.reshape(self.rows * self.T, -1)
        return self._reduce(lambda part: self.head(flat.index_select(0, self.flat[part])).float())


def per_forward_default(device: torch.device) -> int:
    """Ablations sharing one forward when the settings leave it open. On a CPU one: on olmoe-tiny a
    4,000-token sweep took 22.0, 22.6, 24.8 and 26.2 s of CPU with 1, 2, 4 and 8 per forward (one
    medians of 2 runs each, shared machine; the logits are reduced a chunk at a time either way);
    an accelerator fills its cores with the larger batch (not measured here)."""
    return 1 if device.type == "cpu" else 16


def _first_layer(model: Any, ab: Ablation) -> str:
    order = list(model.routing_layers())
    return min((l for l, _ in ab.drop), key=order.index)


def _measure_batch(model: Any, x: torch.Tensor, lengths: torch.Tensor, ablations: Sequence[Ablation],
                   settings: ImportanceSettings, fast: bool, stop: Callable[[], bool] | None,
                   on_prefix: Callable[[Any, Any], None] | None = None) -> tuple[np.ndarray, list]:
    """(unablated NLL per row, [(d_nll, kl, flips) per row for each ablation]) of one batch."""
    x = x.to(model.device)
    R = x.shape[0]
    prefix = model.capture(x) if model.can_resume else None
    if prefix is not None:
        base = prefix.logits
    else:
        with tracing(_usage_sites(model)) as tr:
            base = model(x).logits
        prefix = tr
    if on_prefix is not None:
        on_prefix(prefix, lengths)
    resume = fast and model.can_resume
    pos = _Positions(base, x, lengths, head=model.output_embedding if resume else None)
    out: list = [None] * len(ablations)
    if resume:
        per = settings.ablations_per_forward or per_forward_default(x.device)
        groups: dict[str, list[int]] = {}
        for j, ab in enumerate(ablations):
            groups.setdefault(_first_layer(model, ab), []).append(j)
        for layer, js in groups.items():
            for s in range(0, len(js), per):
                if stop is not None and stop():
                    raise Stopped()
                part = js[s:s + per]
                hidden = model.resume(prefix, layer, [ablations[j] for j in part for _ in range(R)], head=False)
                for i, j in enumerate(part):
                    out[j] = pos.effects_of_hidden(hidden[i * R:(i + 1) * R])
    else:
        for j, ab in enumerate(ablations):
            if stop is not None and stop():
                raise Stopped()
            out[j] = pos.effects(model(x, ablation=ab).logits)
    return pos.per_row(pos.nll), out


def _usage_sites(model: Any) -> list[str]:
    sites = []
    for m in model.routing_modules.values():
        roles = m.roles
        sites += [roles[r] for r in (INDICES, WEIGHTS, OPTION_WEIGHTS) if r in roles]
    return sites


class Usage:
    """Usage, gate-weighted usage and REAP per (layer, option) over the dataset's real tokens."""

    def __init__(self, model: Any, scope: Scope) -> None:
        self.model, self.scope = model, scope
        n = {l: model.routing_layers()[l] for l in scope.layers}
        self.slots = {l: np.zeros(n[l]) for l in scope.layers}
        self.weight = {l: np.zeros(n[l]) for l in scope.layers}
        self.reap = {l: np.zeros(n[l]) for l in scope.layers}
        self.reap_n = {l: np.zeros(n[l]) for l in scope.layers}
        self.has_reap = model.can_resume

    def add(self, prefix: Any, lengths: torch.Tensor) -> None:
        real = lambda T: (torch.arange(T)[None, :] < lengths[:, None]).reshape(-1)  # noqa: E731
        for l in self.scope.layers:
            n = len(self.slots[l])
            if self.has_reap:
                idx, w, norms = self.model.expert_output_norms(prefix, l)
                keep = real(idx.shape[0] // len(lengths)).to(idx.device)
                idx, w, norms = idx[keep].cpu(), w[keep].cpu(), norms[keep].cpu()
                self._topk(l, idx, w, n)
                self.reap[l] += np.bincount(idx.reshape(-1), (w * norms).reshape(-1).double(), minlength=n)
                self.reap_n[l] += np.bincount(idx.reshape(-1), minlength=n)
                continue
            roles = self.model.routing_modules[l].roles
            if INDICES in roles and roles[INDICES] in prefix:
                idx = prefix[roles[INDICES]]
                keep = real(idx.shape[1])
                idx = idx.reshape(-1, idx.shape[-1])[keep].long()
                w = prefix[roles[WEIGHTS]].reshape(-1, idx.shape[-1])[keep] if WEIGHTS in roles and \
                    roles[WEIGHTS] in prefix else torch.ones(idx.shape)
                self._topk(l, idx, w, n)
            elif OPTION_WEIGHTS in roles and roles[OPTION_WEIGHTS] in prefix:
                ow = prefix[roles[OPTION_WEIGHTS]]
                if ow.dim() == 3:  # [batch, pos, n]: per token
                    ow = ow.reshape(-1, ow.shape[-1])[real(ow.shape[1])]
                ow = ow.reshape(-1, ow.shape[-1]).double()
                self.slots[l] += (ow > 0).sum(0).numpy()[:n]
                self.weight[l] += ow.abs().sum(0).numpy()[:n]

    def _topk(self, layer: str, idx: torch.Tensor, w: torch.Tensor, n: int) -> None:
        ok = (idx >= 0) & (idx < n)  # -1 / n: an empty slot some routers leave
        self.slots[layer] += np.bincount(idx[ok].reshape(-1).numpy(), minlength=n)[:n]
        self.weight[layer] += np.bincount(idx[ok].reshape(-1).numpy(), w[ok].reshape(-1).double().numpy(),
                                          minlength=n)[:n]

    def table(self) -> pd.DataFrame:
        rows = []
        for l in self.scope.layers:
            s, w = self.slots[l], self.weight[l]
            for o in range(len(s)):
                shared = o >= self.scope.routed[l]
                rows.append({"layer": l, "option": o,
                             "usage": np.nan if shared or s.sum() == 0 else s[o] / s.sum(),
                             "gate_usage": np.nan if shared or w.sum() == 0 else w[o] / w.sum(),
                             "reap": (self.reap[l][o] / self.reap_n[l][o] if self.reap_n[l][o] else 0.0)
                             if self.has_reap and not shared else np.nan})
        return pd.DataFrame(rows)


# --- the cache (a rerun resumes) ----------------------------------------------------------------------------

def cache_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _load_cache(path: Path | None, key: str, n_ablations: int, n_rows: int) -> Sums:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    fresh = Sums.empty(n_ablations, n_rows)
    if path is None or not path.is_file():
        return fresh
    try:
        from safetensors import safe_open

        with safe_open(str(path), "numpy") as f:
            if (f.metadata() or {}).get("key") != key:
                return fresh
        t = load_file(str(path))
        s = Sums(t["d_nll"], t["kl"], t["flips"], t["base_nll"], t["done"].astype(bool))
        return s if s.d_nll.shape == (n_ablations, n_rows) else fresh
    except (OSError, SafetensorError, KeyError, ValueError):
        return fresh  # unreadable: measured again


def _save_cache(path: Path | None, key: str, s: Sums) -> None:
    from safetensors.numpy import save_file

    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file({"d_nll": s.d_nll, "kl": s.kl, "flips": s.flips, "base_nll": s.base_nll,
                   "done": s.done.astype(np.uint8)}, str(tmp), metadata={"key": key})
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def measure(model: Any, tokens: Tokens, ablations: Sequence[Ablation], settings: ImportanceSettings, *,
            fast: bool, progress: Callable[[int, int], None] | None = None, stop: Callable[[], bool] | None = None,
            on_prefix: Callable[[Any, Any], None] | None = None, cache: Path | None = None,
            key: str = "", done_before: int = 0, total: int | None = None, ray: RaySpec | None = None) -> Sums:
    """Per-row sums of every ablation's effects over the dataset (module doc); with `cache`, rows
    measured by an earlier (interrupted) call with the same `key` are not measured again. `ray`: the
    batches are measured by Ray actors (`_on_ray`) instead of here, with the same cache, progress and
    stop; `on_prefix` is then not called."""
    pad = max(0, int(getattr(model.config, "pad_id", 0)))
    sums = _load_cache(cache, key, len(ablations), len(tokens.ids))
    todo = [b for b in _batches(tokens, settings.batch_size, pad) if not sums.done[b[0]].all()]
    total = total if total is not None else len(tokens.ids)
    done = done_before + int(sums.done.sum())
    if ray is not None:
        results = _on_ray(ray, todo, ablations, settings, fast, stop) if ablations and todo else iter(())
        if not ablations:
            sums.done[:] = True
    else:
        results = ((rows, *_measure_batch(model, x, lengths, ablations, settings, fast, stop, on_prefix))
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
                _save_cache(cache, key, sums)
                saved = time.monotonic()
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()  # Ray: its actors and the cluster it started end here
        if cache is not None and sums.done.any():
            _save_cache(cache, key, sums)  # whole or not at all (temporary renamed)
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
    n = positions.sum()
    d, kl, fl = sums.d_nll[list(index)], sums.kl[list(index)], sums.flips[list(index)]
    low, high = ratio_interval(d, positions, weights)
    return pd.DataFrame({"delta_nll": d.sum(1) / n, "delta_nll_low": low, "delta_nll_high": high,
                         "kl": kl.sum(1) / n, "flip_rate": fl.sum(1) / n})


def spearman(a: pd.Series, b: pd.Series) -> float:
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
               workers: int = 2) -> ImportanceResult:
    """Every table of the sweep (module doc): importance, control, control_summary, proxies,
    proxy_agreement, pruning, pruning_curve. `progress(done, total)` counts rows x passes; `stop()`
    True ends with `corpus_run.Stopped`; `cache_dir` keeps measured rows so a rerun resumes.
    `engine="ray"`: the batches of rows are measured by `workers` Ray actors, each loading
    `checkpoint` itself (`_on_ray`), with the same cache, progress and stop as one process and the
    same numbers."""
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
    fast = settings.method == "fast" and run_model.can_resume
    if settings.method == "fast" and not fast:
        notes.append(f"{model.config.label}: no prefix reuse for this family: one forward per ablation")
    if fast:
        fast = _resume_agrees(run_model, tokens, settings)
        if not fast:
            notes.append("a forward restarted at a routing layer did not reproduce the plain forward on this model: "
                         "one full forward per ablation instead")

    singles = [(l, o) for l in scope.layers for o in scope.options[l]]
    draws = control_draws(scope, settings.control_draws, settings.seed)
    ablations: dict[Ablation, int] = {}
    for ab in [_drop(p) for p in singles] + [_drop((l, o)) for l, _, o in draws]:
        ablations.setdefault(ab, len(ablations))
    prune_n = _prune_range(scope, settings)
    passes = 1 + bool(prune_n)
    total = passes * len(tokens.ids)
    usage = Usage(run_model, scope)
    key_parts = {"weights": weights_sha256, "data": data.digest, "settings": {k: v for k, v in asdict(settings).items() if k != "method"},
                 "model": model.config.label}
    key = cache_key({**key_parts, "ablations": [a.describe() for a in ablations]})
    cache = cache_dir / f"effects-{key}.safetensors" if cache_dir is not None and weights_sha256 else None
    usage_done: list[bool] = []

    def on_prefix(prefix: Any, lengths: torch.Tensor) -> None:
        usage.add(prefix, lengths)
        usage_done.append(True)

    ray = RaySpec(checkpoint, workers, str(next(run_model.parameters()).dtype).removeprefix("torch.")) \
        if engine == "ray" else None
    with torch.inference_mode():
        sums = measure(run_model, tokens, list(ablations), settings, fast=fast, progress=progress, stop=stop,
                       on_prefix=on_prefix, cache=cache, key=key, total=total, ray=ray)
        if len(usage_done) < len(_batches(tokens, settings.batch_size, 0)):
            # rows measured before an interruption, or by Ray workers: usage and REAP counted here by one plain pass
            usage = Usage(run_model, scope)
            measure(run_model, tokens, [], settings, fast=fast, on_prefix=lambda p, n: usage.add(p, n))
    positions = tokens.positions
    weights = bootstrap_weights(len(tokens.ids), settings.bootstrap, settings.seed)
    labels = scope.labels
    use = usage.table()

    imp = pd.DataFrame(singles, columns=["layer", "option"])
    imp.insert(2, "label", [labels[l][o] for l, o in singles])
    eff = effect_table(sums, [ablations[_drop(p)] for p in singles], positions, weights)
    imp = pd.concat([imp, eff], axis=1).merge(use[["layer", "option", "usage"]], on=["layer", "option"], how="left")
    imp = imp[COLUMNS]

    ctl = pd.DataFrame(draws, columns=["layer", "draw", "option"])
    ctl.insert(0, "kind", "control")
    ctl["label"] = [labels[l][o] for l, _, o in draws]
    if len(ctl):
        ceff = effect_table(sums, [ablations[_drop((l, o))] for l, _, o in draws], positions, weights)
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
    if prune_n:
        with torch.inference_mode():
            tables.update(_pruning(run_model, tokens, scope, imp, use, prune_n, settings, fast, base_loss,
                                   progress=progress, stop=stop, done_before=len(tokens.ids), total=total,
                                   cache=cache_dir if cache is not None else None, key_parts=key_parts,
                                   ray=ray))
    elif settings.prune_max != 0:
        notes.append("no pruning curve: it needs every routed option of each layer measured (no --options)")
    prov = {"model": name, "family": model.config.family, "label": model.config.label,
            "weights_sha256": weights_sha256, "dataset": data.name, "dataset_sha256": data.digest,
            "rows": len(tokens.ids), "tokens": int(sum(len(x) for x in tokens.ids)),
            "predicted_positions": int(n), "base_loss": base_loss,
            "effects_dtype": str(next(run_model.parameters()).dtype).removeprefix("torch."),
            "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "method": (f"prefix reuse, {settings.ablations_per_forward or per_forward_default(run_model.device)} "
                       "ablation(s) per forward") if fast else "one full forward per ablation",
            "settings": asdict(settings), "seconds": round(time.perf_counter() - t0, 3), "routescope": _version()}
    return ImportanceResult(tables, prov, notes)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("routescope")
    except metadata.PackageNotFoundError:
        return "unknown"


def _resume_agrees(model: Any, tokens: Tokens, settings: ImportanceSettings) -> bool:
    rows, x, _ = _batches(tokens, settings.batch_size, max(0, int(getattr(model.config, "pad_id", 0))))[0]
    return restart_reproduces(model, x)


RESTART_EPS = 128  # float32 eps of the logits' scale: a restarted forward repeats the plain forward's ops on
# the same inputs (0 difference on olmoe-tiny); beam's soft-capped logits differ by ~1,500 eps on a tiny model


def restart_reproduces(model: Any, x: torch.Tensor) -> bool:
    """Whether restarting at the first routing layer reproduces the plain forward of `x` (within
    `RESTART_EPS` float32 eps of the logits' scale): a model whose head does more than final norm +
    output embedding (logit soft-capping, scaling) fails, and so does one whose decoder layers hand on
    more than the hidden states (hy_v4's parallel residual streams: other shapes), and the sweep
    runs the naive loop."""
    with torch.inference_mode():
        x = x.to(model.device)
        prefix = model.capture(x)
        again = model.resume(prefix, next(iter(model.routing_layers())), [Ablation()] * x.shape[0])
    if again.shape != prefix.logits.shape:
        return False
    scale = max(float(prefix.logits.abs().max()), torch.finfo(torch.float32).tiny)
    return bool(((again - prefix.logits).abs() <= RESTART_EPS * torch.finfo(torch.float32).eps * scale).all())


def _prune_range(scope: Scope, settings: ImportanceSettings) -> list[int]:
    if settings.prune_max == 0 or any(set(range(scope.routed[l])) - set(scope.options[l]) for l in scope.layers):
        return []
    half = min(scope.routed[l] // 2 for l in scope.layers)
    top = half if settings.prune_max is None else min(settings.prune_max, half)
    return list(range(0, top + 1))


def ranked(table: pd.DataFrame, scope: Scope, by: str) -> dict[str, list[int]]:
    """Routed options of each layer, least important first by column `by` (ties by option)."""
    out = {}
    for l in scope.layers:
        g = table[(table["layer"] == l) & (table["option"] < scope.routed[l])].sort_values([by, "option"])
        out[l] = [int(o) for o in g["option"]]
    return out


def pruning_ablation(order: dict[str, list[int]], n: int) -> Ablation:
    return _drop(*[(l, o) for l, os_ in order.items() for o in os_[:n]])


def _pruning(model, tokens, scope, imp, use, prune_n, settings, fast, base_loss, *, progress, stop, done_before,
             total, cache, key_parts, ray: RaySpec | None = None) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(settings.seed + 1)
    orders = {("causal", 0): ranked(imp, scope, "delta_nll"), ("usage", 0): ranked(use.fillna(0), scope, "usage")}
    for d in range(settings.prune_draws):
        orders[("random", d)] = {l: [int(o) for o in rng.permutation(scope.routed[l])] for l in scope.layers}
    ablations: dict[Ablation, int] = {}
    plan = []
    for (ranking, d), order in orders.items():
        for n in prune_n:
            ab = pruning_ablation(order, n)
            if n:
                ablations.setdefault(ab, len(ablations))
            plan.append((ranking, n, d, ab, ", ".join(f"{l}:{o}" for l, os_ in order.items() for o in os_[:n])))
    key = cache_key({**key_parts, "pruning": [a.describe() for a in ablations]})
    sums = measure(model, tokens, list(ablations), settings, fast=fast, progress=progress, stop=stop,
                   cache=cache / f"pruning-{key}.safetensors" if cache is not None else None, key=key,
                   done_before=done_before, total=total, ray=ray)
    n_pos = tokens.positions.sum()
    rows = []
    for ranking, n, d, ab, dropped in plan:
        delta = float(sums.d_nll[ablations[ab]].sum() / n_pos) if n else 0.0
        rows.append({"ranking": ranking, "n_pruned": n, "draw": d, "loss": base_loss + delta, "delta_loss": delta,
                     "dropped": dropped})
    pr = pd.DataFrame(rows)
    curve = pr.groupby(["ranking", "n_pruned"], sort=False)["loss"].agg(
        loss="mean", loss_low=lambda v: np.percentile(v, 2.5), loss_high=lambda v: np.percentile(v, 97.5),
        draws="count").reset_index()
    curve["delta_loss"] = curve["loss"] - base_loss
    return {"pruning": pr, "pruning_curve": curve}


def dataset_loss(model: Any, tokenizer: Any, data: CorpusData, settings: ImportanceSettings,
                 ablation: Ablation) -> tuple[float, float]:
    """(unablated, ablated) mean next-token NLL over the dataset's tokens as the sweep takes them."""
    run_model = float32_copy(model) if settings.float32 else model
    tokens = tokens_of(data, tokenizer, model.context, settings.max_tokens)
    with torch.inference_mode():
        sums = measure(run_model, tokens, [ablation], replace(settings, method="naive"), fast=False)
    n = tokens.positions.sum()
    return float(sums.base_nll.sum() / n), float((sums.base_nll.sum() + sums.d_nll[0].sum()) / n)


# --- Ray: batches of the sweep on workers -----------------------------------------------------------------

@dataclass(frozen=True)
class RaySpec:
    """Where Ray workers get the model: the checkpoint directory, loaded by each of `workers` actors
    in `dtype` (the dtype the effects are measured in here)."""

    checkpoint: str | Path
    workers: int
    dtype: str


class _Worker:
    """A Ray actor: the checkpoint (its files, written to a temporary directory) loaded once, then
    `_measure_batch` per batch of rows: the same computation as one process, batch by batch."""

    def __init__(self, files: dict[str, bytes], dtype: str) -> None:
        import tempfile

        from routescope.core_models.checkpoint import load_checkpoint

        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory(prefix="rs-imp-") as d:
            for name, data in files.items():
                (Path(d) / name).write_bytes(data)
            self.model, _ = load_checkpoint(d, dtype=dtype)

    def measure(self, rows: np.ndarray, x: torch.Tensor, lengths: torch.Tensor, ablations: list[Ablation],
                settings: ImportanceSettings, fast: bool) -> tuple[np.ndarray, np.ndarray, list]:
        with torch.inference_mode():
            base, effects = _measure_batch(self.model, x, lengths, ablations, settings,
                                           fast and self.model.can_resume, None)
        return rows, base, effects


def _on_ray(spec: RaySpec, todo: list, ablations: Sequence[Ablation], settings: ImportanceSettings, fast: bool,
            stop: Callable[[], bool] | None):
    """(rows, unablated NLL per row, effects) of each batch in `todo`, in the order Ray actors finish
    them (`spec.workers` actors, each with the checkpoint loaded once; a local cluster is started, and
    stopped after, unless Ray is running or RAY_ADDRESS names one). `stop()` is asked while waiting;
    True ends with `Stopped` and the batches in flight are dropped."""
    import shutil

    import ray
    from ray.util import ActorPool

    from routescope.analysis.distributed import _checkpoint_files, _connect

    started, tmp = _connect(spec.workers, 1)
    actors: list = []
    try:
        worker = ray.remote(num_cpus=1)(_Worker)
        files = ray.put(_checkpoint_files(spec.checkpoint))
        ablations_ref, settings_ref = ray.put(list(ablations)), ray.put(settings)
        actors = [worker.remote(files, spec.dtype) for _ in range(min(spec.workers, len(todo)))]
        pool = ActorPool(actors)
        for batch in todo:
            pool.submit(lambda a, b: a.measure.remote(*b, ablations_ref, settings_ref, fast), batch)
        while pool.has_next():
            if stop is not None and stop():
                raise Stopped()
            try:
                yield pool.get_next_unordered(timeout=0.5)
            except TimeoutError:
                continue
    finally:
        for a in actors:
            ray.kill(a)
        if started:
            ray.shutdown()
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
