"""ParallelGPT (pgpt) and its dense comparison families lgpt / cgpt, on GPT-2-style blocks.

pgpt: x = wte(idx) + wpe(pos); path i: PD_i (dense d->d) then N/P blocks; the path outputs are
mixed by softmax(w) over learned w (or, for P = 2, w = sigmoid(wt) and 1 - w); ln_f; head.

Ablation semantics (routing layer `paths`, options = path indices): a dropped path is not
computed at all and the remaining weights are renormalised to sum to 1 (pgpt-1: one path, weight
1). Forcing path j keeps only path j. Either way ln_f and the head follow, as eqs. 1-4 describe the
model: this is the default pgpt-1.

Ablation mode "pgpt1-reference" (`Ablation(modes=("pgpt1-reference",))`, CLI `--mode`): pgpt-1 as
the authors evaluated it for Table 4 (reference models.py, `forward(train=False)`): only the path
with the highest learned weight runs (P = 2, sigmoid form: path 0 when sigmoid(wt) >= 0.5, else
path 1) and its output goes straight to the head, without ln_f. Dropped or forced paths narrow the
choice as usual (the highest-weight path among those kept). Off by default: it is the authors'
evaluation, not the model the text describes.

lgpt / cgpt: L blocks in groups of k = `halve_every`; every group ends with a width halving through
a Linear (lgpt) or a kernel-1 Conv1d (cgpt), both with bias. Block i runs at d / 2^floor(i / k), and
the last group's halving is included, so ln_f and the (untied) head see d / 2^(L / k): eq. 7
(m = floor(N / n)), §4.1 ("the final embedding dimension to be 32": 512 / 2^4) and Table 2's 36.4M
need it. The paper contradicts itself here: Appendix A's Listing 1 halves only between groups
(`i % layer_red == 0 and i != 0`), without the last halving, and its 581,827,200 is that count
(tests/models/test_shrink_gpt.py runs the listing); we follow eq. 7 and §4.1. The number of heads
stays n_heads (`LinearGPT` in the reference code), so the head size halves with the width. At the
paper's configuration (d = 512, L = 8, k = 2, 8 heads, GPT-2 vocabulary 50304, context 1024) lgpt
and cgpt count the paper's 36.4M parameters (core_models/paper_configs.py; the README's paper-scale
table is generated from it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .base import RouteScopeLM
from .config import BaseConfig
from .layers import Block, BlockSpec, init_weights, scaled_residual_init
from .run_state import current
from .sites import PATH_WEIGHTS, PATHS, RoutingLayer, Site, site_name

MIXES = ("softmax", "sigmoid")
PGPT1_REFERENCE = "pgpt1-reference"  # ablation mode: the authors' pgpt-1 evaluation (module docstring)


@dataclass(frozen=True)
class PGPTConfig(BaseConfig):
    family = "pgpt"
    vocab_size: int = 4096
    d_model: int = 128
    n_layers: int = 4  # total blocks; each path has n_layers / n_paths
    n_paths: int = 2
    n_heads: int = 4
    context: int = 256
    mix: str = "softmax"  # softmax(w) over paths, or sigmoid(wt) / 1 - sigmoid(wt) for 2 paths
    pre_proj_bias: bool = True
    ln_bias: bool = False
    linear_bias: bool = False  # biases in the blocks' linears (GPTConfig.bias)
    gelu_approx: str = "none"
    tie_embeddings: bool = True

    def validate(self) -> None:
        self.positive("vocab_size", "d_model", "n_layers", "n_heads", "context")
        self.require(self.n_paths >= 1, "n_paths", "must be >= 1")
        self.require(self.n_layers % self.n_paths == 0, "n_layers", f"must be a multiple of n_paths ({self.n_paths})")
        self.require(self.d_model % self.n_heads == 0, "n_heads", f"must divide d_model ({self.d_model})")
        self.one_of("mix", MIXES)
        self.require(self.mix != "sigmoid" or self.n_paths == 2, "mix", "the sigmoid form needs n_paths = 2")
        self.one_of("gelu_approx", ("none", "tanh"))

    def spec(self, dim: int | None = None) -> BlockSpec:
        dim = dim or self.d_model
        heads = self.n_heads * dim // self.d_model
        return BlockSpec(dim=dim, n_heads=heads, n_kv_heads=heads, ffn="gelu", ffn_hidden=4 * dim, norm="layer",
                         norm_eps=1e-5, norm_bias=self.ln_bias, rope="none", context=self.context,
                         linear_bias=self.linear_bias, gelu_approx=self.gelu_approx)


class GPTEmbedding(nn.Module):
    """Token plus learned absolute position embeddings (positions offset by the KV cache)."""

    def __init__(self, vocab: int, context: int, dim: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        st = current()
        start = st.cache.pos if st.cache is not None else 0
        pos = torch.arange(start, start + idx.shape[1], device=idx.device)
        return self.wte(idx) + self.wpe(pos)  # (B, T, d)


class PGPTPath(nn.Module):
    def __init__(self, c: PGPTConfig) -> None:
        super().__init__()
        self.pre = nn.Linear(c.d_model, c.d_model, bias=c.pre_proj_bias)  # PD_i
        self.blocks = nn.ModuleList(Block(c.spec()) for _ in range(c.n_layers // c.n_paths))
        self.out = Site("[batch, pos, d_model] output of this path's last block")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pre(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


class PathMixer(nn.Module):
    """Learned path weights, renormalised over the paths that run."""

    def __init__(self, c: PGPTConfig) -> None:
        super().__init__()
        self.mix = c.mix
        # sigmoid form: one scalar wt (0.5 at init as in the paper's code); softmax: one logit per path
        self.w = nn.Parameter(torch.tensor(0.5) if c.mix == "sigmoid" else torch.zeros(c.n_paths))
        self.weights = Site("[n_paths] mixing weight of each path in this call (0 where dropped)", pos_axis=None)

    def full(self) -> torch.Tensor:
        """(P,) the learned weight of every path, before any path is dropped."""
        if self.mix == "sigmoid":
            s = torch.sigmoid(self.w)
            return torch.stack((s, 1 - s))
        return torch.softmax(self.w, dim=0)

    def forward(self, keep: list[int]) -> torch.Tensor:
        full = self.full()
        mask = torch.zeros_like(full)
        mask[keep] = 1.0
        w = full * mask
        if len(keep) < full.numel():
            w = w / w.sum()
        return self.weights(w)  # (P,)


class Paths(RoutingLayer, nn.ModuleList):
    """The P parallel paths, as a list (module path `paths`, so the state dict keys are the paths'
    own) and as the routing layer whose options the mixer weighs."""

    option_noun = "path"
    can_force = True  # the learned mix decides; forcing one path is pgpt-1 on that path
    weights_site = ""  # full name of the mixer's weights site (the mixer is a sibling), set by PGPT

    @property
    def n_options(self) -> int:
        return len(self)

    @property
    def roles(self) -> dict[str, str]:
        """The mixer's per-call path weights (the paths record no per-token option weights)."""
        return {PATH_WEIGHTS: self.weights_site}

    @property
    def option_roles(self) -> dict[str, tuple[str, ...]]:
        """Each path's output (recorded only for paths that ran)."""
        return {PATHS: tuple(site_name(self.name, j, "out") for j in range(len(self)))}

    def kept(self) -> list[int]:
        """Paths the call in progress runs (dropped and unforced ones are never computed)."""
        skipped = self.skipped()
        return [j for j in range(len(self)) if j not in skipped]


class PGPT(RouteScopeLM):
    token_embedding_path = "embed.wte"  # GPTEmbedding: token (wte) + position (wpe)

    def __init__(self, config: PGPTConfig) -> None:
        super().__init__()
        c = self.config = config
        self.context, self.vocab_size = c.context, c.vocab_size
        self.embed = GPTEmbedding(c.vocab_size, c.context, c.d_model)
        self.paths = Paths(PGPTPath(c) for _ in range(c.n_paths))
        self.mixer = PathMixer(c)
        self.mixed = Site("[batch, pos, d_model] weighted sum of the path outputs")
        self.ln_f = nn.LayerNorm(c.d_model, eps=1e-5, bias=c.ln_bias)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        init_weights(self)
        scaled_residual_init(self, c.n_layers)
        if c.tie_embeddings:
            self.head.weight = self.embed.wte.weight
        self._finalize()
        self.paths.weights_site = self.mixer.weights.name

    def ablation_modes(self) -> dict[str, str]:
        return {PGPT1_REFERENCE: "pgpt-1 as the authors evaluated it (Table 4): the highest-weight path alone, "
                                 "its output straight to the LM head without the final LayerNorm"}

    def _forward(self, idx: torch.Tensor) -> torch.Tensor:
        keep = self.paths.kept()
        reference = current().ablation.has_mode(PGPT1_REFERENCE)
        if reference:  # the highest full weight among the kept paths (argmax: path 0 on a tie, as w >= 0.5)
            full = self.mixer.full().detach()
            keep = [max(keep, key=lambda j: (float(full[j]), -j))]
        x = self.embed(idx)  # (B, T, d)
        w = self.mixer(keep)  # (P,)
        y = self.mixed(sum(w[j] * self.paths[j](x) for j in keep))  # dropped paths never run
        return self.head(y if reference else self.ln_f(y))  # (B, T, V)


def pgpt_param_count(c: PGPTConfig) -> int:
    d = c.d_model
    block = 4 * d * d + 8 * d * d + (4 if c.ln_bias else 2) * d + (9 * d if c.linear_bias else 0)
    path = d * d + (d if c.pre_proj_bias else 0) + (c.n_layers // c.n_paths) * block
    emb = c.vocab_size * d * (1 if c.tie_embeddings else 2) + c.context * d
    mix = 1 if c.mix == "sigmoid" else c.n_paths
    return emb + c.n_paths * path + mix + (2 if c.ln_bias else 1) * d


# --- lgpt / cgpt -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShrinkGPTConfig(BaseConfig):
    """lgpt: n_layers / halve_every groups of `halve_every` blocks, each group followed by a d -> d/2
    reduction (the last one included: eq. 7 and §4.1; Listing 1 leaves it out), at a fixed number
    of heads (the reference code's LinearGPT)."""
    family = "lgpt"
    halving = "linear"  # how a group's width is halved: "linear" (lgpt) or "conv" (cgpt)
    vocab_size: int = 4096
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4  # the same in every block: head size halves with the width
    halve_every: int = 2  # blocks per group; each group ends with a width halving
    context: int = 256
    ln_bias: bool = False

    def validate(self) -> None:
        self.positive("vocab_size", "d_model", "n_layers", "n_heads", "halve_every", "context")
        self.require(self.n_layers % self.halve_every == 0, "n_layers",
                     f"must be a multiple of halve_every ({self.halve_every}): every group ends with a halving")
        n_groups = self.n_layers // self.halve_every
        narrowest = self.d_model >> (n_groups - 1)
        self.require(self.d_model % (self.n_heads << (n_groups - 1)) == 0, "n_heads",
                     f"must divide every block width down to d_model / 2^{n_groups - 1}")
        self.require(narrowest % 2 == 0, "d_model",
                     f"must be divisible by 2^{n_groups} ({n_groups} halvings, the last after the final block)")

    def widths(self) -> list[int]:
        """Width of block i: d_model / 2^floor(i / halve_every) (eq. 6)."""
        return [self.d_model >> (i // self.halve_every) for i in range(self.n_layers)]

    @property
    def out_dim(self) -> int:
        """Width after the last group's halving, seen by ln_f and the head: d_model / 2^(L / k) (eq. 7)."""
        return self.d_model >> (self.n_layers // self.halve_every)

    def spec(self, dim: int) -> BlockSpec:
        return BlockSpec(dim=dim, n_heads=self.n_heads, n_kv_heads=self.n_heads, ffn="gelu", ffn_hidden=4 * dim,
                         norm="layer", norm_eps=1e-5, norm_bias=self.ln_bias, rope="none", context=self.context)


@dataclass(frozen=True)
class CGPTConfig(ShrinkGPTConfig):
    family = "cgpt"
    halving = "conv"


class HalveConv(nn.Module):
    """Kernel-1 Conv1d over the sequence, d -> d/2 (cgpt's width reduction)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(dim, dim // 2, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)  # (B, T, d/2)


class ShrinkGPT(RouteScopeLM):
    token_embedding_path = "embed.wte"  # GPTEmbedding: token (wte) + position (wpe)

    def __init__(self, config: ShrinkGPTConfig) -> None:
        super().__init__()
        c = self.config = config
        self.context, self.vocab_size = c.context, c.vocab_size
        self.embed = GPTEmbedding(c.vocab_size, c.context, c.d_model)
        self.blocks = nn.ModuleList(Block(c.spec(w)) for w in c.widths())
        # reductions[g] halves the width after group g's last block (block (g + 1) * halve_every - 1)
        group_widths = c.widths()[::c.halve_every]
        self.reductions = nn.ModuleList(
            nn.Linear(w, w // 2) if c.halving == "linear" else HalveConv(w) for w in group_widths)
        self.ln_f = nn.LayerNorm(c.out_dim, eps=1e-5, bias=c.ln_bias)
        self.head = nn.Linear(c.out_dim, c.vocab_size, bias=False)
        init_weights(self)
        self._finalize()

    def _forward(self, idx: torch.Tensor) -> torch.Tensor:
        k = self.config.halve_every
        x = self.embed(idx)  # (B, T, d)
        for i, block in enumerate(self.blocks):
            x = block(x)  # (B, T, d / 2^(i // k))
            if (i + 1) % k == 0:
                x = self.reductions[i // k](x)  # (B, T, d / 2^(i // k + 1))
        return self.head(self.ln_f(x))  # (B, T, V)


def shrink_gpt_param_count(c: ShrinkGPTConfig) -> int:
    widths = c.widths()
    total = c.vocab_size * c.d_model + c.context * c.d_model + c.vocab_size * c.out_dim
    total += sum(12 * w * w + (4 if c.ln_bias else 2) * w for w in widths)
    total += sum(w * (w // 2) + w // 2 for w in widths[::c.halve_every])  # linear or conv, with bias
    return total + (2 if c.ln_bias else 1) * c.out_dim
