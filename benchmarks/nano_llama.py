"""A hand-written nanoGPT-style llama: the floor a RouteScope llama forward is compared with.

RMSNorm, rotate-half RoPE, fused qkv, SDPA causal attention, SwiGLU, tied head. No sites, no
per-call state, no input checks: just the arithmetic. `from_routescope` shares the weights of a
`core_models.llama.Llama` so both compute the same logits from the same memory.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class NanoRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # as Meta's llama reference writes it (faster on CPU)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim: int, context: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))  # (hd/2,)
    angles = torch.outer(torch.arange(context).float(), inv_freq)  # (T, hd/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, hd): feature i pairs with i + hd/2
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class NanoAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads, self.hd = n_heads, dim // n_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.hd).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class NanoSwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class NanoBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.norm_1, self.attn = NanoRMSNorm(dim, eps), NanoAttention(dim, n_heads)
        self.norm_2, self.ffn = NanoRMSNorm(dim, eps), NanoSwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x), cos, sin)
        return x + self.ffn(self.norm_2(x))


class NanoLlama(nn.Module):
    def __init__(self, vocab: int, dim: int, n_layers: int, n_heads: int, hidden: int, context: int,
                 eps: float = 1e-6, rope_base: float = 10000.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(NanoBlock(dim, n_heads, hidden, eps) for _ in range(n_layers))
        self.norm = NanoRMSNorm(dim, eps)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        cos, sin = rope_tables(dim // n_heads, context, rope_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed(idx)  # (B, T, d)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))  # (B, T, V)

    @classmethod
    def from_routescope(cls, model: nn.Module) -> "NanoLlama":
        """A NanoLlama holding the very same Parameter objects as `model` (shared, not copied), so
        both forwards read one weight memory and differ only in code."""
        c = model.config
        assert c.family == "llama" and c.ffn == "swiglu" and c.n_kv_heads == c.n_heads and c.tie_embeddings
        nano = cls(c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.hidden, c.context, c.norm_eps, c.rope_base)
        nano.embed.weight = nano.head.weight = model.embed.weight
        nano.norm.weight = model.norm.weight
        for mine, theirs in zip(nano.blocks, model.blocks):
            for a, b in ((mine.norm_1, theirs.norm_1), (mine.norm_2, theirs.norm_2), (mine.attn.qkv, theirs.attn.qkv),
                         (mine.attn.proj, theirs.attn.proj), (mine.ffn.gate, theirs.ffn.gate),
                         (mine.ffn.up, theirs.ffn.up), (mine.ffn.down, theirs.ffn.down)):
                a.weight = b.weight
        return nano.eval()
