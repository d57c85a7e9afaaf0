"""Measuring ablations on batches of the dataset's rows: each ablated run's effects (delta NLL, KL,
top-1 flips) against the unablated one, position by position, and the usage, gate-weighted usage
and REAP proxies read from the unablated run (package doc).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch

from routescope.core_models.ablation import Ablation
from routescope.core_models.sites import INDICES, OPTION_WEIGHTS, WEIGHTS
from routescope.core_models.trace import tracing

from routescope.analysis.corpus.run import Stopped
from routescope.analysis.reports.importance.plan import ImportanceSettings, Scope, Tokens, batches


CHUNK_LOGITS = 2**20  # float32 logits reduced at once (4 MiB: 256 positions of a 4,096 vocabulary; in cache)
MIN_CHUNK = 256  # positions a chunk takes at least: at a 50,304 vocabulary 2**20 logits were 20 positions, and
# each chunk reads the whole output embedding (412 MB at OLMoE-1B-7B's shape) again


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
        self.chunk = max(MIN_CHUNK, CHUNK_LOGITS // z.shape[-1])
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
    """The earliest routing layer an ablation drops in: a resumed forward starts there."""
    order = list(model.routing_layers())
    return min((l for l, _ in ab.drop), key=order.index)


def measure_batch(model: Any, x: torch.Tensor, lengths: torch.Tensor, ablations: Sequence[Ablation],
                   settings: ImportanceSettings, fast: bool, stop: Callable[[], bool] | None,
                   on_prefix: Callable[[Any, Any], None] | None = None,
                   tick: Callable[[int, int], None] | None = None, reuse: bool = False) -> tuple[np.ndarray, list]:
    """(unablated NLL per row, [(d_nll, kl, flips) per row for each ablation]) of one batch.
    `tick(work done, work of the batch)` after each ablated forward: a batch of a 128 x 24 model is
    3,072 forwards (78 s on a CPU), too long to wait for a first progress report. Work is counted in
    routing layers resumed plus one for the head, as a resumed forward costs: on that model (4 rows,
    shared CPU) a least-squares fit of each layer's median forward gave 5.5 ms a layer and 6.7 ms
    for the head; counted in forwards, the time left read 1.5x too long after 10 s. `reuse` (prefix
    reuse only; `reuse_reproduces` said yes): each layer's experts outputs are computed once per batch
    (`HFModel.expert_outputs`) and a resumed forward's ablated layer runs only the experts its
    ablation brings in (`HFModel.resume`'s `expert_outputs`)."""
    x = x.to(model.device)
    R = x.shape[0]
    prefix = model.capture(x) if model.can_resume else None
    if prefix is not None:
        base = prefix.logits
    else:
        with tracing(usage_sites(model)) as tr:
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
        order = list(model.routing_layers())
        cost = {layer: len(order) - order.index(layer) + 1 for layer in groups}  # layers resumed + the head
        work, k = sum(-(-len(js) // per) * cost[layer] for layer, js in groups.items()), 0
        for layer, js in groups.items():
            slots = model.expert_outputs(prefix, layer) if reuse and model.can_recombine(layer) else None
            for s in range(0, len(js), per):
                if stop is not None and stop():
                    raise Stopped()
                part = js[s:s + per]
                hidden = model.resume(prefix, layer, [ablations[j] for j in part for _ in range(R)], head=False,
                                      expert_outputs=slots)
                for i, j in enumerate(part):
                    out[j] = pos.effects_of_hidden(hidden[i * R:(i + 1) * R])
                k += cost[layer]
                if tick is not None:
                    tick(k, work)
    else:
        for j, ab in enumerate(ablations):
            if stop is not None and stop():
                raise Stopped()
            out[j] = pos.effects(model(x, ablation=ab).logits)
            if tick is not None:
                tick(j + 1, len(ablations))
    return pos.per_row(pos.nll), out


def usage_sites(model: Any) -> list[str]:
    """The routing sites the proxies read: each layer's indices, weights or option weights."""
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


def resume_agrees(model: Any, tokens: Tokens, settings: ImportanceSettings) -> bool:
    """`restart_reproduces` on the sweep's first batch."""
    rows, x, _ = batches(tokens, settings.batch_size, max(0, int(getattr(model.config, "pad_id", 0))))[0]
    return restart_reproduces(model, x)


def reuse_agrees(model: Any, tokens: Tokens, settings: ImportanceSettings) -> bool:
    """`reuse_reproduces` on the first row of the sweep's first batch."""
    _, x, _ = batches(tokens, settings.batch_size, max(0, int(getattr(model.config, "pad_id", 0))))[0]
    return reuse_reproduces(model, x[:1])


def reuse_reproduces(model: Any, x: torch.Tensor) -> bool:
    """Whether a resumed forward whose ablated layer is answered from the captured experts outputs
    (`measure_batch`'s `reuse`) equals one that runs that layer's experts, within `RESTART_EPS` float32
    eps of the logits' scale, on `x`, expert 0 dropped at each routing layer that `can_recombine` (an
    experts call that is not a weighted sum of per-expert outputs fails). False where no layer can."""
    checked = False
    with torch.inference_mode():
        x = x.to(model.device)
        prefix = model.capture(x)
        for layer in model.routing_layers():
            ab = Ablation(drop=((layer, 0),))
            if not model.can_recombine(layer):
                continue
            try:
                model._check_ablation(ab)
            except ValueError:
                continue
            want = model.resume(prefix, layer, [ab] * x.shape[0])
            got = model.resume(prefix, layer, [ab] * x.shape[0], expert_outputs=model.expert_outputs(prefix, layer))
            scale = max(float(want.abs().max()), torch.finfo(torch.float32).tiny)
            if not bool(((got - want).abs() <= RESTART_EPS * torch.finfo(torch.float32).eps * scale).all()):
                return False
            checked = True
    return checked


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
