"""Routing sites and routing layers: both named by their module path.

A `Site` is an identity module at a routing decision or blend. Like TransformerLens hook points it
is named by its module path (set once by `name_sites`), so a name is never typed twice; `site_name`
builds a name from its parts where a model declares its roles (as TransformerLens's get_act_name).
A site costs one ContextVar read when no trace is active; nothing is ever registered on the module,
so nothing can be left behind.

A `RoutingLayer` is a module that chooses among options per call (paths, blocks, experts, streams,
pathways). It carries what the rest of RouteScope needs to know about its choice: how many options,
their labels, whether forcing one means more than dropping the others. Its module path is the layer
name that ablations, analysis tables and the app use. A `RoleLayer` (every routing layer is one)
declares which of its sites plays which role (router logits, path outputs, a gate, a merge map...):
analysis reads a trace only through these, never by building or matching site names.
"""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from .run_state import current
from .trace import active_trace

# Routing roles: what a layer's sites mean. Analysis asks a layer for the site of a role
# (`layer.roles[INDICES]`, `model.sites_of(GATE)`) and never builds a site name, so our routers
# (`moe_shrink.router.indices`) and transformers' (`model.layers.3.mlp.gate.indices`) read alike.
# Each role's recorded shape is in ROLE_AXES (the roles test checks every family's trace against it).
LOGITS = "logits"  # [batch, pos, n] router logits over the n routed options
PROBS = "probs"  # [batch, pos, n] router probabilities (absent where the router computes none: gpt-oss)
INDICES = "indices"  # [batch, pos, k] selected options (int64), as the router returned them
WEIGHTS = "weights"  # [batch, pos, k] weight of each selected option, aligned with INDICES
CHOICE = "choice"  # [batch, pos] the one chosen option (int64)
# [batch, pos, n_options] weight of each option in this call (0 where unused or dropped); also the
# site, relative to the layer, that generic analyses read when a family has no analysis of its own
OPTION_WEIGHTS = "option_weights"
COMBINED = "combined"  # [batch, pos, width] the layer's combination of its paths' outputs
PATH_WEIGHTS = "path_weights"  # [n_options] weight of each path in this call, one for every token (0 where dropped)
GATE = "gate"  # [batch, pos, width] per-dimension weight of option 0; option 1 gets 1 - gate (a two-path blend)
BLEND = "blend"  # [] weight of the second path in this call: (1 - blend) * first + blend * second
ADJACENT_COS = "adjacent_cos"  # [batch, pos-1] cosine of the hidden states at t and t+1 (token merging)
MERGE_MAP = "merge_map"  # [batch, pos] int64 merge group of each position (equal groups = merged)
ROLES = (LOGITS, PROBS, INDICES, WEIGHTS, CHOICE, OPTION_WEIGHTS, COMBINED, PATH_WEIGHTS, GATE, BLEND, ADJACENT_COS,
         MERGE_MAP)
# Per-option roles (`layer.option_roles[PATHS][j]`: the site of option j; the first options, in order)
PATHS = "paths"  # [batch, pos, width] output of path j (absent where it did not run)
PATH_SCALES = "path_scales"  # [] scale of path j in this call
OPTION_ROLES = (PATHS, PATH_SCALES)
# role -> its recorded axes: "batch", "pos", "pos-1" (one fewer than pos), "n" (the routed options,
# `RoutingLayer.n_routed`), "options" (all of them, `n_options`), "k" and "width" (any size)
ROLE_AXES: dict[str, tuple[str, ...]] = {
    LOGITS: ("batch", "pos", "n"), PROBS: ("batch", "pos", "n"), INDICES: ("batch", "pos", "k"),
    WEIGHTS: ("batch", "pos", "k"), CHOICE: ("batch", "pos"), OPTION_WEIGHTS: ("batch", "pos", "options"),
    COMBINED: ("batch", "pos", "width"), PATH_WEIGHTS: ("options",), GATE: ("batch", "pos", "width"), BLEND: (),
    ADJACENT_COS: ("batch", "pos-1"), MERGE_MAP: ("batch", "pos"), PATHS: ("batch", "pos", "width"),
    PATH_SCALES: (),
}


def site_name(*parts: object) -> str:
    """The full name of a site from its module path parts: site_name("parallel", 0, "router", "probs")
    -> "parallel.0.router.probs"; site_name(layer, "combined") -> "<layer>.combined"."""
    return ".".join(str(p) for p in parts if p != "")


class Site(nn.Module):
    """Identity at a routing decision. `shape` documents the recorded tensor, e.g.
    "[batch, pos, n_options]"; `pos_axis` says which axis is the token position (None if none)."""

    def __init__(self, shape: str, pos_axis: int | None = 1) -> None:
        super().__init__()
        self.name = ""
        self.shape = shape
        self.pos_axis = pos_axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tr = active_trace()
        if tr is not None and tr.wants(self.name):
            return tr.visit(self.name, x, self.pos_axis, self.shape)
        return x

    def extra_repr(self) -> str:
        return f"{self.name!r}, shape={self.shape}"


class RoleLayer(nn.Module):
    """A module whose sites play roles (`ROLES`, `OPTION_ROLES`), named by its module path: every
    routing layer, and the layers that record a routing-like decision without choosing among options
    (Wiola's token merger and gated cross-layer attention). `role_sites` / `option_role_sites` give
    each role's site path relative to the layer; a layer whose sites depend on its build overrides
    `roles` / `option_roles` instead."""

    name: str = ""  # module path, set by name_sites
    role_sites: ClassVar[dict[str, str]] = {}
    option_role_sites: ClassVar[dict[str, tuple[str, ...]]] = {}

    @property
    def roles(self) -> dict[str, str]:
        """Role (`ROLES`) -> the full name of the site that records it."""
        return {role: site_name(self.name, rel) for role, rel in self.role_sites.items()}

    @property
    def option_roles(self) -> dict[str, tuple[str, ...]]:
        """Per-option role (`OPTION_ROLES`) -> the full name of option j's site, j = 0, 1, ..."""
        return {role: tuple(site_name(self.name, r) for r in rels) for role, rels in self.option_role_sites.items()}


class RoutingLayer(RoleLayer):
    """Base of a module that chooses among `n_options` options per call; named by its module path.

    Subclasses give `n_options` (class attribute, instance attribute or property) and
    `option_noun` ("path", "expert", ...), or override `option_labels`. `can_force`: forcing an
    option means more than dropping the others (a router decides, so a forced route is a
    counterfactual); `stochastic`: sampled routing draws from this layer's router. Options are
    numbered from 0 everywhere (ablation specs, tables, labels)."""

    option_noun: ClassVar[str] = "option"
    can_force: bool = False
    stochastic: bool = False
    n_options: int
    # options a router picks for each token among the first `n_routed` (None: no fixed number, e.g. a
    # weighted mix of every option or one sampled path); `Ablation.validate` keeps at least this many
    top_k: int | None = None
    # the generic role by default (a family without analyses of its own records it)
    role_sites: ClassVar[dict[str, str]] = {OPTION_WEIGHTS: OPTION_WEIGHTS}

    def option_labels(self) -> list[str]:
        return [f"{self.option_noun} {j}" for j in range(self.n_options)]

    @property
    def n_routed(self) -> int:
        """How many of the options (the first ones) a router picks among; later ones run for every
        token (a shared expert)."""
        return self.n_options

    def dropped(self) -> frozenset[int]:
        """Options the call in progress drops at this layer."""
        return current().ablation.dropped(self.name)

    def forced(self) -> int | None:
        """The option the call in progress forces at this layer, if any."""
        return current().ablation.forced(self.name)

    def skipped(self) -> frozenset[int]:
        """Options not run in this call: the dropped ones, and with a forced option every other
        (for layers without a router, forcing = dropping the others)."""
        forced = self.forced()
        return self.dropped() if forced is None else frozenset(range(self.n_options)) - {forced}


def name_sites(model: nn.Module) -> dict[str, Site]:
    """Give every Site and RoleLayer its module path as name; return the sites in forward order
    of definition."""
    sites = {}
    for name, mod in model.named_modules():
        if isinstance(mod, (Site, RoleLayer)):
            mod.name = name
        if isinstance(mod, Site):
            sites[name] = mod
    return sites


def routing_layers(model: nn.Module) -> dict[str, RoutingLayer]:
    """Every RoutingLayer of `model` by name (module path), in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, RoutingLayer)}


def role_layers(model: nn.Module) -> dict[str, RoleLayer]:
    """Every RoleLayer of `model` (routing layers among them) by name (module path), in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, RoleLayer)}
