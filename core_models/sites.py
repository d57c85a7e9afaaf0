"""Routing sites: identity modules at every routing decision or blend.

Like TransformerLens hook points, a site is named by its module path (set once by
`name_sites`), so a name is never typed twice. A site costs one ContextVar read when no trace is
active; nothing is ever registered on the module, so nothing can be left behind.
"""
from __future__ import annotations

import torch
from torch import nn

from .runtime import _TRACE


class Site(nn.Module):
    """Identity at a routing decision. `shape` documents the recorded tensor, e.g.
    "[batch, pos, n_options]"; `pos_axis` says which axis is the token position (None if none)."""

    def __init__(self, shape: str, pos_axis: int | None = 1) -> None:
        super().__init__()
        self.name = ""
        self.shape = shape
        self.pos_axis = pos_axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tr = _TRACE.get()
        if tr is not None and tr.wants(self.name):
            return tr.visit(self.name, x, self.pos_axis, self.shape)
        return x

    def extra_repr(self) -> str:
        return f"{self.name!r}, shape={self.shape}"


def name_sites(model: nn.Module) -> dict[str, Site]:
    """Give every Site its module path as name; return them in forward order of definition."""
    sites = {}
    for name, mod in model.named_modules():
        if isinstance(mod, Site):
            mod.name = name
            sites[name] = mod
    return sites
