"""Which modules of a transformers model route (`moe_layout`), read from the model transformers built,
and the RouteScope face of each router (`HFRoutingLayer`)."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..sites import RoutingLayer
from .quirks import GATES, GENERIC, LOGITS, PROBS, SCORES, SLOTS, Quirk, quirk

ROUTER_LOGITS = "router_logits"  # transformers' recorder key for its routers

class UnsupportedMoE(ValueError):
    """A transformers MoE model whose routing RouteScope cannot follow; the message says why."""


@dataclass(frozen=True)
class MoEBlock:
    """One MoE block of a transformers model, as `moe_layout` found it (module paths) by its type's record."""

    router: str  # the recorded router: the routing layer's name
    experts: str | None  # its sibling, called as experts(hidden_states, top_k_index, top_k_weights) (or, where
    # the record reads the routes at the router, as the block calls it; None: no one module)
    logits_index: int | None  # where the router's output holds its logits (None: its linear's result)
    n_experts: int  # routed experts: the width of the router's logits
    top_k: int
    quirk: Quirk = GENERIC  # its type's record
    probs_index: int | None = None  # where the router's output holds its probabilities, if it returns them
    choice_bias: str | None = None  # the tensor added to its scores before selection
    shared: str | None = None  # a shared expert that runs for every token
    shared_gate: str | None = None  # its gate linear
    routes_at_router: bool = False  # the routes are the router's own top-k and its output (`Quirk.routes`)
    logits_weight: str | None = None  # the weight whose op gives the logits, where not the router's first op
    choice_width: int | None = None  # where the record masks at the router's choice among every expert
    # (`Quirk.expert_attr`): that many experts


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


def _n_experts(router: nn.Module, index: int, logits_weight: str | None = None) -> int:
    """The width of the router's logits at `index` of its output, from one call on one zero token
    (on a meta model, shapes only); where that call needs more than the hidden state, the rows of its
    linear (the record's logits weight, its own weight, or its first Linear child)."""
    lin = _first_linear(router)
    w = _resolve(router, logits_weight) if logits_weight else lin.weight if lin is not None else \
        getattr(router, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise UnsupportedMoE(f"its router {type(router).__name__} has no linear to read the experts' count from")
    try:
        with torch.no_grad():
            out = router(torch.zeros(1, w.shape[1], dtype=w.dtype, device=w.device))
        return int((out[index] if isinstance(out, (tuple, list)) else out).shape[-1])
    except Exception:  # a router that takes more than the hidden state: its linear's rows
        return int(w.shape[0])


def _resolve(source: Any, path: str) -> Any:
    """`source.a.b` for path "a.b" (None where an attribute is missing)."""
    for part in path.split("."):
        source = getattr(source, part, None)
    return source


def _text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def _top_k(router: nn.Module, config: Any, q: Quirk) -> int:
    """Experts per token where the record says: the router's attribute or the (text) config's field."""
    where, _, path = q.top_k.partition(".")
    v = _resolve(router if where == "router" else _text_config(config), path)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise UnsupportedMoE(f"its record reads experts per token from {q.top_k}, which "
                             f"{type(router).__name__ if where == 'router' else 'its config'} does not hold")
    return v


def moe_layout(hf_model: nn.Module) -> list[MoEBlock]:
    """Every MoE block of `hf_model` in module order ([] for a dense model), or UnsupportedMoE saying
    why its routing cannot be followed. Read from the built model (meta tensors will do), never from
    config field names: a model is a mixture of experts when transformers built a router or an
    `experts` module into it."""
    recorders = _recorders(hf_model)
    classes = tuple(cls for cls, _ in recorders)
    index = dict(recorders)
    named = dict(hf_model.named_modules())
    recorded = [(n, m) for n, m in named.items() if classes and isinstance(m, classes)]
    # the innermost recorded module is the router (JetMoE records its attention too, around its attention
    # experts' router)
    routers = [(n, m) for n, m in recorded if not any(o.startswith(n + ".") for o, _ in recorded)]
    if not routers:
        experts = [n for n in named if n.rsplit(".", 1)[-1] == "experts"]
        if experts:
            raise UnsupportedMoE(f"its experts ({experts[0]}, ...) have no router that transformers records "
                                 f"for {ROUTER_LOGITS}")
        return []
    q = quirk(getattr(hf_model.config, "model_type", ""))
    routed_blocks = {n.rsplit(".", 1)[0] if "." in n else "" for n, _ in routers}
    # blocks whose router its record names as static (a fixed table): they run as built, no routing layer
    static = {n.rsplit(".", 1)[0] if "." in n else "" for n, m in named.items()
              if type(m).__name__ in q.static_routers}
    orphans = [n for n in named if n.rsplit(".", 1)[-1] == "experts" and (n.rsplit(".", 1)[0] if "." in n else "")
               not in routed_blocks | static and n not in routed_blocks and not isinstance(named[n], classes)]
    if orphans:
        parent = named[orphans[0].rsplit(".", 1)[0]] if "." in orphans[0] else hf_model
        raise UnsupportedMoE(f"its MoE block {type(parent).__name__} ({orphans[0]}) routes without a router that "
                             f"transformers records for {ROUTER_LOGITS}")
    if q.refused:
        raise UnsupportedMoE(q.refused)
    if q.call_order:  # within a decoder layer, the order its forward calls them
        routers.sort(key=lambda r: _call_rank(r[0], q.call_order, list(named)))
    return [_block(name, router, named, index[next(c for c in classes if isinstance(router, c))], q, hf_model.config)
            for name, router in routers]


def _call_rank(name: str, order: tuple[str, ...], module_order: list[str]) -> tuple[int, int]:
    """(module rank of the decoder layer holding `name`, rank in `order` of its child holding it)."""
    parts = name.split(".")
    at = next((i for i, p in enumerate(parts) if p in order), None)
    if at is None:
        raise UnsupportedMoE(f"its router {name} sits under none of {', '.join(order)}, its record's call order")
    return module_order.index(".".join(parts[:at])), order.index(parts[at])


def _block(name: str, router: nn.Module, named: dict[str, nn.Module], at: int, q: Quirk, config: Any) -> MoEBlock:
    """The MoE block around `router` as its record `q` describes it, or UnsupportedMoE naming what the
    record expects and the model lacks."""
    parent = name.rsplit(".", 1)[0] if "." in name else ""
    block = named[parent]
    where = f"its MoE block {type(block).__name__}"
    experts = getattr(block, q.experts, None) if q.experts else None
    call = "experts(hidden, top_k_index, top_k_weights)"  # the wording of refusals (README support table)
    if not isinstance(experts, nn.Module) and not (q.routes == "router" and q.experts is None):
        raise UnsupportedMoE(f"{where} has no `experts` module beside the router {type(router).__name__} "
                             f"(RouteScope reads routes where a block calls {call})")
    params = [p for p in inspect.signature(type(experts).forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:] if experts is not None else []
    if q.routes == "router":  # the routes are the router's own top-k and its output (scores, or sorted gates)
        if SCORES not in q.output and not {SLOTS, GATES} <= set(q.output) and not q.expert_attr:
            raise UnsupportedMoE(f"its record reads routes at the router but names no weights in its output ({q.why})")
    elif len(params) < 3:
        raise UnsupportedMoE(f"{where} calls {type(experts).__name__}({', '.join(p.name for p in params)}) without "
                             f"the top-k indices and weights (RouteScope reads routes at {call})")
    n = getattr(router, q.expert_attr, None) if q.expert_attr else _n_experts(router, at, q.logits_weight)
    if isinstance(n, int) and q.expert_attr:
        n = n ** q.expert_power  # Doge: the experts its product keys reach
    if not isinstance(n, int) or n <= 0:
        raise UnsupportedMoE(f"its router {type(router).__name__} has no expert count `{q.expert_attr}`, which its "
                             f"record names ({q.why})")
    for child in (q.shared, q.shared_gate):
        if child is not None and not isinstance(getattr(block, child, None), nn.Module):
            raise UnsupportedMoE(f"{where} has no `{child}`, which its record names ({q.why})")
    bias = None
    if q.choice_bias is not None:
        t = _resolve(block, q.choice_bias)
        if not isinstance(t, torch.Tensor) or t.numel() != n:
            raise UnsupportedMoE(f"{where} has no selection bias `{q.choice_bias}` with one entry per expert, which "
                                 f"its record names ({q.why})")
        bias = f"{parent}.{q.choice_bias}" if parent else q.choice_bias
    logits = q.output.index(LOGITS) if LOGITS in q.output else None
    if logits is not None and logits != at and not q.reason(LOGITS):
        raise UnsupportedMoE(f"its router {type(router).__name__} gives transformers' router_logits at output {at}, "
                             f"its record at {logits} ({', '.join(q.output)})")
    return MoEBlock(router=name, experts=f"{parent}.{q.experts}" if experts is not None else None,
                    logits_index=logits, n_experts=n,
                    top_k=_top_k(router, config, q), quirk=q,
                    probs_index=q.output.index(PROBS) if PROBS in q.output else None, choice_bias=bias,
                    routes_at_router=q.routes == "router",
                    logits_weight=f"{name}.{q.logits_weight}" if q.logits_weight else None,
                    choice_width=n if q.expert_attr else None,
                    shared=f"{parent}.{q.shared}" if q.shared else None,
                    shared_gate=f"{parent}.{q.shared_gate}" if q.shared_gate else None)


def _decoder_stack(hf: nn.Module, routers: list[str], final_norm: str | None
                   ) -> tuple[str | None, dict[str, int], tuple[str, str]]:
    """(path of the ModuleList of decoder layers holding every router, router -> its decoder layer's
    index, (final norm path, output embedding path)); (None, {}, ("", "")) where there is no such stack
    or no final norm of the record's name (`final_norm`) beside it."""
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
    norm = (f"{parent}.{final_norm}" if parent else final_norm) if final_norm else None
    if norm is None or not isinstance(named.get(norm), nn.Module):
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
        self.unavailable = dict(block.quirk.unavailable)  # role -> why its site stays empty for this type
        self.block, self.name, self.n_experts, self.top_k = block, block.router, block.n_experts, block.top_k
        self.shared = bool(block.shared)
        self.n_options = self.n_experts + self.shared
        self._roles = roles
        # what it routes to, where its record says (JetMoE's attention experts)
        self.option_noun = next((noun for seg, noun in block.quirk.option_nouns if f".{seg}." in f".{self.name}."),
                                "expert")

    @property
    def roles(self) -> dict[str, str]:
        return self._roles

    @property
    def n_routed(self) -> int:
        return self.n_experts  # the shared expert runs for every token

    def option_labels(self) -> list[str]:
        last = list(self.block.quirk.last_options)  # options past the experts (ZAYA's skip class)
        return [f"{self.option_noun} {j}" for j in range(self.n_experts - len(last))] + last + \
            (["shared expert"] if self.shared else [])


def router_weights(block: MoEBlock, output: tuple, idx: torch.Tensor) -> torch.Tensor:
    """[tokens, k] the weights the block gives the router's own top-k `idx` [tokens, k], read from the
    router's `output` where its record reads the routes there: its dense scores at `idx` (Llama-4), or
    its gates sorted by expert put back in token order by their slots (JetMoE)."""
    names = block.quirk.output
    if SCORES in names:
        return output[names.index(SCORES)].gather(-1, idx)
    slots, gates = output[names.index(SLOTS)], output[names.index(GATES)]
    w = torch.empty_like(gates)
    w[slots] = gates
    return w.reshape(idx.shape)

