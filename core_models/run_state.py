"""Per-call state: the ablation, routing mode, KV cache and family options of the forward in progress.

One model instance serves every browser session at once, so nothing a call needs may live on a
module. Each forward publishes its options in a ContextVar for its own duration; modules read it.
ContextVars are per thread (and per asyncio task), so concurrent calls never see each other.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from .ablation import NO_ABLATION, Ablation

ROUTING_MODES = ("deterministic", "sampled")


class KVCache:
    """Keys/values per attention layer, preallocated to the context length (no per-step concat)."""

    def __init__(self, n_layers: int) -> None:
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self.lengths = [0] * n_layers
        self.pos = 0  # tokens already consumed by the model (position offset of the next call)
        self.extra: dict[str, torch.Tensor] = {}  # family state (e.g. running sums), keyed by site name

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        # k, v: (B, H, T, hd) -> all keys so far (B, H, L + T, hd), views into the buffer
        B, H, T, hd = k.shape
        kb, vb = self.k[layer], self.v[layer]
        if kb is None:
            kb = self.k[layer] = k.new_empty(B, H, capacity, hd)
            vb = self.v[layer] = v.new_empty(B, H, capacity, hd)
        start = self.lengths[layer]
        if start + T > capacity:
            raise ValueError(f"KV cache full: {start} + {T} tokens exceed the context length {capacity}")
        kb.narrow(2, start, T).copy_(k)  # narrow: the cheapest view on a per-token path
        vb.narrow(2, start, T).copy_(v)
        self.lengths[layer] = start + T
        return kb.narrow(2, 0, start + T), vb.narrow(2, 0, start + T)


@dataclass
class RunState:
    """Everything one forward call needs beyond its input ids."""

    ablation: Ablation = NO_ABLATION
    routing: str = "deterministic"  # Gumbel mode at inference: noise-free argmax or seeded sample
    generator: torch.Generator | None = None
    cache: KVCache | None = None
    training: bool = False
    pad_mask: torch.Tensor | None = None  # (B, T) True where the token is padding (keys masked)
    # one ablation per row of the batch (many ablations in one forward); None: `ablation` for every row.
    # Only models whose `row_ablations_supported` is True read it (HF models: the router masks per row)
    row_ablations: tuple[Ablation, ...] | None = None
    # the family's own per-call options given a value (model.run_options(): Wiola's atm / atm_tau,
    # the Gumbel temperature of a training step); absent = the model's default
    options: dict[str, Any] = field(default_factory=dict)
    aux: dict[str, torch.Tensor] = field(default_factory=dict)  # auxiliary losses collected per call
    float_logits: bool = True  # False: logits in the dtype the model computes them (read by HF models)


_RUN: ContextVar[RunState | None] = ContextVar("routescope_run", default=None)
_DEFAULT = RunState()


def current() -> RunState:
    """The state of the call in progress (defaults outside any call)."""
    st = _RUN.get()
    return st if st is not None else _DEFAULT


@contextlib.contextmanager
def running(state: RunState) -> Iterator[RunState]:
    token = _RUN.set(state)
    try:
        yield state
    finally:
        _RUN.reset(token)
