"""Parts shared by every family: norms, rotary positions, attention with KV cache, feed-forwards,
and the pre-norm residual block. Ordered from parts to whole."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .run_state import current
from .sites import PATH_SCALES, PATHS, RoutingLayer, Site

NORMS = ("rms", "layer")
FFNS = ("swiglu", "geglu", "pagmlp", "gelu")
ROPES = ("half", "interleaved", "none")


@dataclass(frozen=True)
class BlockSpec:
    """How one transformer block is built. Families derive it from their config."""

    dim: int
    n_heads: int
    n_kv_heads: int
    ffn: str = "swiglu"
    ffn_hidden: int = 0  # 0: the family's default
    norm: str = "rms"
    norm_eps: float = 1e-6
    norm_bias: bool = False  # LayerNorm only
    rope: str = "half"
    rope_base: float = 10000.0
    context: int = 256
    attn_out_proj: bool = True
    linear_bias: bool = False
    swiglu_beta: bool = False  # learnable per-unit beta in a * sigmoid(beta * a)
    gelu_approx: str = "none"  # "none" (exact erf) or "tanh"
    ffn_dropout: float = 0.0  # dropout on the FFN's output while training (Block applies it)
    pagmlp_gate: str = "independent"  # PAGMLP: "independent" alpha, beta or "complementary" beta = 1 - alpha

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """w * x / sqrt(mean(x^2) + eps) in float32. The same arithmetic, in the same order, as
    F.rms_norm (bit-identical), in 6 ops where torch 2.13's CPU composite takes 8: measurably
    faster per decoded token."""
    xf = x if x.dtype == torch.float32 else x.float()
    w = weight if weight.dtype == torch.float32 else weight.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w
    return y if y.dtype == x.dtype else y.type_as(x)


def gelu_exact(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU. For small inputs (a decoding step) it is PyTorch's own formula
    x * 0.5 * (1 + erf(x / sqrt(2))) in 5 elementwise ops: F.gelu sends a contiguous input to
    oneDNN, whose fixed cost per call measured 0.25 ms per decoded token on pagmlp (8 layers). For
    larger inputs F.gelu's kernel is faster. Both agree with the float64 definition to a few float32
    eps of |x| (1 + erf cancels for x < 0; tests/models/test_core.py)."""
    if x.numel() > _GELU_FORMULA_MAX:
        return F.gelu(x)
    return x * 0.5 * (1.0 + torch.erf(x * _SQRT1_2))


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_GELU_FORMULA_MAX = 4096  # elements: below this the per-call cost dominates


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return gelu_exact(x) if approximate == "none" else F.gelu(x, approximate=approximate)


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def make_norm(spec: BlockSpec, dim: int | None = None) -> nn.Module:
    dim = dim or spec.dim
    if spec.norm == "rms":
        return RMSNorm(dim, spec.norm_eps)
    return nn.LayerNorm(dim, eps=spec.norm_eps, bias=spec.norm_bias)


class Rotary(nn.Module):
    """Rotary position tables for one head size; `style` picks the pairing of features.
    Applied in the (batch, pos, heads, head_dim) layout, so queries and keys rotate in one pass."""

    def __init__(self, head_dim: int, context: int, base: float, style: str) -> None:
        super().__init__()
        self.style = style
        # float32 angles, as in the papers' reference code; table covers 2 * context positions
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
        angles = torch.outer(torch.arange(2 * context, dtype=torch.float32), inv_freq)  # (2C, hd/2)
        if style == "half":  # full-width tables: one multiply-add per call on the hot path
            angles = torch.cat((angles, angles), dim=-1)  # (2C, hd)
        self.register_buffer("cos", angles.cos()[:, None], persistent=False)  # (2C, 1, hd) or (2C, 1, hd/2)
        self.register_buffer("sin", angles.sin()[:, None], persistent=False)

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        # x: (B, T, heads, hd) at positions start .. start + T - 1
        T = x.shape[1]
        cos, sin = self.cos[start:start + T], self.sin[start:start + T]  # (T, 1, hd) or (T, 1, hd/2)
        xf = x if x.dtype == torch.float32 else x.float()
        if self.style == "interleaved":  # pairs (2i, 2i+1) as complex numbers
            x2 = xf.unflatten(-1, (-1, 2))
            a, b = x2[..., 0], x2[..., 1]
            out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        else:  # rotate-half: feature i pairs with i + hd/2: (a, b) -> (a cos - b sin, b cos + a sin)
            a, b = xf.chunk(2, dim=-1)
            out = torch.addcmul(xf * cos, torch.cat((-b, a), dim=-1), sin)
        return out if out.dtype == x.dtype else out.type_as(x)


class Attention(nn.Module):
    """Causal multi-head (or grouped-query) self-attention with optional RoPE and KV cache."""

    def __init__(self, spec: BlockSpec) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.context = spec.context
        self.qkv = nn.Linear(spec.dim, (self.n_heads + 2 * self.n_kv) * self.hd, bias=spec.linear_bias)
        self.proj = nn.Linear(spec.dim, spec.dim, bias=spec.linear_bias) if spec.attn_out_proj else None
        self.rotary = Rotary(self.hd, spec.context, spec.rope_base, spec.rope) if spec.rope != "none" else None
        self.layer_id = -1  # index into the KV cache, set by the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        H, Hkv = self.n_heads, self.n_kv
        st = current()
        start = st.cache.pos if st.cache is not None else 0
        qkv = self.qkv(x).view(B, T, H + 2 * Hkv, self.hd)  # (B, T, heads, hd)
        qk, v = qkv.split_with_sizes([H + Hkv, Hkv], dim=2)
        if self.rotary is not None:
            qk = self.rotary(qk, start)
        q, k = qk.transpose(1, 2).split_with_sizes([H, Hkv], dim=1)  # (B, H, T, hd), (B, Hkv, T, hd)
        v = v.transpose(1, 2)  # (B, Hkv, T, hd)
        if st.cache is not None:
            k, v = st.cache.append(self.layer_id, k, v, self.context)
        y = attend(q, k, v, start, st.pad_mask)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, H * self.hd)
        return self.proj(y) if self.proj is not None else y


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
           pad_mask: torch.Tensor | None) -> torch.Tensor:
    """Causal attention of T queries at positions start.. over all L keys so far."""
    T, L = q.shape[2], k.shape[2]
    gqa = k.shape[1] != q.shape[1]
    if pad_mask is None and start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if pad_mask is None and T == 1:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    allowed = torch.ones(T, L, dtype=torch.bool, device=q.device).tril(diagonal=start)  # (T, L)
    if pad_mask is not None:  # padding is masked as keys only, as in the PaPaformer reference
        allowed = allowed & ~pad_mask[:, None, None, -L:]  # (B, 1, T, L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=gqa)


class SwiGLU(nn.Module):
    """down(up(x) * a * sigmoid(beta * a)), a = gate(x); beta = 1 unless learnable."""

    def __init__(self, dim: int, hidden: int, learn_beta: bool = False, bias: bool = False) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=bias)
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)
        self.beta = nn.Parameter(torch.ones(hidden)) if learn_beta else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.gate(x)  # (B, T, h)
        act = F.silu(a) if self.beta is None else a * torch.sigmoid(self.beta * a)
        return self.down(self.up(x) * act)


class GEGLU(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=bias)
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x) * gelu_exact(self.gate(x)))


PAGMLP_GATES = ("independent", "complementary")


def seeded_dropout(x: torch.Tensor, p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Inverted dropout drawing its mask from the call's generator (RunState), so a training
    step is reproducible from its seed and concurrent calls never share a random stream."""
    keep = torch.empty_like(x).bernoulli_(1.0 - p, generator=generator)  # (x.shape) of 0 / 1
    return x * keep / (1.0 - p)


class PAGMLP(RoutingLayer):
    """Parallel Adaptive Gated MLP (eqs. 1-3): a SwiGLU and a GEGLU pathway of hidden/2 units each,
    scaled by alpha and beta, concatenated, one down projection. Same matrices as a SwiGLU of width
    `hidden` plus one or two scalars. The paper's dropout 0.1 (§4) is the block's (BlockSpec.ffn_dropout),
    applied to this output as to any FFN's, so a SwiGLU baseline can train the same way.

    "alpha, beta ... learned through sigmoid-activated parameters initialized at 0.5" (§3) is read as
    alpha = beta = 0.5 at init (raw a = b = 0); sigmoid(0.5) = 0.62 for both would be as balanced.
    gate="independent" (default; the shipped checkpoint was trained so): alpha = sigmoid(a) and
    beta = sigmoid(b) are two independent gates, free to sum to anything in (0, 2).
    gate="complementary": beta = 1 - alpha, one scalar a, a convex blend of the pathways, which the
    paper's learned alpha, beta = 0.53, 0.47 (summing to 1) suggests."""

    n_options = 2  # 0 = SwiGLU pathway, 1 = GEGLU pathway
    option_noun = "pathway"
    role_sites = {}  # no per-token option weights: the pathways are scaled per call (PATH_SCALES)
    option_role_sites = {PATHS: ("swiglu_out", "geglu_out"), PATH_SCALES: ("alpha", "beta")}

    def __init__(self, dim: int, hidden: int, bias: bool = False, gate: str = "independent") -> None:
        super().__init__()
        assert hidden % 2 == 0, "PAGMLP hidden width must be even"
        assert gate in PAGMLP_GATES, gate  # configs validate it
        self.half = hidden // 2
        self.gate = nn.Linear(dim, hidden, bias=bias)  # [swiglu gate | geglu gate]
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)
        self.a = nn.Parameter(torch.zeros(()))
        self.b = nn.Parameter(torch.zeros(())) if gate == "independent" else None
        self.alpha = Site("[] sigmoid(a), SwiGLU pathway scale", pos_axis=None)
        self.beta = Site("[] sigmoid(b), or 1 - alpha if complementary: GEGLU pathway scale", pos_axis=None)
        self.swiglu_out = Site("[batch, pos, hidden/2] scaled SwiGLU pathway (before down projection)")
        self.geglu_out = Site("[batch, pos, hidden/2] scaled GEGLU pathway (before down projection)")

    def option_labels(self) -> list[str]:
        return ["SwiGLU pathway", "GEGLU pathway"]

    def path_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(dim, hidden/2) each: the columns of the down projection that read pathway j's output
        (PATHS j), so pathway j contributes path_projections()[j] @ act_j to the layer output."""
        w = self.down.weight
        return w[:, :self.half], w[:, self.half:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate(x), self.up(x)  # (B, T, h)
        a = torch.sigmoid(self.a)
        alpha, beta = self.alpha(a), self.beta(torch.sigmoid(self.b) if self.b is not None else 1.0 - a)
        dropped = self.skipped()  # no router: forcing a pathway drops the other
        h = self.half  # narrow: cheaper per call than g[..., :h] on the decoding path
        s = F.silu(g.narrow(-1, 0, h)) * u.narrow(-1, 0, h) * (0.0 if 0 in dropped else alpha)
        e = gelu_exact(g.narrow(-1, h, h)) * u.narrow(-1, h, h) * (0.0 if 1 in dropped else beta)
        return self.down(torch.cat((self.swiglu_out(s), self.geglu_out(e)), dim=-1))  # (B, T, d)


class MLP(nn.Module):
    """GPT-2 feed-forward: proj(gelu(fc(x)))."""

    def __init__(self, dim: int, hidden: int, bias: bool = False, approximate: str = "none") -> None:
        super().__init__()
        self.fc = nn.Linear(dim, hidden, bias=bias)
        self.proj = nn.Linear(hidden, dim, bias=bias)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(gelu(self.fc(x), self.approximate))


def make_ffn(spec: BlockSpec) -> nn.Module:
    hidden = spec.ffn_hidden or 4 * spec.dim
    if spec.ffn == "swiglu":
        return SwiGLU(spec.dim, hidden, spec.swiglu_beta, spec.linear_bias)
    if spec.ffn == "geglu":
        return GEGLU(spec.dim, hidden, spec.linear_bias)
    if spec.ffn == "pagmlp":
        return PAGMLP(spec.dim, hidden, spec.linear_bias, spec.pagmlp_gate)
    return MLP(spec.dim, hidden, spec.linear_bias, spec.gelu_approx)


class Block(nn.Module):
    """Pre-norm residual block: h = x + attn(norm_1(x)); out = h + drop(ffn(norm_2(h))), drop being
    the spec's ffn_dropout while training (its mask from the call's generator), else the identity."""

    def __init__(self, spec: BlockSpec) -> None:
        super().__init__()
        self.norm_1 = make_norm(spec)
        self.attn = Attention(spec)
        self.norm_2 = make_norm(spec)
        self.ffn = make_ffn(spec)
        self.ffn_dropout = spec.ffn_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x))  # (B, T, d)
        y = self.ffn(self.norm_2(x))
        if self.ffn_dropout and self.training:
            y = seeded_dropout(y, self.ffn_dropout, current().generator)
        return x + y


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2 style init: normal(0, std) for linears and embeddings, zero biases."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d)):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)


def scaled_residual_init(module: nn.Module, n_layers: int, std: float = 0.02) -> None:
    """Residual output projections get std / sqrt(2 * n_layers), as in GPT-2."""
    for name, p in module.named_parameters():
        if name.endswith(("attn.proj.weight", "ffn.down.weight", "ffn.proj.weight")):
            nn.init.normal_(p, 0.0, std / math.sqrt(2 * n_layers))
