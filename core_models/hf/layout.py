"""Which modules of a transformers model route (`moe_layout`), read from the model transformers built,
and the RouteScope face of each router (`HFRoutingLayer`)."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..sites import RoutingLayer

ROUTER_LOGITS = "router_logits"  # transformers' recorder key for its routers

class UnsupportedMoE(ValueError):
    """A transformers MoE model whose routing RouteScope cannot follow; the message says why."""


@dataclass(frozen=True)
class MoEBlock:
    """One MoE block of a transformers model, as `moe_layout` found it (module paths)."""

    router: str  # the recorded router: the routing layer's name
    experts: str  # its sibling, called as experts(hidden, top_k_index, top_k_weights)
    logits_index: int  # where the router's output holds its logits (the recorder's index)
    n_experts: int  # routed experts: the width of the router's logits
    top_k: int
    shared: str | None = None  # a shared expert that runs for every token
    shared_gate: str | None = None  # its gate linear


def _recorders(hf_model: nn.Module) -> list[tuple[type, int]]:
    """(router class, index of its logits in its output) that transformers records for
    `output_router_logits`, from every model class in the module tree (umbrella models nest theirs)."""
    found: dict[type, int] = {}
    for mod in hf_model.modules():
        rec = (getattr(type(mod), "_can_record_outputs", None) or {}).get(ROUTER_LOGITS)
        for r in rec if isinstance(rec, (list, tuple)) else [rec] if rec is not None else []:
            cls = getattr(r, "target_class", r)
            if isinstance(cls, type):
                found.setdefault(cls, int(getattr(r, "index", 0) or 0))
    return list(found.items())


def _first_linear(router: nn.Module) -> nn.Linear | None:
    return router if isinstance(router, nn.Linear) else next(
        (m for m in router.modules() if isinstance(m, nn.Linear)), None)


def _n_experts(router: nn.Module, index: int) -> int:
    """The width of the router's logits at `index` of its output, from one call on one zero token
    (on a meta model, shapes only); where that call needs more than the hidden state, the rows of its
    linear (its own weight, or its first Linear child)."""
    lin = _first_linear(router)
    w = lin.weight if lin is not None else getattr(router, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise UnsupportedMoE(f"its router {type(router).__name__} has no linear to read the experts' count from")
    try:
        with torch.no_grad():
            out = router(torch.zeros(1, w.shape[1], dtype=w.dtype, device=w.device))
        return int((out[index] if isinstance(out, (tuple, list)) else out).shape[-1])
    except Exception:  # a router that takes more than the hidden state: its linear's rows
        return int(w.shape[0])


TOP_K_FIELDS = ("top_k", "num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_top_k", "moe_k",
                "top_k_experts")


def _top_k(router: nn.Module, config: Any) -> int:
    """Experts per token: the router's `top_k`, else the (text) config's field for it."""
    for source in (router, getattr(config, "text_config", None), config):
        for f in TOP_K_FIELDS:
            v = getattr(source, f, None) if source is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return 1


def moe_layout(hf_model: nn.Module) -> list[MoEBlock]:
    """Every MoE block of `hf_model` in module order ([] for a dense model), or UnsupportedMoE saying
    why its routing cannot be followed. Read from the built model (meta tensors will do), never from
    config field names: a model is a mixture of experts when transformers built a router or an
    `experts` module into it."""
    recorders = _recorders(hf_model)
    classes = tuple(cls for cls, _ in recorders)
    index = dict(recorders)
    named = dict(hf_model.named_modules())
    routers = [(n, m) for n, m in named.items() if classes and isinstance(m, classes)]
    if not routers:
        experts = [n for n in named if n.rsplit(".", 1)[-1] == "experts"]
        if experts:
            raise UnsupportedMoE(f"its experts ({experts[0]}, ...) have no router that transformers records "
                                 f"for {ROUTER_LOGITS}")
        return []
    routed_blocks = {n.rsplit(".", 1)[0] if "." in n else "" for n, _ in routers}
    orphans = [n for n in named if n.rsplit(".", 1)[-1] == "experts" and (n.rsplit(".", 1)[0] if "." in n else "")
               not in routed_blocks and not isinstance(named[n], classes)]
    if orphans:
        parent = named[orphans[0].rsplit(".", 1)[0]] if "." in orphans[0] else hf_model
        raise UnsupportedMoE(f"its MoE block {type(parent).__name__} ({orphans[0]}) routes without a router that "
                             f"transformers records for {ROUTER_LOGITS}")
    blocks = []
    for name, router in routers:
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        block = named[parent]
        experts = getattr(block, "experts", None)
        if not isinstance(experts, nn.Module):
            raise UnsupportedMoE(f"its MoE block {type(block).__name__} has no `experts` module beside the router "
                                 f"{type(router).__name__} (RouteScope reads routes where a block calls "
                                 "experts(hidden, top_k_index, top_k_weights))")
        params = [p for p in inspect.signature(type(experts).forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]  # the class's: not a wrapper's
        if len(params) < 3:
            raise UnsupportedMoE(f"its MoE block {type(block).__name__} calls {type(experts).__name__}"
                                 f"({', '.join(p.name for p in params)}) without the top-k indices and weights "
                                 "(RouteScope reads routes at experts(hidden, top_k_index, top_k_weights))")
        kids = dict(block.named_children())
        shared = [k for k, m in kids.items() if k.startswith("shared") and "gate" not in k
                  and any(True for _ in m.parameters())]
        gates = [k for k in kids if k.startswith("shared") and "gate" in k]
        at = index[next(c for c in classes if isinstance(router, c))]
        blocks.append(MoEBlock(router=name, experts=f"{parent}.experts", logits_index=at,
                               n_experts=_n_experts(router, at), top_k=_top_k(router, hf_model.config),
                               shared=f"{parent}.{shared[0]}" if shared else None,
                               shared_gate=f"{parent}.{gates[0]}" if gates else None))
    return blocks



FINAL_NORMS = ("norm", "final_layernorm", "ln_f", "final_norm", "norm_f")


def _decoder_stack(hf: nn.Module, routers: list[str]) -> tuple[str | None, dict[str, int], tuple[str, str]]:
    """(path of the ModuleList of decoder layers holding every router, router -> its decoder layer's
    index, (final norm path, output embedding path)); (None, {}, ("", "")) where there is no such stack."""
    named = dict(hf.named_modules())
    found: dict[str, tuple[str, int]] = {}
    for r in routers:
        parts = r.split(".")
        for cut in range(1, len(parts)):
            if isinstance(named.get(".".join(parts[:cut])), nn.ModuleList) and parts[cut].isdigit():
                found[r] = (".".join(parts[:cut]), int(parts[cut]))
                break
    stacks = {s for s, _ in found.values()}
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    head_path = next((n for n, m in named.items() if m is head), None) if head is not None else None
    if len(found) != len(routers) or len(stacks) != 1 or head_path is None:
        return None, {}, ("", "")
    stack = stacks.pop()
    parent = stack.rsplit(".", 1)[0] if "." in stack else ""
    norm = next((f"{parent}.{n}" if parent else n for n in FINAL_NORMS
                 if isinstance(named.get(f"{parent}.{n}" if parent else n), nn.Module)), None)
    if norm is None:
        return None, {}, ("", "")
    return stack, {r: i for r, (_, i) in found.items()}, (norm, head_path)

class HFRoutingLayer(RoutingLayer):
    """The RouteScope face of one transformers router: its name, options, labels and role sites. Held
    by the HFModel in a plain dict (not a submodule: transformers' module tree stays as transformers
    built it)."""

    option_noun = "expert"
    can_force = True

    def __init__(self, block: MoEBlock, roles: dict[str, str]) -> None:
        super().__init__()
        self.block, self.name, self.n_experts, self.top_k = block, block.router, block.n_experts, block.top_k
        self.shared = bool(block.shared)
        self.n_options = self.n_experts + self.shared
        self._roles = roles

    @property
    def roles(self) -> dict[str, str]:
        return self._roles

    @property
    def n_routed(self) -> int:
        return self.n_experts  # the shared expert runs for every token

    def option_labels(self) -> list[str]:
        return [f"expert {j}" for j in range(self.n_experts)] + (["shared expert"] if self.shared else [])

