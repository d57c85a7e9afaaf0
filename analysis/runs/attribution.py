"""Captum attributions of one next-token log-prob: to input tokens and to routing options.

`TokenAttribution(model).attribute(ids, p, token)`: layer integrated gradients
(`captum.attr.LayerIntegratedGradients`) at the token embedding, summed over the embedding
dimension: how much each input token moves log p(token | ids[:p + 1]). The baseline replaces
every token embedding by the pad token's embedding ("pad") or by zeros ("zeros"); the model still
sees the real ids, so attention masks and position embeddings are those of the input. Captum
reports the convergence delta: sum of attributions - (f(input) - f(baseline)).

Safe with a shared model instance: captum hooks the layer it attributes to, so the layer it gets
is a private stand-in for the embedding inside a private shallow replica of the model (every
parameter and other module shared, as torch's data-parallel replicas do). Nothing is ever
registered on the shared model, and captum removes its own hooks from the stand-in in a
`finally`. No gradients are accumulated on parameters (captum uses torch.autograd.grad).

Both attributions take `stop` (a callable, e.g. a threading.Event's is_set) and raise `Stopped`
before the next forward once it is true, and `progress(done, total)`: a long run on a thread of its
own can be shown and cancelled between forwards (IG: between captum's internal batches).

`PathAttribution(model).attribute(ids, p, token, method=...)`: contribution of each (layer,
option) - or of each option index across all layers (scope="global") - to the same log-prob:
- "ablation": exact, f(all options) - f(all but this option): the log-prob the option adds.
- "shapley": `captum.attr.ShapleyValueSampling` over binary option masks; the forward function
  turns a mask into an `Ablation` dropping the masked-out options. A layer must keep one option,
  so when a coalition masks out every option of a layer, that layer keeps its `fallback` option
  (0 by default). The baseline (all masked) is therefore "every routing layer reduced to its
  fallback option" (a top-k layer then routes each token to it alone: coalitions may keep fewer
  options than its top-k, `Ablation.below_top_k`), and the values sum (efficiency) to
  f(all) - f(baseline), reported as `reference_log_prob`. Permutations come from a torch.Generator
  seeded with `seed`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import pandas as pd
import torch
from torch import nn

from routescope.core_models.ablation import Ablation
from routescope.core_models.devices import model_device

from routescope.analysis.export import columns as C

BASELINES = ("pad", "zeros")
TOKEN_METHODS = ("ig",)  # TokenAttribution: layer integrated gradients
METHODS = ("ablation", "shapley")  # PathAttribution
ALL_METHODS = TOKEN_METHODS + METHODS
SCOPES = ("layer", "global")


def _ids(input_ids: Any) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise ValueError("attribution takes one non-empty sequence of token ids, shape (T,) or (1, T)")
    return ids


def _position(ids: torch.Tensor, target_position: int | None) -> int:
    T = ids.shape[1]
    p = T - 1 if target_position is None else int(target_position)
    p = p + T if p < 0 else p
    if not 0 <= p < T:
        raise ValueError(f"target position {target_position} is outside the input (0..{T - 1})")
    return p


def _target_token(model: Any, ids: torch.Tensor, p: int, target_token: int | None) -> int:
    if target_token is None:
        with torch.no_grad():
            return int(model(ids[:, : p + 1]).logits[0, p].argmax())
    if not 0 <= int(target_token) < model.vocab_size:
        raise ValueError(f"target token {target_token} is out of the vocabulary (0..{model.vocab_size - 1})")
    return int(target_token)


def _log_prob(logits: torch.Tensor, p: int, token: int) -> torch.Tensor:
    return torch.log_softmax(logits[:, p].float(), dim=-1)[:, token]  # (B,)


class Stopped(Exception):
    """An attribution stopped on request before it finished (nothing is kept of it)."""


# --- token attribution (layer integrated gradients) -------------------------------------------

class _BlendedEmbedding(nn.Module):
    """Private stand-in for the token embedding during one attribution:
    scale * embed(ids) + (1 - scale) * baseline_vector, scale given per example by the forward."""

    def __init__(self, inner: nn.Embedding, baseline: torch.Tensor) -> None:
        super().__init__()
        self.inner = inner
        self.baseline = baseline  # (d,)
        self.scale: torch.Tensor | None = None  # (N, 1, 1), set by the forward function

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.inner(ids)  # (N, T, d)
        if self.scale is None:
            return e
        return (self.scale * e + (1 - self.scale) * self.baseline.to(e.dtype)).to(e.dtype)  # a bfloat16 model stays so


def _replica(module: nn.Module) -> nn.Module:
    """Shallow copy sharing parameters, buffers and hooks, with its own child table."""
    r = module.__new__(type(module))
    r.__dict__ = module.__dict__.copy()
    r._modules = module._modules.copy()
    return r


def replica_with(model: nn.Module, path: str, replacement: nn.Module) -> nn.Module:
    """A shallow replica of `model` in which the module at `path` is `replacement`; everything
    else is the shared model's own modules and parameters. The shared model is not modified."""
    parts = path.split(".")
    root = parent = _replica(model)
    for name in parts[:-1]:
        child = _replica(parent._modules[name])
        parent._modules[name] = child
        parent = child
    parent._modules[parts[-1]] = replacement
    return root


@dataclass(frozen=True)
class TokenAttributionResult:
    input_ids: list[int]  # the input as attributed (up to and including target_position)
    target_position: int
    target_token: int
    attributions: torch.Tensor  # (T,) per-token attribution (sum over embedding dims)
    convergence_delta: float  # sum(attributions) - (target_log_prob - baseline_log_prob)
    target_log_prob: float  # f(input): log p(target_token) at target_position
    baseline_log_prob: float  # f(baseline)
    baseline: str
    n_steps: int

    @property
    def total(self) -> float:
        """What the attributions should add up to: f(input) - f(baseline)."""
        return self.target_log_prob - self.baseline_log_prob

    def frame(self, tokenizer: Any = None) -> pd.DataFrame:
        """Per input position: token id (and text with a tokenizer) and attribution."""
        df = pd.DataFrame({C.POSITION: range(len(self.input_ids)), C.TOKEN_ID: self.input_ids,
                           C.ATTRIBUTION: self.attributions.tolist()})
        if tokenizer is not None:
            df.insert(2, C.TOKEN, [tokenizer.decode([i]) for i in self.input_ids])
        return df


class TokenAttribution:
    """Integrated gradients of a next-token log-prob with respect to the token embeddings."""

    def __init__(self, model: nn.Module, *, pad_id: int | None = None) -> None:
        self.model = model
        self.embed_path = model.token_embedding()
        self.pad_id = pad_id if pad_id is not None else max(0, model.config.pad_id)

    def attribute(self, input_ids: Any, target_position: int | None = None, target_token: int | None = None, *,
                  n_steps: int = 64, baseline: str = "pad", method: str = "gausslegendre",
                  internal_batch_size: int | None = None, progress: Callable[[int, int], None] | None = None,
                  stop: Callable[[], bool] | None = None) -> TokenAttributionResult:
        """Attribute log p(target_token) at `target_position` (default: the last position; the
        token defaults to the model's top-1 there) to every input token up to that position.
        `progress(done, n_steps)` after each of captum's batches (`internal_batch_size` steps each; one
        batch of every step when None); `Stopped` before the next batch once `stop()` is true."""
        from captum.attr import LayerIntegratedGradients  # heavy: loaded when an attribution runs

        if baseline not in BASELINES:
            raise ValueError(f"baseline = {baseline!r}: expected one of {', '.join(BASELINES)}")
        if n_steps < 1:
            raise ValueError(f"n_steps = {n_steps}: must be >= 1")
        device = model_device(self.model)
        ids = _ids(input_ids).to(device)
        p = _position(ids, target_position)
        ids = ids[:, : p + 1]  # later tokens cannot affect position p (causal)
        token = _target_token(self.model, ids, p, target_token)
        inner = self.model.get_submodule(self.embed_path)
        with torch.no_grad():
            base_vec = inner.weight[self.pad_id].detach().clone() if baseline == "pad" \
                else torch.zeros(inner.embedding_dim, dtype=inner.weight.dtype, device=device)
        stand_in = _BlendedEmbedding(inner, base_vec)
        replica = replica_with(self.model, self.embed_path, stand_in)
        done = [0]  # integration steps evaluated so far (captum's batches)

        def forward(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            if stop is not None and stop():
                raise Stopped(f"stopped after {done[0]} of {n_steps} integration steps")
            stand_in.scale = scale.view(-1, 1, 1)
            try:
                return _log_prob(replica(x).logits, p, token)
            finally:
                stand_in.scale = None
                if torch.is_grad_enabled() and progress is not None:  # captum's batches (the end points: no grad)
                    done[0] = min(n_steps, done[0] + scale.shape[0])
                    progress(done[0], n_steps)

        lig = LayerIntegratedGradients(forward, stand_in)
        one, zero = torch.ones(1, 1, device=device), torch.zeros(1, 1, device=device)
        with torch.enable_grad():
            attr, delta = lig.attribute((ids, one), baselines=(ids, zero), n_steps=n_steps, method=method,
                                        internal_batch_size=internal_batch_size, return_convergence_delta=True)
        with torch.no_grad():
            f_in, f_base = float(forward(ids, one)), float(forward(ids, zero))
        return TokenAttributionResult(
            input_ids=ids[0].tolist(), target_position=p, target_token=token,
            attributions=attr.detach()[0].sum(-1).float().cpu(), convergence_delta=float(delta.reshape(-1)[0]),
            target_log_prob=f_in, baseline_log_prob=f_base, baseline=baseline, n_steps=n_steps)


# --- judging the convergence delta ------------------------------------------------------------

DELTA_SHARE = 0.05  # a delta above this share of |f(input) - f(baseline)| is large
STEP_CHOICES = (32, 64, 128, 256, 512)  # integration steps the app offers (captum's n_steps)
SHRINK = 0.5  # more steps "help" when the delta at the most steps is at most this share of the fewest's


def delta_share(delta: float, total: float) -> float:
    """|delta| as a share of |total| (inf when the total is 0 and the delta is not)."""
    if total == 0:
        return 0.0 if delta == 0 else math.inf
    return abs(delta) / abs(total)


def judge_convergence(deltas: Mapping[int, float], total: float) -> str | None:
    """A plain sentence when the convergence delta is large against the total it should match, None
    when it is within DELTA_SHARE. `deltas`: n_steps -> delta measured so far for one target; the
    judgement is of the most steps, and with two or more settings it says whether more steps shrank
    it (integration error) or not (the function jumps along the path: a hard route switching, which
    gradients do not see and no step count closes)."""
    if not deltas:
        return None
    most = max(deltas)
    share = delta_share(deltas[most], total)
    if share <= DELTA_SHARE:
        return None
    said = (f"The convergence delta ({deltas[most]:+.3f} nats at {most} steps) is {share:.0%} of the total "
            f"{total:+.3f} nats the attributions should add up to (over {DELTA_SHARE:.0%} is large): read the bars "
            f"as approximate.")
    fewest = min(deltas)
    if fewest == most:
        return said + " More integration steps shrink the integral's error: try a larger step count."
    if abs(deltas[most]) <= SHRINK * abs(deltas[fewest]):
        return said + f" It shrank from {deltas[fewest]:+.3f} at {fewest} steps: more steps should shrink it further."
    return said + (f" It barely moved from {deltas[fewest]:+.3f} at {fewest} steps, so it is not the integral's error: "
                   f"along the path from the baseline the model's output jumps (a top-k or argmax route switching), "
                   f"which gradients do not see; more steps will not close it.")


# --- path attribution (ablation, Shapley) ------------------------------------------------------

class PathAttribution:
    """Contribution of routing options (paths, blocks, experts, streams, pathways) to one
    next-token log-prob, by exact ablation or Shapley value sampling over option masks."""

    def __init__(self, model: nn.Module, *, fallback: int = 0) -> None:
        self.model = model
        self.layers = dict(model.routing_layers())
        if not self.layers:
            raise ValueError(f"{type(model).__name__} has no routing layers to attribute to")
        if any(not 0 <= fallback < n for n in self.layers.values()):
            raise ValueError(f"fallback option {fallback} does not exist in every routing layer")
        self.fallback = fallback

    def features(self, scope: str = "layer") -> list[tuple[str, int]]:
        """(layer, option) per feature; scope "global": ("*", option) for each option index."""
        if scope == "layer":
            return [(layer, o) for layer, n in self.layers.items() for o in range(n)]
        if scope == "global":
            return [("*", o) for o in range(max(self.layers.values()))]
        raise ValueError(f"scope = {scope!r}: expected one of {', '.join(SCOPES)}")

    def ablation_for(self, kept: list[bool], feats: list[tuple[str, int]]) -> Ablation:
        """The Ablation that drops every masked-out feature, keeping each layer's fallback option
        when the mask would empty the layer."""
        return self._dropping([f for f, k in zip(feats, kept) if not k])

    def _dropping(self, dropped: list[tuple[str, int]]) -> Ablation:
        drop = {(layer, o) for fl, o in dropped
                for layer in (self.layers if fl == "*" else [fl]) if o < self.layers[layer]}
        for layer, n in self.layers.items():
            if sum((layer, o) in drop for o in range(n)) == n:
                drop.discard((layer, self.fallback))
        return Ablation(drop=tuple(sorted(drop)), below_top_k=True)  # a coalition may keep fewer than top-k

    def _objective(self, ids: torch.Tensor, p: int, token: int, routing: str, seed: int,
                   feats: list[tuple[str, int]], stop: Callable[[], bool] | None) -> Callable[[list[bool]], float]:
        memo: dict[tuple[bool, ...], float] = {}

        def f(kept: list[bool]) -> float:
            key = tuple(kept)
            if key not in memo:
                if stop is not None and stop():
                    raise Stopped(f"stopped after {len(memo)} forwards")
                gen = torch.Generator().manual_seed(seed)
                with torch.no_grad():
                    out = self.model(ids, ablation=self.ablation_for(kept, feats), routing=routing, generator=gen)
                memo[key] = float(_log_prob(out.logits, p, token)[0])
            return memo[key]

        return f

    def attribute(self, input_ids: Any, target_position: int | None = None, target_token: int | None = None, *,
                  method: str = "ablation", scope: str = "layer", n_samples: int = 25, seed: int = 0,
                  routing: str = "deterministic", progress: Callable[[int, int], None] | None = None,
                  stop: Callable[[], bool] | None = None, ablations_per_forward: int = 16) -> pd.DataFrame:
        """One row per feature: layer ("*" for global scope), option, method, contribution to
        log p(target_token) at target_position, the full model's log-prob, and the reference
        log-prob (ablation: without the option; shapley: the all-masked baseline). Both call
        `progress(done, total)` (exact ablation: options ablated; Shapley: captum's evaluations,
        1 + n_samples x features) and raise `Stopped` before the next forward once `stop()` is
        true. Where the family lets rows of one call carry different ablations (transformers MoE
        models), exact ablation runs up to `ablations_per_forward` of them in one forward (thousands
        of experts: about 5x faster on a CPU at a 21-token prompt, olmoe-tiny); the log-probs equal
        the one-at-a-time forwards to float32 rounding (a batched matmul sums in another order)."""
        from captum.attr import ShapleyValueSampling  # heavy: loaded when an attribution runs

        if method not in METHODS:
            raise ValueError(f"method = {method!r}: expected one of {', '.join(METHODS)}")
        ids = _ids(input_ids).to(model_device(self.model))
        p = _position(ids, target_position)
        ids = ids[:, : p + 1]
        token = _target_token(self.model, ids, p, target_token)
        feats = self.features(scope)
        # Shapley's forwards come from captum: its objective checks `stop`; exact ablation's loop checks it
        f = self._objective(ids, p, token, routing, seed, feats, stop if method == "shapley" else None)
        full = f([True] * len(feats))
        if method == "ablation":
            rows = self._rows_per_forward(ids, routing, ablations_per_forward)
            ref: list[float] = []
            while len(ref) < len(feats):
                if stop is not None and stop():
                    raise Stopped(f"stopped after {len(ref)} of {len(feats)} ablations")
                chunk = feats[len(ref):len(ref) + rows]
                if rows == 1:
                    i = len(ref)
                    ref.append(f([j != i for j in range(len(feats))]))
                else:  # one forward, one row per ablation (the same prompt in each row)
                    with torch.no_grad():
                        out = self.model(ids.expand(len(chunk), -1),
                                         row_ablations=[self._dropping([feat]) for feat in chunk])
                    ref += _log_prob(out.logits, p, token).tolist()
                if progress is not None:
                    progress(len(ref), len(feats))
            contrib = [full - r for r in ref]
        else:
            if n_samples < 1:
                raise ValueError(f"n_samples = {n_samples}: must be >= 1")
            gen = torch.Generator().manual_seed(seed)
            evals, total = [0], 1 + n_samples * len(feats)  # captum: the baseline, then each feature per sample

            def value(mask: torch.Tensor) -> torch.Tensor:
                out = torch.tensor([f((mask[0] > 0.5).tolist())])
                evals[0] += 1
                if progress is not None:
                    progress(min(evals[0], total), total)
                return out

            svs = ShapleyValueSampling(value)
            svs.permutation_generator = lambda n, k: (torch.randperm(n, generator=gen).tolist() for _ in range(k))
            phi = svs.attribute(torch.ones(1, len(feats)), baselines=torch.zeros(1, len(feats)),
                                n_samples=n_samples, perturbations_per_eval=1)
            contrib = phi[0].tolist()
            ref = [f([False] * len(feats))] * len(feats)
        return pd.DataFrame({C.LAYER: [fl for fl, _ in feats], C.OPTION: [o for _, o in feats], C.METHOD: method,
                             C.CONTRIBUTION: contrib, C.FULL_LOG_PROB: full, C.REFERENCE_LOG_PROB: ref,
                             C.POSITION: p, C.TOKEN_ID: token})


    def _rows_per_forward(self, ids: torch.Tensor, routing: str, most: int) -> int:
        """How many ablations one forward carries: 1 where rows cannot differ (the family, or
        sampled routing, whose noise is drawn per call), else up to `most`, fewer where the rows'
        logits (every position x the vocabulary, float32) would pass LOGITS_BUDGET bytes."""
        if most < 1:
            raise ValueError(f"ablations_per_forward = {most}: must be >= 1")
        if routing != "deterministic" or not self.model.row_ablations_supported:
            return 1
        per_row = ids.shape[1] * self.model.vocab_size * 4
        return max(1, min(most, LOGITS_BUDGET // per_row))


LOGITS_BUDGET = 256 * 2**20  # bytes of logits one batched ablation forward may make


def by_size(df: pd.DataFrame) -> pd.DataFrame:
    """Rows by |contribution|, largest first (ties: in feature order), index renumbered."""
    order = df[C.CONTRIBUTION].abs().sort_values(ascending=False, kind="stable").index
    return df.loc[order].reset_index(drop=True)
