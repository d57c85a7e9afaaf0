"""Per-call instrumentation of transformers' modules: the wrapper installed as a module's `forward`,
the per-call ContextVars, and ablation by watching the ops inside a router (`_InsideRouter`)."""
from __future__ import annotations

import copy
import functools
import types
import weakref
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
_TOPK = {torch.topk, torch.Tensor.topk}
_GATHER = {torch.gather, torch.Tensor.gather}


# the torch ops a record may name as the one whose first result inside the router is the logits
LOGITS_OPS = {"linear": {F.linear}, "mm": {torch.mm, torch.Tensor.mm, torch.matmul, torch.Tensor.matmul}}


def _same_storage(x: Any, bias: torch.Tensor) -> bool:
    return isinstance(x, torch.Tensor) and x.numel() == bias.numel() and \
        x.untyped_storage().data_ptr() == bias.untyped_storage().data_ptr()


class _InsideRouter(TorchFunctionMode):
    """Watches the ops of one router call, as its type's record (`Quirk`) describes the router: masks
    the logits (the first result of one of `logits_ops`) of the experts the call drops, and their
    selection scores where the router adds the record's selection bias (`bias`) to them; keeps the
    router's probabilities as its own softmax or sigmoid computed them, over every expert; where
    `want_choice`, the indices of its first top-k (a router that selects inside: `Quirk.routes`)."""

    def __init__(self, dropped: frozenset[int], want_probs: bool, bias: torch.Tensor | None, mask: float,
                 row_mask: torch.Tensor | None = None, logits_ops: tuple[str, ...] = ("linear",),
                 want_choice: bool = False, logits_weight: torch.Tensor | None = None,
                 choice_width: int | None = None) -> None:
        super().__init__()
        # a router choosing among `choice_width` experts by scores whose expert ids it computes (Doge): the
        # dropped experts' scores -inf as its top-k over them takes them; the expert ids of that choice
        # (its first integer gather after) and its weights (its first softmax after) are the routes
        self.choice_width, self.ids, self.chose, self.weights = choice_width, None, False, None
        self.logits_weight = logits_weight  # the logits are the op's result on this weight (else its first)
        self.want_choice, self.chosen = want_choice, None  # chosen: [tokens, k] the router's top-k indices
        self.dropped, self.want_probs, self.bias, self.mask = sorted(dropped), want_probs, bias, mask
        self.logits_ops = set().union(*(LOGITS_OPS[o] for o in logits_ops))
        self.row_mask = row_mask  # [batch, n] True where that row drops the expert (rows differ), else None
        self.logits: torch.Tensor | None = None
        self.probs: torch.Tensor | None = None

    def _mask(self, out: torch.Tensor, value: float) -> torch.Tensor:
        if self.row_mask is None:
            return out.index_fill(-1, torch.tensor(self.dropped, device=out.device), value)
        rows = self.row_mask.to(out.device)  # the router sees [batch * pos, n]: rows are contiguous
        return out.reshape(rows.shape[0], -1, out.shape[-1]).masked_fill(rows[:, None, :], value).reshape(out.shape)

    def _at_choice(self, func, args, kwargs):
        n, x = self.choice_width, args[0] if args else None
        if not self.chose and func in _TOPK and isinstance(x, torch.Tensor) and x.is_floating_point() and \
                x.shape[-1] == n:
            if self.dropped:
                if self.ids is None:
                    raise ValueError("its router chose among every expert before any expert ids were computed")
                args = (x.masked_fill(self._dropped_at(self.ids), float("-inf")), *args[1:])
            self.chose = True
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if not self.chose:
            if isinstance(out, torch.Tensor) and not out.is_floating_point() and out.dim() and out.shape[-1] == n:
                self.ids = out
        elif self.chosen is None and func in _GATHER and not out.is_floating_point():
            self.chosen = out
        elif self.chosen is not None and self.weights is None and func in _NORMALISERS:
            self.weights = out
        return out

    def _dropped_at(self, ids: torch.Tensor) -> torch.Tensor:
        """[..., n] True where the expert `ids` [..., n] names is dropped (by its row, where rows differ)."""
        if self.row_mask is None:
            return torch.isin(ids, torch.tensor(self.dropped, device=ids.device))
        rows = self.row_mask.to(ids.device)
        per = ids.reshape(rows.shape[0], -1, ids.shape[-1])
        return rows[:, None, :].expand(-1, per.shape[1], -1).gather(-1, per).reshape(ids.shape)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.choice_width is not None:
            return self._at_choice(func, args, kwargs or {})
        out = func(*args, **(kwargs or {}))
        if self.logits is None:
            if func in self.logits_ops and (self.logits_weight is None or any(
                    _same_storage(a, self.logits_weight) for a in args)):  # the router's linear: its logits
                if self.dropped:
                    out = self._mask(out, self.mask)
                self.logits = out
        elif (self.want_probs and self.probs is None and func in _NORMALISERS and isinstance(out, torch.Tensor)
              and out.shape == self.logits.shape):
            self.probs = out
        elif self.dropped and self.bias is not None and func in _ADD and any(_same_storage(a, self.bias) for a in args):
            out = self._mask(out, DROPPED_CHOICE)
        if self.want_choice and self.chosen is None and func in _TOPK:
            self.chosen = out[1]
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
# (model, routing layer, captured top-k index [N, k], its per-slot outputs [N, k, d]): that layer's experts call
# is answered from them (`resume.recombine`), computing only the (token, expert) pairs an ablation brings in
_REUSE_EXPERTS: ContextVar[tuple | None] = ContextVar("routescope_hf_reuse_experts", default=None)


class Wrapped(functools.partial):
    """A transformers module's `forward` while an HFModel instruments it: a partial of
    method(owner_ref, key, inner, *args, **kwargs), `inner` being the forward the module had (its
    class's, or one accelerate's dispatch installed), `owner_ref` a weak reference to the HFModel, so
    the transformers modules never keep it alive: deleting the HFModel frees it at once, without the
    garbage collector, and each method calls `inner` alone once its owner is gone. A partial (called in
    C) rather than a Python __call__, which cost a second *args/**kwargs frame per wrapped call. A
    deep copy of the HFModel gets wrappers that call the copy (and the copy's modules); a deep copy of
    the transformers model alone gets its plain forwards."""

    def __new__(cls, method: Any, owner: Any, key: Any, inner: Any, restore: Any) -> "Wrapped":
        self = super().__new__(cls, method, weakref.ref(owner), key, inner)
        self.restore = restore  # the instance forward the module had before (None: its class's)
        return self

    @property
    def owner(self) -> Any:
        return self.args[0]()

    @property
    def inner(self) -> Any:
        return self.args[2]

    def __deepcopy__(self, memo: dict) -> Any:
        owner = self.owner
        inner = copy.deepcopy(self.inner, memo)
        twin = memo.get(id(owner)) if owner is not None else None
        if twin is None:  # the transformers model copied on its own: it gets its own forward
            return inner
        return Wrapped(self.func, twin, self.args[1], inner, copy.deepcopy(self.restore, memo))


def _wrap(module: nn.Module, owner: Any, method: Any, key: Any) -> None:
    """module.forward := Wrapped(method, owner, key, inner). Wrapping a module a second time (a second
    HFModel over the same transformers model) replaces the first wrapper, never nests it."""
    restore = module.__dict__.get("forward")
    if isinstance(restore, Wrapped):
        restore = restore.restore
    inner = restore if restore is not None else types.MethodType(type(module).forward, module)
    module.forward = Wrapped(method, owner, key, inner, restore)


def _unwrap(hf: nn.Module, owner: Any) -> None:
    """Every module of `hf` that `owner` wrapped gets back the forward it had."""
    for module in hf.modules():
        f = module.__dict__.get("forward")
        if isinstance(f, Wrapped) and f.owner is owner:
            if f.restore is None:
                del module.forward
            else:
                module.forward = f.restore


def _site(name: str, shape: str) -> Site:
    s = Site(shape)
    s.name = name
    return s
