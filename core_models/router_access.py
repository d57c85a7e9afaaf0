"""`rs.routing(model, run_or_trace)[layer]`: a top-k routing layer's record of one run, as typed
attributes instead of site names (in the spirit of nnterp's router accessors).

    r = rs.routing(model, run)["model.layers.0.mlp.gate"]
    r.logits, r.probs, r.indices, r.weights, r.expert_outputs, r.shared_output

A role the run did not record raises `RoleUnavailable` (an AttributeError) whose message is the reason:
the model type's own (an HF type's record, `HFRoutingLayer.unavailable`: gpt-oss has no
probabilities over every expert), or that the trace holds no such site. `why(role)` returns that
reason instead (None where the role is there). Nothing here knows a family: it asks each layer for
its roles.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

import torch

from .sites import INDICES, LOGITS, PROBS, WEIGHTS
from .trace import Trace

EXPERT_OUTPUTS, SHARED_OUTPUT = "expert_outputs", "shared_output"


class RoleUnavailable(AttributeError):
    """A role the run did not record; the message says why."""


class RouterRecord:
    """One routing layer's record of a run. Shapes: batch rows of the run, pos its traced positions
    (prompt, then each generated token fed back), n routed experts, k experts per token."""

    def __init__(self, source: "Routing", name: str) -> None:
        self._source, self.name = source, name
        self._layer = source.model.routing_modules[name]

    def why(self, role: str) -> str | None:
        """Why `role` is not available for this layer in this run (None: it is)."""
        if role == EXPERT_OUTPUTS:
            return self._source.expert_outputs_problem(self.name)
        reason = (getattr(self._layer, "unavailable", None) or {}).get(role)
        if reason is not None:
            return f"{self.name}: no {role}: {reason}"
        site = self._layer.roles.get(role)
        if site is None:
            return f"{self.name}: {type(self._layer).__name__} records no {role}"
        if site not in self._source.trace:
            return f"{self.name}: the run's trace holds no {site!r} (trace it: tracing([{site!r}, ...]))"
        return None

    def _get(self, role: str) -> torch.Tensor:
        why = self.why(role)
        if why is not None:
            raise RoleUnavailable(why)
        return self._source.trace[self._layer.roles[role]]

    @property
    def logits(self) -> torch.Tensor:
        """[batch, pos, n] the router's logits (a dropped expert's at the mask value)."""
        return self._get(LOGITS)

    @property
    def probs(self) -> torch.Tensor:
        """[batch, pos, n] the router's own probabilities over every expert (its softmax or sigmoid)."""
        return self._get(PROBS)

    @property
    def indices(self) -> torch.Tensor:
        """[batch, pos, k] int64: the experts each token was routed to, in the router's order."""
        return self._get(INDICES)

    @property
    def weights(self) -> torch.Tensor:
        """[batch, pos, k] the weight of each selected expert, aligned with `indices`."""
        return self._get(WEIGHTS)

    @property
    def shared_output(self) -> torch.Tensor:
        """[batch, pos, hidden] the shared expert's output (before any gate the block applies)."""
        return self._get(SHARED_OUTPUT)

    @property
    def expert_outputs(self) -> torch.Tensor:
        """[batch, pos, k, hidden] each selected expert's own output (unweighted), aligned with `indices`:
        the layer's routed output is (weights[..., None] * expert_outputs).sum(-2). Computed on first use
        by one forward of the run's tokens under its ablation (`capture`), then kept."""
        why = self.why(EXPERT_OUTPUTS)
        if why is not None:
            raise RoleUnavailable(why)
        return self._source.expert_outputs(self.name)

    def __repr__(self) -> str:
        return f"RouterRecord({self.name!r})"


class Routing(Mapping):
    """Routing layer name -> `RouterRecord` for one run of `model` (layers with a top-k record only)."""

    def __init__(self, model: Any, trace: Trace, ids: list[list[int]] | None = None, ablation: Any = None) -> None:
        self.model, self.trace, self.ids, self.ablation = model, trace, ids, ablation
        self._layers = [n for n, m in model.routing_modules.items() if INDICES in m.roles]
        self._prefix: Any = None

    def __getitem__(self, layer: str) -> RouterRecord:
        if layer not in self._layers:
            raise KeyError(f"{layer!r} is not a top-k routing layer of this model; layers: {', '.join(self._layers)}")
        return RouterRecord(self, layer)

    def __iter__(self) -> Iterator[str]:
        return iter(self._layers)

    def __len__(self) -> int:
        return len(self._layers)

    def expert_outputs_problem(self, layer: str) -> str | None:
        if not hasattr(self.model, "expert_outputs") or not getattr(self.model, "can_resume", False):
            return f"{layer}: this model records no per-expert outputs"
        if self.ids is None:
            return f"{layer}: per-expert outputs need the run's token ids: pass a Run, or ids= with the trace"
        return None

    def expert_outputs(self, layer: str) -> torch.Tensor:
        if self._prefix is None:
            device = getattr(self.model, "device", torch.device("cpu"))
            with torch.no_grad():
                self._prefix = self.model.capture(torch.tensor(self.ids, device=device), ablation=self.ablation)
        with torch.no_grad():
            return self.model.expert_outputs(self._prefix, layer)


def routing(model: Any, source: Any, *, ids: list[int] | list[list[int]] | None = None) -> Routing:
    """The routing records of one run of `model`: `source` is a Run (`rs.run`: its trace, token ids and
    ablation) or a Trace (give the run's `ids` too for `expert_outputs`; a Trace alone carries none).
    `routing(model, run)[layer].weights` and so on; see `RouterRecord` for the shapes."""
    generation = getattr(source, "generation", None)
    ablation = getattr(source, "ablation", None)
    trace = generation.trace if generation is not None else source
    if not isinstance(trace, Trace):
        raise TypeError(f"routing: expected a Run or a Trace, got {type(source).__name__}")
    if generation is not None and ids is None:
        ids = generation.ids
    if ids is not None and ids and not isinstance(ids[0], list):
        ids = [list(ids)]
    if ids is not None:
        traced = next((trace[m.roles[INDICES]].shape[1] for m in model.routing_modules.values()
                       if INDICES in m.roles and m.roles[INDICES] in trace), None)
        if traced is not None:  # a run's last generated token is never fed back: the trace stops before it
            ids = [row[:traced] for row in ids]
    return Routing(model, trace, ids, ablation)
