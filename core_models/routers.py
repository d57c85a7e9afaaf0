"""Routers: modules that score options per token and return a small named result."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .run_state import current
from .sites import Site


@dataclass
class Route:
    logits: torch.Tensor  # (B, T, n) raw router scores (dropped options at -inf)
    probs: torch.Tensor  # (B, T, n) noise-free softmax of the logits
    choice: torch.Tensor  # (B, T) Gumbel: the chosen option; top-k: the first choice
    weights: torch.Tensor  # (B, T, n) the weight each option's output gets (zeros where unused)
    indices: torch.Tensor | None = None  # (B, T, k) top-k routers: selected options, best first


def masked_logits(logits: torch.Tensor, dropped: frozenset[int]) -> torch.Tensor:
    if not dropped:
        return logits
    mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    mask[list(dropped)] = True
    return logits.masked_fill(mask, float("-inf"))


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy over the last axis, with the 1e-8 offset the PaPaformer reference uses."""
    return -(p * torch.log(p + 1e-8)).sum(-1)


# Keys of the Gumbel router's auxiliary terms in `LMOutput.aux` (each summed over the routing layers).
AUX_ENTROPY = "routing_entropy"  # -mean_t H(pi_t): minimising it keeps per-token routing soft
AUX_BALANCE = "load_balance"  # -H(mean_t pi_t): minimising it spreads usage over the options
AUX_Z = "router_z"  # mean_t logsumexp(z_t)^2 (ST-MoE router z-loss): keeps router logits small
GUMBEL_TAU = "gumbel_tau"  # per-call option: the Gumbel-softmax temperature of a training step
AUX_ROUTE = "route_target"  # cross-entropy of the router logits toward the call's route_targets (when asked)
ROUTE_TARGETS = "route_targets"  # per-call option: (B, T) option each token must take while training (-1: free)


def soft_routing_loss(pi: torch.Tensor) -> torch.Tensor:
    """(..., n) Gumbel-softmax probabilities -> scalar -mean H(pi): lower = softer per-token routing."""
    return -entropy(pi).mean()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """(..., n) raw router logits -> scalar mean (log sum_i exp z_i)^2 (Zoph et al. 2022, ST-MoE eq. 5):
    penalises large logits, so routing stays soft enough to keep learning."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


def balance_loss(pi: torch.Tensor) -> torch.Tensor:
    """(..., n) -> scalar -H(mean usage over all tokens): lower = more even use of the options."""
    return -entropy(pi.flatten(0, -2).mean(0))


class GumbelAux(nn.Module):
    """Sites for one layer's auxiliary terms (recorded while training, when they are computed)."""

    def __init__(self) -> None:
        super().__init__()
        self.entropy = Site("[] scalar: this layer's -mean_t H(pi_t) (nats), its AUX_ENTROPY share", pos_axis=None)
        self.balance = Site("[] scalar: this layer's -H(mean_t pi_t) (nats), its AUX_BALANCE share", pos_axis=None)
        self.z = Site("[] scalar: this layer's mean_t logsumexp(z_t)^2, its AUX_Z share (when z_loss is on)",
                      pos_axis=None)
        self.target = Site("[] scalar: this layer's cross-entropy of the logits toward route_targets, its "
                           "AUX_ROUTE share (when target_loss is on and the call gives targets)", pos_axis=None)


class GumbelRouter(nn.Module):
    """Picks one of n options per token: a hard Gumbel-softmax while training (straight-through),
    a noise-free argmax (default) or a seeded Gumbel sample at inference.

    Training (PaPaformer eqs. 8-9): pi = softmax((z + g) / tau) with g_i = -log(-log u_i), u ~ U(0, 1);
    the forward pass uses one_hot(argmax pi), the gradient flows through pi (straight-through).
    Both auxiliary terms are computed on pi and follow the paper's stated intent, soft per-token
    distributions and balanced use of the options:
      AUX_ENTROPY = -mean_t H(pi_t)    (the reference code's `entropy_loss = -mean(entropy)`)
      AUX_BALANCE = -H(mean_t pi_t)    (the reference adds +H(mean), which would reward imbalance)
    The reference evaluates both on its straight-through output, whose forward value is the hard
    one-hot (so both read ~0 and only their gradients act); we evaluate them on pi itself, which
    gives the same kind of gradient and a value that means something.
    With z_loss=True a third term, AUX_Z = mean_t logsumexp(z_t)^2 on the raw logits (ST-MoE's router
    z-loss; not in the paper), is recorded too. The temperature is `tau` unless the call gives one
    (`forward(gumbel_tau=...)`: the trainer's annealing schedule). `forward(route_targets=...)`, a
    (B, T) tensor, makes every token with a target >= 0 take that option while training (the forward
    value is its one-hot; the straight-through gradient still reaches the router through pi). With
    target_loss=True those tokens also add AUX_ROUTE, the cross-entropy of the logits toward their
    targets (a supervised router warm-up; not in the paper).
    """

    def __init__(self, in_dim: int, n_options: int, bias: bool = True, tau: float = 1.0,
                 z_loss: bool = False, target_loss: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(in_dim, n_options, bias=bias)
        self.tau = tau
        self.z_loss = z_loss
        self.target_loss = target_loss
        self.logits = Site("[batch, pos, n_options] router logits (dropped options -inf)")
        self.probs = Site("[batch, pos, n_options] noise-free softmax of the router logits")
        self.choice = Site("[batch, pos] chosen option (int64)")
        self.weights = Site("[batch, pos, n_options] weight of each candidate (one-hot at inference)")
        self.pi = Site("[batch, pos, n_options] Gumbel-softmax probabilities pi (training only)")
        self.aux = GumbelAux()

    def forward(self, x: torch.Tensor, layer: str) -> Route:
        st = current()
        logits = self.logits(masked_logits(self.proj(x), st.ablation.dropped(layer)))  # (B, T, n)
        probs = self.probs(torch.softmax(logits.float(), dim=-1).type_as(logits))
        forced = st.ablation.forced(layer)
        if forced is not None:
            choice = torch.full(logits.shape[:-1], forced, dtype=torch.long, device=x.device)
            weights = F.one_hot(choice, logits.shape[-1]).type_as(logits)
        elif st.training:
            g = _gumbel_like(logits, st.generator)
            tau = st.options.get(GUMBEL_TAU, self.tau)
            pi = self.pi(torch.softmax((logits + g) / tau, dim=-1))  # (B, T, n) eqs. 8-9
            choice = pi.argmax(-1)
            targets = st.options.get(ROUTE_TARGETS)
            if targets is not None:  # a curriculum's routes (e.g. each document's own domain path)
                targets = targets.to(choice.device)
                choice = torch.where(targets >= 0, targets, choice)
                if self.target_loss and bool((targets >= 0).any()):
                    ce = F.cross_entropy(logits.float()[targets >= 0], targets[targets >= 0])
                    _add_aux(st.aux, AUX_ROUTE, self.aux.target(ce))
            hard = F.one_hot(choice, logits.shape[-1]).type_as(pi)
            weights = hard - pi.detach() + pi  # straight-through: hard forward, soft gradient
            _add_aux(st.aux, AUX_ENTROPY, self.aux.entropy(soft_routing_loss(pi)))
            _add_aux(st.aux, AUX_BALANCE, self.aux.balance(balance_loss(pi)))
            if self.z_loss:
                _add_aux(st.aux, AUX_Z, self.aux.z(router_z_loss(logits)))
        else:
            noisy = logits + _gumbel_like(logits, st.generator) if st.routing == "sampled" else logits
            choice = noisy.argmax(-1)
            weights = F.one_hot(choice, logits.shape[-1]).type_as(logits)
        return Route(logits=logits, probs=probs, choice=self.choice(choice), weights=self.weights(weights))


def _add_aux(aux: dict[str, torch.Tensor], key: str, term: torch.Tensor) -> None:
    aux[key] = aux[key] + term if key in aux else term


def _gumbel_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    # drawn on the CPU (the call's generator is a CPU one): the same seed gives the same noise, and so
    # the same sampled routes, on every device
    u = torch.rand(x.shape, generator=generator, dtype=torch.float32).clamp_(1e-10, 1.0 - 1e-7)
    return (-torch.log(-torch.log(u))).to(device=x.device, dtype=x.dtype)


class TopKRouter(nn.Module):
    """Token-level top-k: a linear score per option, the k best kept, their softmax weights
    renormalised over the selected ones (unselected options get weight 0)."""

    def __init__(self, in_dim: int, n_options: int, k: int, bias: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(in_dim, n_options, bias=bias)
        self.k = k
        self.logits = Site("[batch, pos, n_options] router logits (dropped options -inf)")
        self.probs = Site("[batch, pos, n_options] softmax of the router logits")
        self.indices = Site("[batch, pos, k] selected options, best first (int64)")
        self.weights = Site("[batch, pos, k] renormalised weights of the selected options")

    def forward(self, x: torch.Tensor, layer: str) -> Route:
        st = current()
        n = self.proj.out_features
        dropped = st.ablation.dropped(layer)
        logits = self.logits(masked_logits(self.proj(x), dropped))  # (B, T, n)
        probs = self.probs(torch.softmax(logits.float(), dim=-1).type_as(logits))
        forced = st.ablation.forced(layer)
        k = min(self.k, n - len(dropped))
        if forced is not None:
            idx = torch.full((*logits.shape[:-1], 1), forced, dtype=torch.long, device=x.device)
            w = torch.ones(idx.shape, dtype=logits.dtype, device=x.device)
        else:
            idx = logits.topk(k, dim=-1).indices  # (B, T, k); logits, so dropped (-inf) never tie
            top = probs.gather(-1, idx)
            w = top / top.sum(-1, keepdim=True)
        # no auxiliary loss here: the family picks its balance term from the Route (moep.py)
        idx, w = self.indices(idx), self.weights(w)
        dense = torch.zeros_like(probs).scatter(-1, idx, w)  # (B, T, n)
        return Route(logits=logits, probs=probs, choice=idx[..., 0], weights=dense, indices=idx)
