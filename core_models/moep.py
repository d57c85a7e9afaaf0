"""MoEP (Modular Expert Paths, Tapaninaho, BabyLM 2025): a mixture of parallel blocks between
token-level mixture-of-experts width changes.

embed (wte + wpe) -> n_pre blocks (d) -> moe_shrink: top-k of E experts d -> d'
      -> N parallel layers: sum_{j in topk} w_j * block_j(x), P blocks of width d', w renormalised
      -> moe_grow: top-k of E experts d' -> d -> n_post blocks (d) -> ln_f -> head (tied to wte)

Blocks are GPT-2 style (LayerNorm, learned positions, no RoPE, no linear biases) with the FFN of
Table 2's "FF type": an exact-GELU MLP (hidden 4d) in MoEP, SwiGLU in MoEP-SwiGLU (`ffn`), in every
full and parallel block alike; the experts' type is Table 2's separate "MoE FF type" (`expert`).
Every router is a `TopKRouter`: softmax over its options, the k best kept, their weights
renormalised to sum to 1. An expert only sees the tokens that selected it (gather, then
`index_add_`). A parallel block is causal attention over the whole sequence, so it runs on all
tokens; without a KV cache it is skipped when no token of the batch selected it (its weight is 0
everywhere, so the result is the same). With a KV cache every non-dropped block runs on every call,
so its cache stays complete. The shrink/grow layers change width and have no residual.

Choices where the paper is ambiguous or self-contradictory (each is a row of the README's
deviations table):
- Parallel layer = the routed blocks' outputs summed, each weighted by its top-k probability
  renormalised over the selected blocks (§3.3 says only "summed up together": an unweighted sum
  would give the routers no gradient from the LM loss). Each block already carries its own residual
  (x + attn + ffn), so the layer adds none: with weights summing to 1 and zeroed blocks the layer is
  the identity (an extra "x +", or an unweighted sum of k blocks, would grow the stream per layer,
  2^N at the paper's N = 10). The shrink / grow experts are weighted the same way.
- Balance loss ("balance" = "entropy", the default): eq. 2's entropy of the batch-mean routing
  distribution p_mean (noise-free softmax over all n options, mean over tokens). Read literally
  (+lambda * H added to the loss, eq. 3) minimising it would favour collapse, against §3.4's stated
  aim of avoiding it; we follow the stated intent: each router adds
  lambda * (log n - H(p_mean)), the entropy with the sign the intent needs, shifted by the constant
  log n so the term is 0 exactly at balanced use (the shift changes no gradient). "switch" offers the
  Switch Transformer term n * sum_i f_i * P_i (f_i: share of the token's k selections that went to
  i) instead, for comparison; it is not the paper's.
- lambda per router: every router (moe_shrink, each parallel.{i}, moe_grow) has its own term,
  weighted by its own lambda (aux_lambda for the parallel routers, expert_aux_lambda for the
  shrink/grow routers) and summed, not averaged over routers. Keys: `aux_key(layer)`.
- Table 2's "FF multiplier 4" for SwiGLU (`ffn="swiglu"`): the blocks' hidden width is 2/3 * 4d,
  rounded up to a multiple of 32 (the LLaMA convention, which keeps the MLP's 8 d^2 parameters;
  1024 at d_L = 384, 512 at d_P = 192), the experts' 4 * d_L (expert_hidden = 0; shrink and grow
  alike). With Table 2's other values this counts 38,218,944 (Table 2: 38M). Read literally (hidden
  4d in the blocks too, `swiglu_reading="literal"`) it counts 45.30M; literal blocks with experts
  of hidden 2/3 * 4 * d_P = 512 also count 38,218,944, so the count alone cannot tell those two
  readings apart (paper_configs.py shows all three).
- moe_shrink/moe_grow normalise their input (LayerNorm, d and d' weights) before routing: without it
  the signal through two multiplicative (SwiGLU) width changes with no residual shrinks to ~1e-11
  at init. Not in the paper's description; adds d + d' parameters.
Presets (`moep`, `moep-swiglu`) keep Table 2's d_L / d_P = 2, P = 4 blocks with top-2, E = 4
experts with top-2, one full block before and after, the FF types and SwiGLU expert hidden 4 * d_L,
at d = 128, d' = 64 with head size 32 in both widths (Table 2: 64), context 256 (Table 2's train
seq len: 512) and N = 2 parallel layers instead of 10 (CPU training budget). The paper-scale
configurations are in `paper_configs.py`.

Routing layers (names for `Ablation` and `routing_layers()`): "moe_shrink" and "moe_grow"
(options = n_experts experts), "parallel.{i}" (options = n_blocks blocks).
Ablation semantics:
- drop j: its router logit is -inf, so it is never selected and never computed (also not with
  a cache); top-k picks among the rest, k shrinking to the number left if fewer remain.
- force j: every token routes to j alone with weight 1 (other experts never run; other parallel
  blocks run only with a cache, at weight 0).
Keep one ablation for a whole cached generation: a block dropped in some steps only would miss
those positions in its KV cache.

Sites (besides each router's logits / probs / indices / weights):
  moe_shrink.experts.{e}.out [batch, pos, d_par], moe_grow.experts.{e}.out [batch, pos, d_model]:
      expert e's own output (unweighted) for the tokens that routed to it, 0 for the others (and
      everywhere when e is dropped); recorded only when asked for, and an edit reaches only the
      tokens that routed to e,
  moe_shrink.out [batch, pos, d_par], moe_grow.out [batch, pos, d_model]: sum_e w_e * expert_e,
  parallel.{i}.blocks.{j}.out [batch, pos, d_par]: block j's own output x + attn + ffn (all
      tokens; fires only when block j runs),
  parallel.{i}.combined [batch, pos, d_par]: sum_j w_j * block_j(x) over the selected blocks,
  parallel.{i}.out [batch, pos, d_par]: the layer output (= combined: no residual outside blocks).
A token's contribution from block j (expert e) is its weight from router.weights times the
recorded output.

active_params() = num_params - N * (P - top_k) * block(d')
                             - (E - expert_top_k) * (expert(d -> d') + expert(d' -> d)):
everything (embeddings, routers, norms, full blocks) except the blocks/experts a token skips.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import RouteScopeLM
from .config import BaseConfig
from .layers import Block, BlockSpec, init_weights, scaled_residual_init
from .pgpt import GPTEmbedding
from .routers import Route, TopKRouter
from .run_state import current
from .sites import COMBINED, INDICES, LOGITS, PATHS, PROBS, WEIGHTS, RoutingLayer, Site, site_name
from .trace import active_trace

EXPERTS = ("linear", "swiglu")
BLOCK_FFNS = ("gelu", "swiglu")  # Table 2 "FF type": MLP (GPT-2's GELU) or SwiGLU
SWIGLU_READINGS = ("two_thirds", "literal")  # SwiGLU block hidden: 2/3 * 4d (multiple of 32) or 4d
BALANCE_LOSSES = ("entropy", "switch")  # entropy: the paper's eq. 2 (stated intent); switch: Fedus et al.
AUX_BALANCE = "balance"  # prefix of every router's balance term in LMOutput.aux


def aux_key(layer: str) -> str:
    """Key of a routing layer's balance term in `LMOutput.aux`, e.g. "balance.parallel.0"."""
    return f"{AUX_BALANCE}.{layer}"


@dataclass(frozen=True)
class MoEPConfig(BaseConfig):
    family = "moep"
    vocab_size: int = 4096
    d_model: int = 128  # d_L: width of the full layers
    d_par: int = 64  # d_P: width of every parallel block
    n_heads: int = 4
    n_par_heads: int = 2
    n_pre: int = 1
    n_post: int = 1
    n_parallel_layers: int = 2  # N
    n_blocks: int = 4  # P blocks per parallel layer
    top_k: int = 2  # blocks per token in a parallel layer
    n_experts: int = 4  # E experts in moe_shrink and in moe_grow
    expert_top_k: int = 2
    expert: str = "linear"  # linear: one Linear; swiglu: down(silu(gate(x)) * up(x))
    expert_hidden: int = 0  # swiglu experts' hidden width; 0: 4 * d_model (the paper's 4 d_L)
    # FFN of every full and parallel block; "gelu" (the default) is what configs without it were trained with
    ffn: str = "gelu"
    swiglu_reading: str = "two_thirds"  # hidden of SwiGLU blocks: see SWIGLU_READINGS and the docstring
    context: int = 256
    tie_embeddings: bool = True
    balance: str = "entropy"  # balance term per router: see BALANCE_LOSSES
    aux_lambda: float = 0.01  # lambda of each parallel layer's router
    expert_aux_lambda: float = 0.01  # lambda of the moe_shrink and moe_grow routers
    ln_bias: bool = False
    gelu_approx: str = "none"

    def validate(self) -> None:
        self.positive("vocab_size", "d_model", "d_par", "n_heads", "n_par_heads", "n_parallel_layers",
                      "n_blocks", "top_k", "n_experts", "expert_top_k", "context")
        self.require(self.n_pre >= 0, "n_pre", "must be >= 0")
        self.require(self.n_post >= 0, "n_post", "must be >= 0")
        self.require(self.top_k <= self.n_blocks, "top_k", f"must be <= n_blocks ({self.n_blocks})")
        self.require(self.expert_top_k <= self.n_experts, "expert_top_k", f"must be <= n_experts ({self.n_experts})")
        for f, d, h in (("n_heads", self.d_model, self.n_heads), ("n_par_heads", self.d_par, self.n_par_heads)):
            self.require(d % h == 0, f, f"must divide width {d} into whole head dims")
        self.one_of("expert", EXPERTS)
        self.one_of("ffn", BLOCK_FFNS)
        self.one_of("swiglu_reading", SWIGLU_READINGS)
        self.one_of("balance", BALANCE_LOSSES)
        self.require(self.expert_hidden >= 0, "expert_hidden", "must be >= 0 (0: 4 * d_model)")
        for f in ("aux_lambda", "expert_aux_lambda"):
            self.require(math.isfinite(getattr(self, f)) and getattr(self, f) >= 0, f, "must be a finite number >= 0")
        self.one_of("gelu_approx", ("none", "tanh"))

    def block_hidden(self, dim: int) -> int:
        """Hidden width of the FFN of a block of width `dim` (see the docstring for the readings)."""
        if self.ffn == "swiglu" and self.swiglu_reading == "two_thirds":
            return -(-(2 * 4 * dim // 3) // 32) * 32
        return 4 * dim

    def spec(self, dim: int, heads: int) -> BlockSpec:
        return BlockSpec(dim=dim, n_heads=heads, n_kv_heads=heads, ffn=self.ffn, ffn_hidden=self.block_hidden(dim),
                         norm="layer",
                         norm_eps=1e-5, norm_bias=self.ln_bias, rope="none", context=self.context,
                         gelu_approx=self.gelu_approx)

    @property
    def hidden(self) -> int:
        return self.expert_hidden or 4 * self.d_model


# --- balance terms -------------------------------------------------------------------------------

def entropy_balance(probs: torch.Tensor) -> torch.Tensor:
    """log n - H(mean over tokens of probs): 0 at balanced use, log n when one option takes all."""
    mean = probs.float().flatten(0, -2).mean(0)  # (n,)
    return math.log(mean.numel()) - torch.special.entr(mean).sum()


def switch_balance(probs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """n * sum_i f_i * P_i (Switch Transformer): f_i = share of the top-k selections that chose i."""
    n = probs.shape[-1]
    frac = F.one_hot(indices, n).float().flatten(0, -3).sum(-2).mean(0) / indices.shape[-1]  # (n,)
    return n * (frac * probs.float().flatten(0, -2).mean(0)).sum()


def add_balance_term(c: MoEPConfig, layer: str, route: Route) -> None:
    """While training: store this router's balance term (unweighted) under aux_key(layer)."""
    st = current()
    if st.training:
        term = entropy_balance(route.probs) if c.balance == "entropy" else switch_balance(route.probs, route.indices)
        st.aux[aux_key(layer)] = term


def _through_site(site: Site, out: torch.Tensor, tok: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """Pass the (n_e, out) rows of the tokens `tok` through `site` as a dense (B, T, out) tensor,
    zeros for the other tokens, only when a trace asks for the site (idle: no copy at all)."""
    tr = active_trace()
    if tr is None or not tr.wants(site.name):
        return out
    dense = out.new_zeros(shape[0] * shape[1], shape[2])  # (B * T, out)
    dense[tok] = out
    return site(dense.view(shape)).reshape(-1, shape[2])[tok]


# --- experts and the MoE width change -----------------------------------------------------------

class LinearExpert(nn.Linear):
    """One bias-free Linear in_dim -> out_dim; `out` records its output (the MoE densifies it)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(in_dim, out_dim, bias=False)
        self.out = Site(f"[batch, pos, {out_dim}] this expert's output (0 for tokens not routed to it)")


class SwiGLUExpert(nn.Module):
    """down(silu(gate(x)) * up(x)), in_dim -> hidden -> out_dim; `out` records its output."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.gate = nn.Linear(in_dim, hidden, bias=False)
        self.up = nn.Linear(in_dim, hidden, bias=False)
        self.down = nn.Linear(hidden, out_dim, bias=False)
        self.out = Site(f"[batch, pos, {out_dim}] this expert's output (0 for tokens not routed to it)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))  # (n, in) -> (n, out)


def make_expert(c: MoEPConfig, in_dim: int, out_dim: int) -> nn.Module:
    if c.expert == "swiglu":
        return SwiGLUExpert(in_dim, c.hidden, out_dim)
    return LinearExpert(in_dim, out_dim)


# the sites of TopKRouter (`<layer>.router.*`) by routing role
TOPK_ROLES = {role: site_name("router", role) for role in (LOGITS, PROBS, INDICES, WEIGHTS)}


class MoE(RoutingLayer):
    """Token-level top-k mixture of E experts in_dim -> out_dim; each expert sees only its tokens."""

    option_noun = "expert"
    can_force = True  # the top-k router decides
    role_sites = TOPK_ROLES

    def __init__(self, c: MoEPConfig, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.config, self.out_dim, self.n_options, self.top_k = c, out_dim, c.n_experts, c.expert_top_k
        # pre-norm like every GPT-2 sublayer: without it the signal through two multiplicative
        # (SwiGLU) width changes with no residual shrinks to ~1e-11 at init
        self.norm = nn.LayerNorm(in_dim, eps=1e-5, bias=c.ln_bias)
        self.router = TopKRouter(in_dim, c.n_experts, c.expert_top_k)
        self.experts = nn.ModuleList(make_expert(c, in_dim, out_dim) for _ in range(c.n_experts))
        self.out = Site(f"[batch, pos, {out_dim}] weighted sum of the selected experts' outputs")

    @property
    def option_roles(self) -> dict[str, tuple[str, ...]]:
        """Each expert's output (densified: 0 for tokens not routed to it)."""
        return {PATHS: tuple(site_name(self.name, "experts", j, "out") for j in range(len(self.experts)))}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        x = self.norm(x)
        route = self.router(x, self.name)
        add_balance_term(self.config, self.name, route)
        dropped = self.dropped()
        flat = x.reshape(B * T, C)  # (N, in)
        sel = route.indices.reshape(B * T, -1)  # (N, k)
        gate = route.weights.reshape(B * T, -1)  # (N, E), 0 where unselected
        y = x.new_zeros(B * T, self.out_dim)  # (N, out)
        for e, expert in enumerate(self.experts):
            tok = (sel == e).any(-1).nonzero().squeeze(-1)  # (n_e,) tokens that chose e
            if e in dropped:  # never computed (only reachable by forcing a dropped expert)
                tok = tok[:0]
            out = expert(flat[tok]) if tok.numel() else y[:0]  # (n_e, out)
            out = _through_site(expert.out, out, tok, (B, T, self.out_dim))
            if tok.numel():
                y.index_add_(0, tok, gate[tok, e, None] * out)
        return self.out(y.view(B, T, self.out_dim))


# --- parallel layers --------------------------------------------------------------------------

class ParallelBlock(Block):
    """A full GPT-2 block at width d' (its own residual inside); `out` records its output."""

    def __init__(self, spec: BlockSpec) -> None:
        super().__init__(spec)
        self.out = Site("[batch, pos, d_par] output of this block, x + attn + ffn (all tokens)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(super().forward(x))  # (B, T, d')


class ParallelLayer(RoutingLayer):
    """sum over the top-k blocks of weight * block(x), chosen per token by a TopKRouter. The weights
    sum to 1 and every block has its own residual, so zeroed blocks make the layer the identity."""

    option_noun = "block"
    can_force = True  # the top-k router decides
    role_sites = {**TOPK_ROLES, COMBINED: "combined"}

    def __init__(self, c: MoEPConfig) -> None:
        super().__init__()
        self.config, self.n_options, self.top_k = c, c.n_blocks, c.top_k
        self.router = TopKRouter(c.d_par, c.n_blocks, c.top_k)
        self.blocks = nn.ModuleList(ParallelBlock(c.spec(c.d_par, c.n_par_heads)) for _ in range(c.n_blocks))
        self.combined = Site("[batch, pos, d_par] weighted sum of the selected blocks' outputs")
        self.out = Site("[batch, pos, d_par] layer output (= combined; the residual is inside each block)")

    @property
    def option_roles(self) -> dict[str, tuple[str, ...]]:
        """Each block's output (recorded only for blocks that ran)."""
        return {PATHS: tuple(site_name(self.name, "blocks", j, "out") for j in range(len(self.blocks)))}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        st = current()
        route = self.router(x, self.name)  # weights: (B, T, P), 0 where unselected
        add_balance_term(self.config, self.name, route)
        dropped = self.dropped()
        if st.cache is not None:  # every block must see every position to keep its cache whole
            run = range(len(self.blocks))
        else:  # blocks no token selected would only be multiplied by 0
            run = sorted(set(route.indices.unique().tolist()))
        y = torch.zeros_like(x)  # (B, T, d')
        for j in run:
            if j not in dropped:
                y = y + route.weights[..., j:j + 1] * self.blocks[j](x)
        return self.out(self.combined(y))


# --- the model --------------------------------------------------------------------------------

class MoEP(RouteScopeLM):
    token_embedding_path = "embed.wte"  # GPTEmbedding: token (wte) + position (wpe)

    def __init__(self, config: MoEPConfig) -> None:
        super().__init__()
        c = self.config = config
        self.context, self.vocab_size = c.context, c.vocab_size
        self.embed = GPTEmbedding(c.vocab_size, c.context, c.d_model)
        self.pre = nn.ModuleList(Block(c.spec(c.d_model, c.n_heads)) for _ in range(c.n_pre))
        self.moe_shrink = MoE(c, c.d_model, c.d_par)
        self.parallel = nn.ModuleList(ParallelLayer(c) for _ in range(c.n_parallel_layers))
        self.moe_grow = MoE(c, c.d_par, c.d_model)
        self.post = nn.ModuleList(Block(c.spec(c.d_model, c.n_heads)) for _ in range(c.n_post))
        self.ln_f = nn.LayerNorm(c.d_model, eps=1e-5, bias=c.ln_bias)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        init_weights(self)
        scaled_residual_init(self, c.n_pre + c.n_parallel_layers + c.n_post)  # blocks along a token's path
        for m in self.modules():
            if isinstance(m, SwiGLUExpert):  # no residual around the width changes: keep unit scale
                for lin in (m.gate, m.up, m.down):
                    nn.init.normal_(lin.weight, 0.0, lin.in_features ** -0.5)
        if c.tie_embeddings:
            self.head.weight = self.embed.wte.weight
        self._finalize()

    def aux_weights(self) -> dict[str, float]:
        """Each router's own lambda for its balance term (summed over routers, see the docstring)."""
        c = self.config
        return {aux_key(layer): c.expert_aux_lambda if layer.startswith("moe_") else c.aux_lambda
                for layer in self.routing_layers()}

    def active_params(self) -> int:
        """Parameters used per token: all but the (P - top_k) unchosen blocks of each parallel
        layer and the (E - expert_top_k) unchosen experts of moe_shrink and moe_grow."""
        return moep_active_param_count(self.config)

    def _forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)  # (B, T, d)
        for block in self.pre:
            x = block(x)
        x = self.moe_shrink(x)  # (B, T, d')
        for layer in self.parallel:
            x = layer(x)
        x = self.moe_grow(x)  # (B, T, d)
        for block in self.post:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, V)


# --- parameter counts -------------------------------------------------------------------------

def _block(c: MoEPConfig, w: int) -> int:
    ffn = (3 if c.ffn == "swiglu" else 2) * w * c.block_hidden(w)  # gate, up, down | fc, proj
    return 4 * w * w + ffn + (4 if c.ln_bias else 2) * w  # qkv 3w^2, proj w^2, two LayerNorms


def _expert(c: MoEPConfig, a: int, b: int) -> int:
    return 2 * a * c.hidden + c.hidden * b if c.expert == "swiglu" else a * b


def moep_param_count(c: MoEPConfig) -> int:
    """Closed form of sum(p.numel()) for a MoEP built from `c` (tied weights once)."""
    d, dp, E = c.d_model, c.d_par, c.n_experts
    total = c.vocab_size * d * (1 if c.tie_embeddings else 2) + c.context * d  # wte (+ head), wpe
    total += (c.n_pre + c.n_post) * _block(c, d) + (2 if c.ln_bias else 1) * d  # full blocks, ln_f
    total += d * E + E * _expert(c, d, dp) + dp * E + E * _expert(c, dp, d)  # shrink, grow (routers, experts)
    total += (d + dp) * (2 if c.ln_bias else 1)  # shrink/grow input norms
    total += c.n_parallel_layers * (dp * c.n_blocks + c.n_blocks * _block(c, dp))  # router, P blocks
    return total


def moep_active_param_count(c: MoEPConfig) -> int:
    unused_blocks = c.n_parallel_layers * (c.n_blocks - c.top_k) * _block(c, c.d_par)
    unused_experts = (c.n_experts - c.expert_top_k) * (_expert(c, c.d_model, c.d_par) + _expert(c, c.d_par, c.d_model))
    return moep_param_count(c) - unused_blocks - unused_experts
