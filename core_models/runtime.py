"""Per-call state: ablations, routing mode, KV cache and the active trace.

One model instance serves every browser session at once, so nothing a call needs may live on a
module. Each forward publishes its options in a ContextVar for its own duration; modules read it.
ContextVars are per thread (and per asyncio task), so concurrent calls never see each other.
"""
from __future__ import annotations

import contextlib
import re
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

ROUTING_MODES = ("deterministic", "sampled")
ALL_LAYERS = "*"


class AblationError(ValueError):
    """An ablation names a layer or option the model does not have."""


@dataclass(frozen=True)
class Ablation:
    """Paths/blocks/experts to drop, routes to force and named modes, for one call.

    `drop` holds (layer, option) pairs; layer is a routing layer's name (see
    `model.routing_layers()`) or "*" for every layer. `force` holds (layer, option) pairs.
    `modes` names ablations a family defines beyond dropping and forcing (`model.ablation_modes()`,
    e.g. pgpt's "pgpt1-reference", the authors' pgpt-1 evaluation). Hashable, so it can key caches.
    """

    drop: tuple[tuple[str, int], ...] = ()
    force: tuple[tuple[str, int], ...] = ()
    modes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # a spec given twice is one spec
        object.__setattr__(self, "drop", tuple(sorted({(str(l), int(o)) for l, o in self.drop})))
        object.__setattr__(self, "force", tuple(sorted({(str(l), int(o)) for l, o in self.force})))
        object.__setattr__(self, "modes", tuple(sorted({str(m) for m in self.modes})))
        routes: dict[str, list[int]] = {}
        for l, o in self.force:
            routes.setdefault(l, []).append(o)
        twice = [f"{'every layer' if l == ALL_LAYERS else 'layer ' + l} to options {', '.join(map(str, os_))}"
                 for l, os_ in routes.items() if len(os_) > 1]
        if twice:
            raise AblationError(f"force: one route per layer; forced {'; '.join(twice)}")

    @property
    def is_empty(self) -> bool:
        return not self.drop and not self.force and not self.modes

    def has_mode(self, mode: str) -> bool:
        return mode in self.modes

    def dropped(self, layer: str) -> frozenset[int]:
        if not self.drop:  # asked by every routing layer on every call
            return _NONE_DROPPED
        return frozenset(o for l, o in self.drop if l == layer or l == ALL_LAYERS)

    def forced(self, layer: str) -> int | None:
        for l, o in self.force:
            if l == layer or l == ALL_LAYERS:
                return o
        return None

    @classmethod
    def parse(cls, drop: list[str] | tuple[str, ...] = (), force: list[str] | tuple[str, ...] = (),
              modes: list[str] | tuple[str, ...] = ()) -> "Ablation":
        """Parse CLI-style specs: "1" (option 1 everywhere), "parallel.0:1", "*:0"; modes by name."""
        return cls(drop=tuple(_parse_spec(s, "drop") for s in drop),
                   force=tuple(_parse_spec(s, "force") for s in force), modes=tuple(modes))

    def describe(self) -> str:
        parts = ([f"drop {l}:{o}" for l, o in self.drop] + [f"force {l}:{o}" for l, o in self.force]
                 + [f"mode {m}" for m in self.modes])
        return ", ".join(parts) if parts else "none"

    def validate(self, layers: dict[str, int], modes: dict[str, str] | None = None) -> None:
        """Check against {layer name: number of options} and the model's ablation modes
        ({name: what it does}; None: none); raise naming every bad entry."""
        bad = []
        known = modes or {}
        for m in self.modes:
            if m not in known:
                bad.append(f"mode {m!r}: not an ablation mode of this model "
                           f"(modes: {', '.join(known) or 'none'})")
        for kind, pairs in (("drop", self.drop), ("force", self.force)):
            for l, o in pairs:
                if l != ALL_LAYERS and l not in layers:
                    bad.append(f"{kind} {l}:{o}: no routing layer {l!r} (layers: {', '.join(layers) or 'none'})")
                    continue
                n = min(layers.values()) if l == ALL_LAYERS and layers else layers.get(l, 0)
                if not 0 <= o < n:
                    bad.append(f"{kind} {l}:{o}: option {o} out of range 0..{n - 1}")
        for l, n in layers.items():
            routes = sorted({o for fl, o in self.force if fl == l or fl == ALL_LAYERS})
            if len(routes) > 1:  # "*:0" and "parallel.0:1" both route parallel.0
                bad.append(f"force: layer {l!r} is forced to options {', '.join(map(str, routes))} "
                           f"(by {', '.join(f'{fl}:{o}' for fl, o in self.force if fl in (l, ALL_LAYERS))}); "
                           f"one route per layer")
            if self.forced(l) is not None and self.forced(l) in self.dropped(l):
                bad.append(f"layer {l!r}: option {self.forced(l)} is both forced and dropped")
            if len(self.dropped(l)) >= n:
                bad.append(f"drop: every option of layer {l!r} is dropped; at least one must remain")
        if bad:
            raise AblationError("invalid ablation: " + "; ".join(bad))


_NONE_DROPPED: frozenset[int] = frozenset()
_SPEC = re.compile(r"^\s*(?:(?P<layer>[\w.*]+)\s*:\s*)?(?P<option>\d+)\s*$", re.ASCII)  # ASCII: int() reads "１" too


def _parse_spec(spec: str, kind: str) -> tuple[str, int]:
    m = _SPEC.match(str(spec))
    if not m:
        raise AblationError(f"{kind} spec {spec!r}: expected OPTION or LAYER:OPTION, e.g. '1' or 'parallel.0:1'")
    return (m["layer"] or ALL_LAYERS, int(m["option"]))


NO_ABLATION = Ablation()


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


# --- tracing ---------------------------------------------------------------------------------

SiteEdit = Callable[[torch.Tensor], torch.Tensor]


class Trace:
    """Tensors recorded at routing sites during the calls made inside `tracing(...)`.

    Each visit stores a detached CPU copy (float32 for a bfloat16/float16 model), wherever the
    model runs. Calls made during generation append one record per
    step; `trace[name]` concatenates records of sites with a position axis along that axis.
    """

    def __init__(self, sites: list[str] | tuple[str, ...] | None = None,
                 edits: dict[str, SiteEdit] | None = None) -> None:
        self.wanted = None if sites is None else frozenset(sites)
        self.edits = dict(edits or {})
        self.records: dict[str, list[torch.Tensor]] = {}
        self.pos_axis: dict[str, int | None] = {}
        self.shapes: dict[str, str] = {}

    def wants(self, name: str) -> bool:
        return self.wanted is None or name in self.wanted or name in self.edits

    def visit(self, name: str, x: torch.Tensor, pos_axis: int | None, shape: str) -> torch.Tensor:
        edit = self.edits.get(name)
        if edit is not None:
            x = edit(x)
        if self.wanted is None or name in self.wanted:
            recs = self.records.get(name)
            if recs is None:
                recs = self.records[name] = []
                self.pos_axis[name] = pos_axis
                self.shapes[name] = shape
            recs.append(_record(x))
        return x

    def names(self) -> list[str]:
        return list(self.records)

    def __contains__(self, name: str) -> bool:
        return name in self.records

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.records:
            raise KeyError(f"site {name!r} was not recorded; recorded: {', '.join(self.records) or 'none'}")
        recs = self.records[name]
        if len(recs) == 1:
            return recs[0]
        axis = self.pos_axis[name]
        if axis is None:
            return recs[-1]  # position-free sites (e.g. learned weights) repeat per step
        return torch.cat(recs, dim=axis)

    def steps(self, name: str) -> list[torch.Tensor]:
        return list(self.records[name])


_REDUCED = (torch.bfloat16, torch.float16)


def _record(x: torch.Tensor) -> torch.Tensor:
    """The copy a trace keeps: detached, on the CPU, reduced-precision floats widened to float32
    (exact), so analyses, numpy and the export read any model's trace alike. Taken when the site
    fires: the copy is needed anyway, so a GPU model pays one device-to-host copy instead of a
    device clone, and no trace holds device memory. A CPU float32 tensor is cloned (the fast path);
    a model on the meta device records shapes (meta tensors: there is no data to copy)."""
    if x.is_cpu and x.dtype not in _REDUCED:
        return x.detach().clone() if x.requires_grad else x.clone()
    dtype = torch.float32 if x.dtype in _REDUCED else x.dtype
    if x.is_meta:
        return x.detach().to(dtype=dtype)
    return x.detach().to(device="cpu", dtype=dtype, copy=True)


_TRACE: ContextVar[Trace | None] = ContextVar("routescope_trace", default=None)


@contextlib.contextmanager
def tracing(sites: list[str] | tuple[str, ...] | None = None,
            edits: dict[str, SiteEdit] | None = None) -> Iterator[Trace]:
    """Record the named sites (None = all) of every forward in this context, in this thread."""
    tr = Trace(sites, edits)
    token = _TRACE.set(tr)
    try:
        yield tr
    finally:
        _TRACE.reset(token)


def active_trace() -> Trace | None:
    return _TRACE.get()
