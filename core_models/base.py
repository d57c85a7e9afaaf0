"""What every family's model shares: the per-call entry point, site naming, cache set-up and
parameter counts. Families implement `_forward(idx) -> logits` and, where they route, `routing_layers()`."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from . import runtime
from .config import BaseConfig
from .layers import PAGMLP, Attention
from .runtime import Ablation, KVCache, RunState
from .sites import Site, name_sites


class InputError(ValueError):
    """The token ids given to a model cannot be run (empty, out of vocabulary, too long)."""


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, V)
    aux_loss: torch.Tensor | None = None  # weighted sum of auxiliary routing losses (training)
    aux: dict[str, torch.Tensor] = field(default_factory=dict)  # each auxiliary term, unweighted


class RouteScopeLM(nn.Module):
    config: BaseConfig
    context: int
    vocab_size: int

    def _finalize(self) -> None:
        """Call at the end of a family's __init__: names sites, numbers attention layers."""
        self.sites: dict[str, Site] = name_sites(self)
        self.attn_layers = [m for m in self.modules() if isinstance(m, Attention)]
        for i, m in enumerate(self.attn_layers):
            m.layer_id = i
        for name, m in self.named_modules():
            if isinstance(m, PAGMLP):
                m.routing_name = name

    # --- family hooks ---------------------------------------------------------------------
    def _forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> logits (B, T, V)
        raise NotImplementedError

    def routing_layers(self) -> dict[str, int]:
        """Routing layer name -> number of options (paths/blocks/experts) it chooses among."""
        layers = {}
        for name, m in self.named_modules():
            if isinstance(m, PAGMLP):
                layers[name] = PAGMLP.n_options
        return layers

    def aux_weights(self) -> dict[str, float]:
        """Weight of each auxiliary loss term in `aux_loss` (training)."""
        return {}

    # --- public API -------------------------------------------------------------------------
    def forward(self, idx: torch.Tensor, *, ablation: Ablation | None = None, routing: str = "deterministic",
                seed: int | None = None, generator: torch.Generator | None = None,
                cache: KVCache | None = None, pad_mask: torch.Tensor | None = None,
                atm: bool | None = None, atm_tau: float | None = None) -> LMOutput:
        self.check_input(idx, cache)
        ablation = ablation or runtime.NO_ABLATION
        if not ablation.is_empty:
            ablation.validate(self.routing_layers())
        if routing not in runtime.ROUTING_MODES:
            raise ValueError(f"routing = {routing!r}: expected one of {runtime.ROUTING_MODES}")
        if generator is None and (routing == "sampled" or self.training):
            generator = torch.Generator().manual_seed(0 if seed is None else seed)
        state = RunState(ablation=ablation, routing=routing, generator=generator, cache=cache,
                         training=self.training, pad_mask=pad_mask, atm=atm, atm_tau=atm_tau)
        with runtime.running(state):
            logits = self._forward(idx)
        if cache is not None:
            cache.pos += idx.shape[1]
        out = LMOutput(logits=logits, aux=state.aux)
        if state.aux:
            w = self.aux_weights()
            out.aux_loss = sum(w.get(k, 0.0) * v for k, v in state.aux.items())
        return out

    def check_input(self, idx: torch.Tensor, cache: KVCache | None = None) -> None:
        if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.int64, torch.int32) or idx.dim() != 2:
            raise InputError("input ids must be an integer tensor of shape [batch, pos]")
        if idx.numel() == 0:
            raise InputError("empty input: the prompt has no tokens")
        lo, hi = map(int, torch.aminmax(idx))
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise InputError(f"token id {bad} is out of the vocabulary (0..{self.vocab_size - 1})")
        total = idx.shape[1] + (cache.pos if cache is not None else 0)
        if total > self.context:
            raise InputError(f"{total} tokens exceed the context length {self.context}")

    def new_cache(self) -> KVCache:
        return KVCache(len(self.attn_layers))

    def site_names(self) -> list[str]:
        return list(self.sites)

    def site_shapes(self) -> dict[str, str]:
        return {n: s.shape for n, s in self.sites.items()}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # parameters() dedups tied weights

    def active_params(self) -> int:
        """Parameters used per token (differs from the total for top-k routing)."""
        return self.num_params()
