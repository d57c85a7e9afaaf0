"""Per-call instrumentation of transformers' modules: the wrapper installed as a module's `forward`,
the per-call ContextVars, and ablation by watching the ops inside a router (`_InsideRouter`)."""
from __future__ import annotations

import functools
import types
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..sites import Site

DROPPED_CHOICE = -1e9  # a dropped expert's selection score where -inf would break group sums

# --- per-call instrumentation (thread-local) -------------------------------------------------------

_BATCH: ContextVar[int] = ContextVar("routescope_hf_batch", default=1)  # rows of the call in progress
_NONE: frozenset[int] = frozenset()

_NORMALISERS = {F.softmax, torch.softmax, torch.Tensor.softmax, F.sigmoid, torch.sigmoid, torch.Tensor.sigmoid}
_ADD = {torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__}


def _choice_biases(router: nn.Module, n: int) -> list[torch.Tensor]:
    """Router tensors that may be added to its scores before selection: named `*bias`, one entry per expert."""
    return [t for name, t in [*router.named_parameters(), *router.named_buffers()]
            if name.endswith("bias") and t.numel() == n]


def _same_storage(x: Any, biases: list[torch.Tensor]) -> bool:
    if not isinstance(x, torch.Tensor):
        return False
    ptr = x.untyped_storage().data_ptr()
    return any(ptr == b.untyped_storage().data_ptr() and x.numel() == b.numel() for b in biases)


class _InsideRouter(TorchFunctionMode):
    """Watches the ops of one router call: masks the logits (and biased selection scores) of the
    experts the call drops, and keeps the router's probabilities as its own op computed them."""

    def __init__(self, dropped: frozenset[int], want_probs: bool, biases: list[torch.Tensor], mask: float,
                 row_mask: torch.Tensor | None = None) -> None:
        super().__init__()
        self.dropped, self.want_probs, self.biases, self.mask = sorted(dropped), want_probs, biases, mask
        self.row_mask = row_mask  # [batch, n] True where that row drops the expert (rows differ), else None
        self.logits: torch.Tensor | None = None
        self.probs: torch.Tensor | None = None

    def _mask(self, out: torch.Tensor, value: float) -> torch.Tensor:
        if self.row_mask is None:
            return out.index_fill(-1, torch.tensor(self.dropped, device=out.device), value)
        rows = self.row_mask.to(out.device)  # the router sees [batch * pos, n]: rows are contiguous
        return out.reshape(rows.shape[0], -1, out.shape[-1]).masked_fill(rows[:, None, :], value).reshape(out.shape)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.logits is None:
            if func is F.linear:  # the router's linear: its logits
                if self.dropped:
                    out = self._mask(out, self.mask)
                self.logits = out
        elif (self.want_probs and self.probs is None and func in _NORMALISERS and isinstance(out, torch.Tensor)
              and out.shape == self.logits.shape):
            self.probs = out
        elif self.dropped and self.biases and func in _ADD and any(_same_storage(a, self.biases) for a in args):
            out = self._mask(out, DROPPED_CHOICE)
        return out

@dataclass
class Prefix:
    """What one unablated forward of a batch left at each decoder layer's input and each experts
    module's input (`HFModel.capture`): a forward restarts from there."""

    rows: int
    logits: torch.Tensor | None = None
    inputs: dict[int, tuple[tuple, dict]] = field(default_factory=dict)  # decoder index -> (args, kwargs)
    experts: dict[str, tuple] = field(default_factory=dict)  # routing layer -> (hidden, top-k index, weights)
    attention: dict[int, Any] = field(default_factory=dict)  # decoder index -> its attention's output, where
    # the attention ran before the layer's experts (an ablation of the layer cannot change it)


_CAPTURE: ContextVar[Prefix | None] = ContextVar("routescope_hf_capture", default=None)
# (model, decoder index, output): that decoder layer's attention returns the output instead of computing it
_REUSE_ATTENTION: ContextVar[tuple | None] = ContextVar("routescope_hf_reuse_attention", default=None)


def _wrap(module: nn.Module, wrapper: Any, key: Any) -> None:
    """module.forward := wrapper(key, inner, *args, **kwargs), inner being the forward it had (the
    class's, or one that accelerate's dispatch installed). A partial of bound methods: a deep copy of
    the model calls its own modules. Wrapping a module a second time (a second HFModel over the same
    transformers model) replaces the first wrapper, never nests it."""
    inner = module.__dict__.get("forward")
    if isinstance(inner, functools.partial) and getattr(inner, "routescope", False):
        inner = inner.args[1]
    if inner is None:
        inner = types.MethodType(type(module).forward, module)
    wrapped = functools.partial(wrapper, key, inner)
    wrapped.routescope = True
    module.forward = wrapped


def _site(name: str, shape: str) -> Site:
    s = Site(shape)
    s.name = name
    return s
