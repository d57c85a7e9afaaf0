"""PaPaformer (Tapaninaho & Oussalah, 2025): parallel paths of lower width between full layers.

embed -> full blocks (d) -> shrink d->d' -> N parallel layers of k blocks (d') -> grow to d
      -> full blocks (d) -> norm -> head

Presets follow the paper's Tables 2 and 6: N = 3 parallel layers of k = 2 paths (the reference
train.py composes layers 1-3 from 3-layer path models). Paper-scale configuration and counts:
paper_configs.py.

Grow connection. Share-Linear (the paper's model, `fused_grow=True` in its preset): the last parallel
layer's Share maps the concatenated path outputs k*d' -> d in one linear map, as the reference
Paformer_lin.py does (`ParallelLayer(args_paraller, args.dim)`: Share = Linear(k*d', d)); with
d = k*d' it can carry every path's output into the full-width stream unchanged. `fused_grow=False`
(a k*d' -> d' Share, then d' -> d: a rank-d' bottleneck that is not the paper's model) is kept only so
that checkpoints made with it still load. Gumbel v1/v2: the routed output is d' wide, so the last
layer grows it d' -> d (the reference's `out_linear`).

Combiners: `share_linear` (linear over the concatenated path outputs), `gumbel_v1` (router reads the
combined representation), `gumbel_v2` (router reads the concatenation). Gumbel output is
sum_i pi_i f_i(x) + pi_comb x_comb (eqs. 3, 7), with pi a hard one-hot (straight-through while
training). At inference the route is the noise-free argmax (§5.4.1) unless the call asks for
`routing="sampled"`, the reference code's seeded Gumbel draw.

Blocks: the presets' are LLaMA blocks (§3.1: RMSNorm, SwiGLU, RoPE, attention output projection);
`attn_out_proj=False, swiglu_beta=True, rope="interleaved", norm_eps=1e-5` give the reference code's
block, which the paper-scale entries (paper_configs.py) and the importer use.

Auxiliary terms (Gumbel, training; routers.GumbelRouter): on the Gumbel-softmax pi of eqs. 8-9,
per layer -mean_t H(pi_t) (soft per-token routing, the paper's stated aim and the reference's
`entropy_loss = -mean(entropy)`) and -H(mean_t pi_t) (balanced use: the stated intent; the
reference code adds +H(mean), which would reward imbalance). Eqs. 8-9 as printed are +mean_t H and
+H(mean), added with +lambda (eq. 10): they would sharpen routing and reward imbalance, against the
text's aims; ours are their negatives, over all k + 1 options of pi (eqs. 8-9 sum over the k paths). Each is recorded at
`parallel.{i}.router.aux.entropy` / `.aux.balance` and summed over layers with weight aux_lambda
(the balance term: balance_lambda when set). Optional, not in the paper: ST-MoE's router z-loss
(`z_lambda` > 0, site `.aux.z`) and a supervised router warm-up, the cross-entropy of the router
logits toward a call's route_targets (`route_target_lambda` > 0, site `.aux.target`). Training
recipes (temperature annealing, router warm-up with frozen paths, domain routes) live in the
trainer's TrainConfig; checkpoints/experiments/gumbel-routing.md measures them.

Ablation semantics (routing layer `parallel.{i}`, options 0..k-1 = paths, k = combined):
- drop path j: its block is not run; its slot in the concatenation is zeros; Gumbel routers also
  never pick it (logit -inf). Dropping option k (Gumbel) forbids the combined representation.
- force j: Gumbel layers route every token to option j; Share-Linear layers keep only path j.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .base import RouteScopeLM, RunOption
from .config import BaseConfig
from .layers import ROPES, Block, BlockSpec, RMSNorm, init_weights
from .routers import AUX_BALANCE, AUX_ENTROPY, AUX_ROUTE, AUX_Z, GUMBEL_TAU, ROUTE_TARGETS, GumbelRouter
from .run_state import current
from .sites import CHOICE, COMBINED, LOGITS, OPTION_WEIGHTS, PATHS, PROBS, RoutingLayer, Site, site_name

COMBINERS = ("share_linear", "gumbel_v1", "gumbel_v2")


@dataclass(frozen=True)
class PapaformerConfig(BaseConfig):
    family = "papaformer"
    vocab_size: int = 4096
    d_model: int = 128  # d: width of the full layers
    d_par: int = 64  # d': width of every parallel block
    n_heads: int = 4
    n_par_heads: int = 2
    n_large_pre: int = 1
    n_parallel_layers: int = 2  # N
    n_paths: int = 2  # k blocks per parallel layer
    n_large_post: int = 1
    combiner: str = "share_linear"
    ffn_mult: int = 4  # SwiGLU inner width = ffn_mult * width (the paper hard-codes 4)
    context: int = 256
    tie_embeddings: bool = True
    gumbel_tau: float = 1.0
    aux_lambda: float = 0.01  # weight of each Gumbel aux term (reference: lambda_entropy = lambda_load = 0.01)
    balance_lambda: float | None = None  # weight of the balance term alone (None: aux_lambda)
    z_lambda: float = 0.0  # > 0: add ST-MoE's router z-loss with this weight (not in the paper)
    route_target_lambda: float = 0.0  # > 0: router cross-entropy toward a call's route_targets (not in the paper)
    # options that express the paper's reference code exactly (defaults: RouteScope's own models)
    rope: str = "half"
    attn_out_proj: bool = True
    swiglu_beta: bool = False
    norm_eps: float = 1e-6
    pad_id: int = -1  # >= 0: tokens equal to pad_id are masked as attention keys
    parallel_residual: bool = False  # x + combined instead of combined (the paper has none)
    fused_grow: bool = False  # Share-Linear: last Share maps k*d' -> d (the paper's; False: rank-d' legacy)
    router_bias: bool = True

    def validate(self) -> None:
        self.positive("vocab_size", "d_model", "d_par", "n_heads", "n_par_heads", "n_parallel_layers",
                      "ffn_mult", "context")
        self.require(self.n_paths >= 2, "n_paths", "a parallel layer needs at least 2 paths")
        self.require(self.n_large_pre >= 0, "n_large_pre", "must be >= 0")
        self.require(self.n_large_post >= 0, "n_large_post", "must be >= 0")
        for f, d, h in (("n_heads", self.d_model, self.n_heads), ("n_par_heads", self.d_par, self.n_par_heads)):
            self.require(d % h == 0 and (d // h) % 2 == 0, f, f"must divide width {d} into even head dims")
        self.one_of("combiner", COMBINERS)
        self.one_of("rope", ROPES)
        self.require(self.gumbel_tau > 0, "gumbel_tau", "must be > 0")
        for f in ("aux_lambda", "balance_lambda", "z_lambda", "route_target_lambda"):
            v = getattr(self, f)
            self.require(v is None and f == "balance_lambda" or v is not None and v >= 0, f, "must be >= 0")
        self.require(self.norm_eps > 0, "norm_eps", "must be > 0")
        self.require(self.pad_id < self.vocab_size, "pad_id", "must be < vocab_size (or -1 for none)")
        self.require(not (self.fused_grow and self.combiner != "share_linear"), "fused_grow",
                     "only the share_linear combiner can fuse the grow projection")

    def spec(self, dim: int, heads: int) -> BlockSpec:
        return BlockSpec(dim=dim, n_heads=heads, n_kv_heads=heads, ffn="swiglu", ffn_hidden=self.ffn_mult * dim,
                         norm="rms", norm_eps=self.norm_eps, rope=self.rope, context=self.context,
                         attn_out_proj=self.attn_out_proj, swiglu_beta=self.swiglu_beta)

    @property
    def label(self) -> str:
        return f"papaformer-{self.combiner.replace('_', '-')}"  # as the presets are named

    @property
    def has_combined_route(self) -> bool:
        """Whether a parallel layer can route a token to the combined representation (the Gumbel
        combiners' extra option, route k + 1 of Table 6); Share-Linear only blends its paths."""
        return self.combiner != "share_linear"

    @property
    def n_options(self) -> int:
        return self.n_paths + self.has_combined_route


class Path(nn.Module):
    """One parallel block; `out` records its output."""

    def __init__(self, spec: BlockSpec) -> None:
        super().__init__()
        self.block = Block(spec)
        self.out = Site("[batch, pos, d_par] output of this path's block")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(x))


class ParallelLayer(RoutingLayer):
    """Routing layer `parallel.{i}`: options 0..k-1 are the paths, k (Gumbel combiners) the combined
    representation."""

    option_noun = "path"

    def __init__(self, c: PapaformerConfig, out_dim: int, grow: bool) -> None:
        super().__init__()
        self.n_options = c.n_options
        self.can_force = self.stochastic = c.combiner != "share_linear"  # a Gumbel router decides
        self.combiner = c.combiner
        self.residual = c.parallel_residual
        self.paths = nn.ModuleList(Path(c.spec(c.d_par, c.n_par_heads)) for _ in range(c.n_paths))
        k, dp = c.n_paths, c.d_par
        if c.combiner == "share_linear":
            self.combine = nn.Linear(k * dp, out_dim, bias=False)
            self.router = None
        else:
            self.combine = nn.Linear(k * dp, dp, bias=c.router_bias)
            router_in = dp if c.combiner == "gumbel_v1" else k * dp
            self.router = GumbelRouter(router_in, k + 1, bias=c.router_bias, tau=c.gumbel_tau, z_loss=c.z_lambda > 0,
                                       target_loss=c.route_target_lambda > 0)
            self.routed = Site("[batch, pos, d_par] router-weighted sum of the candidates (before grow)")
        self.combined = Site("[batch, pos, d_par] combined representation (Share-Linear: the layer output; "
                             "d_model wide in the last layer when fused_grow)")
        self.grow = nn.Linear(dp, c.d_model, bias=False) if grow else None
        self.out = Site("[batch, pos, width] layer output as passed on (after grow in the last layer)")

    def option_labels(self) -> list[str]:
        return [f"path {j}" for j in range(len(self.paths))] + ["combined"] * (self.router is not None)

    @property
    def roles(self) -> dict[str, str]:
        """The combined representation, and a Gumbel router's sites; Share-Linear has no router (its
        routes are read from the path and combined outputs by cosine dominance)."""
        roles = {COMBINED: site_name(self.name, "combined")}
        if self.router is not None:
            rel = {LOGITS: "logits", PROBS: "probs", CHOICE: "choice", OPTION_WEIGHTS: "weights"}
            roles.update({role: site_name(self.name, "router", s) for role, s in rel.items()})
        return roles

    @property
    def option_roles(self) -> dict[str, tuple[str, ...]]:
        """Each path's output (the combined candidate of a Gumbel layer is COMBINED)."""
        return {PATHS: tuple(site_name(self.name, "paths", j, "out") for j in range(len(self.paths)))}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Share-Linear has no router: forcing a path drops the others; a Gumbel router gets the force
        dropped = self.dropped() if self.router is not None else self.skipped()
        outs = [torch.zeros_like(x) if j in dropped else p(x) for j, p in enumerate(self.paths)]  # k x (B, T, d')
        st = current()
        targets = st.options.get(ROUTE_TARGETS) if st.training and self.router is None else None
        if targets is not None:  # Share-Linear curriculum: a token with a target keeps only that path's output
            outs = [o * ((targets == j) | (targets < 0)).unsqueeze(-1).to(o.dtype) for j, o in enumerate(outs)]
        cat = torch.cat(outs, dim=-1)  # (B, T, k*d')
        comb = self.combined(self.combine(cat))
        if self.router is None:
            y = comb
        else:
            route = self.router(comb if self.combiner == "gumbel_v1" else cat, self.name)
            cands = torch.stack(outs + [comb], dim=-2)  # (B, T, k+1, d')
            y = self.routed((route.weights.unsqueeze(-1) * cands).sum(-2))  # (B, T, d')
        if self.residual:
            y = y + x
        if self.grow is not None:
            y = self.grow(y)
        return self.out(y)


def parallel_layer(i: int) -> str:
    """The routing layer name (module path) of a PaPaformer's parallel layer i, from 0 (`Papaformer.parallel`):
    how the paper's printed routes (Table 6), which come without a model, name their layers."""
    return site_name("parallel", i)


class Papaformer(RouteScopeLM):
    def __init__(self, config: PapaformerConfig) -> None:
        super().__init__()
        c = self.config = config
        self.context, self.vocab_size = c.context, c.vocab_size
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.large_pre = nn.ModuleList(Block(c.spec(c.d_model, c.n_heads)) for _ in range(c.n_large_pre))
        self.shrink = nn.Linear(c.d_model, c.d_par, bias=False)
        last = c.n_parallel_layers - 1
        self.parallel = nn.ModuleList(
            ParallelLayer(c, c.d_model if (i == last and c.fused_grow) else c.d_par, grow=(i == last and not c.fused_grow))
            for i in range(c.n_parallel_layers))
        self.large_post = nn.ModuleList(Block(c.spec(c.d_model, c.n_heads)) for _ in range(c.n_large_post))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        init_weights(self)
        if c.tie_embeddings:
            self.head.weight = self.embed.weight
        self._finalize()

    def aux_weights(self) -> dict[str, float]:
        c = self.config
        balance = c.aux_lambda if c.balance_lambda is None else c.balance_lambda
        return {AUX_ENTROPY: c.aux_lambda, AUX_BALANCE: balance, AUX_Z: c.z_lambda, AUX_ROUTE: c.route_target_lambda}

    def run_options(self) -> dict[str, RunOption]:
        """Options only training sets (the trainer's warm-up and annealing); a Gumbel combiner takes
        its temperature too."""
        targets = RunOption(ROUTE_TARGETS, "(batch, pos) option every token must take in every parallel layer while "
                                           "training, -1 = free (the trainer's domain-route warm-up); Share-Linear: the "
                                           "token keeps only that path's output", object, offered=False)
        tau = RunOption(GUMBEL_TAU, "Gumbel-softmax temperature of a training call (the trainer's annealing schedule); "
                                    "default: the config's gumbel_tau", float, offered=False)
        return {o.name: o for o in ([targets] if self.config.combiner == "share_linear" else [tau, targets])}

    def _forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.config.pad_id >= 0:
            _set_pad_mask(idx, self.config.pad_id)
        x = self.embed(idx)  # (B, T, d)
        for block in self.large_pre:
            x = block(x)
        x = self.shrink(x)  # (B, T, d')
        for layer in self.parallel:
            x = layer(x)
        for block in self.large_post:  # (B, T, d)
            x = block(x)
        return self.head(self.norm(x)).float()  # (B, T, V)


def _set_pad_mask(idx: torch.Tensor, pad_id: int) -> None:
    """Mask pad tokens as attention keys for this call (and remember them in the KV cache)."""
    st = current()
    pad = idx == pad_id  # (B, T)
    if st.cache is not None:
        prev = st.cache.extra.get("pad_mask")
        pad = pad if prev is None else torch.cat((prev, pad), dim=1)
        st.cache.extra["pad_mask"] = pad
    if pad.any():
        st.pad_mask = pad


def papaformer_param_count(c: PapaformerConfig) -> int:
    def block(d: int) -> int:
        h = c.ffn_mult * d
        return 3 * d * d + (d * d if c.attn_out_proj else 0) + 3 * d * h + (h if c.swiglu_beta else 0) + 2 * d

    k, dp, d = c.n_paths, c.d_par, c.d_model
    total = c.vocab_size * d * (1 if c.tie_embeddings else 2) + d  # embeddings/head, final norm
    total += (c.n_large_pre + c.n_large_post) * block(d) + d * dp  # full blocks, shrink
    for i in range(c.n_parallel_layers):
        last = i == c.n_parallel_layers - 1
        total += k * block(dp)
        if c.combiner == "share_linear":
            total += k * dp * (d if last and c.fused_grow else dp)
        else:
            router_in = dp if c.combiner == "gumbel_v1" else k * dp
            total += k * dp * dp + (k + 1) * router_in + ((dp + k + 1) if c.router_bias else 0)
        if last and not c.fused_grow:
            total += dp * d
    return total
