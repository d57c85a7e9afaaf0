"""llama: the dense baseline. RMSNorm, RoPE, MHA or GQA, FFN swiglu | geglu | pagmlp."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .base import RouteScopeLM
from .config import BaseConfig
from .layers import FFNS, PAGMLP_GATES, Block, BlockSpec, RMSNorm, init_weights, scaled_residual_init


@dataclass(frozen=True)
class LlamaConfig(BaseConfig):
    family = "llama"
    vocab_size: int = 4096
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    ffn: str = "swiglu"
    ffn_hidden: int = 0  # 0: 8/3 * d_model rounded up to a multiple of 32 (keeps 3 matrices ~ 8 d^2)
    context: int = 256
    norm_eps: float = 1e-6
    rope_base: float = 10000.0
    tie_embeddings: bool = True
    # dropout on every block's FFN output while training, any ffn: the `pagmlp` preset and its SwiGLU
    # baseline `llama-dense` both use PAGMLP §4's 0.1 (the paper trains both so); 0.0 for configs without it
    ffn_dropout: float = 0.0
    # PAGMLP only (ffn="pagmlp"); the defaults are what config.json files without them were trained with
    pagmlp_dropout: float = 0.0  # ffn_dropout's older, PAGMLP-only name: configs that set it load as trained
    pagmlp_gate: str = "independent"  # or "complementary": beta = 1 - alpha (see layers.PAGMLP)
    # the PaPaformer reference code's block, for its Path and LLaMA_256 / LLaMA_192 models at paper
    # scale (paper_configs.py): no attention output projection, a learned SwiGLU beta, interleaved RoPE
    attn_out_proj: bool = True
    swiglu_beta: bool = False
    rope: str = "half"

    def validate(self) -> None:
        self.positive("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "context")
        self.require(self.d_model % self.n_heads == 0, "n_heads", f"must divide d_model ({self.d_model})")
        self.require(self.n_heads % self.n_kv_heads == 0, "n_kv_heads", f"must divide n_heads ({self.n_heads})")
        self.require((self.d_model // self.n_heads) % 2 == 0, "n_heads", "head dim must be even for RoPE")
        self.one_of("ffn", FFNS[:3])
        self.require(self.ffn_hidden >= 0, "ffn_hidden", "must be >= 0")
        self.require(self.norm_eps > 0, "norm_eps", "must be > 0")
        self.require(0.0 <= self.ffn_dropout < 1.0, "ffn_dropout", "must be in [0, 1)")
        self.require(0.0 <= self.pagmlp_dropout < 1.0, "pagmlp_dropout", "must be in [0, 1)")
        self.require(not (self.ffn_dropout and self.pagmlp_dropout), "pagmlp_dropout",
                     "is ffn_dropout's older name: set ffn_dropout only")
        self.one_of("pagmlp_gate", PAGMLP_GATES)
        self.one_of("rope", ("half", "interleaved"))
        self.require(not self.swiglu_beta or self.ffn == "swiglu", "swiglu_beta", "needs ffn = swiglu")

    @property
    def label(self) -> str:
        return "pagmlp" if self.ffn == "pagmlp" else self.family  # the pagmlp preset's name

    @property
    def hidden(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        return -(-(8 * self.d_model // 3) // 32) * 32

    @property
    def dropout(self) -> float:
        """The FFN-output dropout the blocks apply while training (ffn_dropout, or its older PAGMLP name)."""
        return self.ffn_dropout or (self.pagmlp_dropout if self.ffn == "pagmlp" else 0.0)

    def block_spec(self) -> BlockSpec:
        return BlockSpec(dim=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, ffn=self.ffn,
                         ffn_hidden=self.hidden, norm="rms", norm_eps=self.norm_eps, rope=self.rope,
                         rope_base=self.rope_base, context=self.context, ffn_dropout=self.dropout,
                         pagmlp_gate=self.pagmlp_gate, attn_out_proj=self.attn_out_proj, swiglu_beta=self.swiglu_beta)


class Llama(RouteScopeLM):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config, self.context, self.vocab_size = config, config.context, config.vocab_size
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config.block_spec()) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        init_weights(self)
        scaled_residual_init(self, config.n_layers)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        self._finalize()

    def _forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)  # (B, T, d)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # (B, T, V)


def llama_param_count(c: LlamaConfig) -> int:
    """Closed form of sum(p.numel()) for a Llama built from `c`."""
    d, hd = c.d_model, c.d_model // c.n_heads
    attn = d * (c.n_heads + 2 * c.n_kv_heads) * hd + (d * d if c.attn_out_proj else 0)
    gate_scalars = (2 if c.pagmlp_gate == "independent" else 1) if c.ffn == "pagmlp" else 0  # a (and b)
    ffn = 3 * d * c.hidden + gate_scalars + (c.hidden if c.swiglu_beta else 0)
    per_block = attn + ffn + 2 * d
    emb = c.vocab_size * d * (1 if c.tie_embeddings else 2)
    return emb + c.n_layers * per_block + d
