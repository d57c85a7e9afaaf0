"""`Ablation`: the paths, blocks and experts one call drops, the routes it forces and the named modes.

Built from specs (`specs`' grammar) by `Ablation.parse`, checked against a model by `validate`;
hashable, so it keys caches. The call in progress carries it in its `run_state.RunState`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .specs import (ALL_LAYERS, SPEC_HELP, AblationError, SpecError, Usage, in_order, listed, parse_selector, ranges,
                    resolve, some, summarised)

_NONE_DROPPED: frozenset[int] = frozenset()  # shared: `dropped` runs on every routing call


@dataclass(frozen=True)
class Ablation:
    """Paths/blocks/experts to drop, routes to force and named modes, for one call.

    `drop` holds (layer, option) pairs; layer is a routing layer's name (see
    `model.routing_layers()`) or "*" for every layer. `force` holds (layer, option) pairs.
    `modes` names ablations a family defines beyond dropping and forcing (`model.ablation_modes()`,
    e.g. pgpt's "pgpt1-reference", the authors' pgpt-1 evaluation). Hashable, so it can key caches.
    `specs`: the specs as given (e.g. "*:top8"), for provenance; not part of equality (the pairs are).
    `below_top_k`: a top-k layer may keep fewer options than its router picks per token (it then routes
    with those left); for analyses that mask options (Shapley coalitions), never for a user's ablation,
    which `validate` refuses there (the router would pick a dropped option, or silently fewer).
    """

    drop: tuple[tuple[str, int], ...] = ()
    force: tuple[tuple[str, int], ...] = ()
    modes: tuple[str, ...] = ()
    specs: tuple[str, ...] = field(default=(), compare=False)
    below_top_k: bool = False

    def __post_init__(self) -> None:
        # a spec given twice is one spec
        object.__setattr__(self, "drop", tuple(sorted({(str(l), int(o)) for l, o in self.drop}, key=in_order)))
        object.__setattr__(self, "force", tuple(sorted({(str(l), int(o)) for l, o in self.force}, key=in_order)))
        object.__setattr__(self, "modes", tuple(sorted({str(m) for m in self.modes})))
        object.__setattr__(self, "specs", tuple(self.specs))
        routes: dict[str, list[int]] = {}
        for l, o in self.force:
            routes.setdefault(l, []).append(o)
        twice = [f"{'every layer' if l == ALL_LAYERS else 'layer ' + l} to options {listed(os_)}"
                 for l, os_ in routes.items() if len(os_) > 1]
        if twice:
            more = f"; and {len(twice) - 3} more layers" if len(twice) > 3 else ""
            raise AblationError(f"force: one route per layer; forced {'; '.join(twice[:3])}{more}")

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
              modes: list[str] | tuple[str, ...] = (), *, layers: dict[str, int] | None = None,
              usage: Usage | None = None) -> "Ablation":
        """Parse specs (the grammar above): "1" (option 1 everywhere), "parallel.0:1", "*:0-3",
        "model.layers.*.mlp.gate:!0", "*:top8"; modes by name. `layers` ({name: options},
        `model.routing_layers()`) resolves globs, "!" and top N; `usage(source)` gives the counts top
        N ranks by. Every malformed spec is named in one error, its reason first."""
        bad: dict[str, list[str]] = {}
        parsed = {}
        for kind, specs in (("drop", drop), ("force", force)):
            sels = []
            for s in specs:
                try:
                    sel = parse_selector(s, kind)
                except SpecError as e:
                    bad.setdefault(e.reason, []).append(e.spec)
                    continue
                if kind == "force" and (sel.invert or sel.top or len(sel.options) != 1):
                    bad.setdefault("force takes one option per layer (LAYER:OPTION)", []).append(repr(sel.text))
                    continue
                sels.append(sel)
            parsed[kind] = sels
        if bad:
            problems = [f"{reason}: {some(specs, 3)}" for reason, specs in bad.items()]
            raise AblationError(summarised("invalid ablation spec", problems) + f" (specs: {SPEC_HELP})")
        pairs = {kind: resolve(sels, kind, layers, usage) for kind, sels in parsed.items()}
        return cls(drop=pairs["drop"], force=pairs["force"], modes=tuple(modes),
                   specs=tuple([str(s).strip() for s in drop] + [f"force {str(s).strip()}" for s in force]))

    def parts(self) -> list[str]:
        """The ablation as specs, one per layer and kind, options as ranges ("drop *:0-3")."""
        out = []
        for kind, pairs in (("drop", self.drop), ("force", self.force)):
            by_layer: dict[str, list[int]] = {}
            for l, o in pairs:
                by_layer.setdefault(l, []).append(o)
            out += [f"{kind} {l}:{ranges(os_)}" for l, os_ in by_layer.items()]
        return out + [f"mode {m}" for m in self.modes]

    def describe(self) -> str:
        """Every spec, per layer with ranges ("drop *:0,2, drop model.layers.3.mlp.gate:0-15"): exact."""
        parts = self.parts()
        return ", ".join(parts) if parts else "none"

    def summary(self, limit: int = 4) -> str:
        """`describe()` for a line on screen: layers that drop (or force) the same options are one
        entry ("drop 0-3 in 48 layers (model.layers.0.mlp.gate .. model.layers.47.mlp.gate)"), then at
        most `limit` entries and how many more."""
        entries = []
        for kind, pairs in (("drop", self.drop), ("force", self.force)):
            by_layer: dict[str, list[int]] = {}
            for l, o in pairs:
                by_layer.setdefault(l, []).append(o)
            groups: dict[str, list[str]] = {}
            for l, os_ in by_layer.items():
                groups.setdefault(ranges(os_), []).append(l)
            for opts, ls in groups.items():
                entries.append(f"{kind} {ls[0]}:{opts}" if len(ls) == 1 else
                               f"{kind} {opts} in {len(ls)} layers ({ls[0]} .. {ls[-1]})")
        entries += [f"mode {m}" for m in self.modes]
        if not entries:
            return "none"
        if len(entries) <= limit:
            return ", ".join(entries)
        return (f"{', '.join(entries[:limit])} and {len(entries) - limit} more "
                f"({len(self.drop)} options dropped in {len({l for l, _ in self.drop})} layers)")

    def validate(self, layers: dict[str, int], modes: dict[str, str] | None = None,
                 top_k: dict[str, tuple[int, int]] | None = None) -> None:
        """Check against {layer name: number of options}, the model's ablation modes ({name: what it
        does}; None: none) and its top-k routers ({layer: (k, options it picks among)},
        `model.routing_top_k()`; None: not checked); raise one line: each reason first, then (at most
        a few of) the specs it concerns."""
        bad = self.problems(layers, modes, top_k)
        if bad:
            raise AblationError(summarised("invalid ablation", [f"{r}: {some(specs, 3)}" for r, specs in bad.items()]))

    def problems(self, layers: dict[str, int], modes: dict[str, str] | None = None,
                 top_k: dict[str, tuple[int, int]] | None = None) -> dict[str, list[str]]:
        """What `validate` refuses: {reason: the specs it concerns}; empty when valid."""
        bad: dict[str, list[str]] = {}

        def say(reason: str, spec: str) -> None:
            bad.setdefault(reason, []).append(spec)

        known = modes or {}
        for m in self.modes:
            if m not in known:
                say(f"not an ablation mode of this model (modes: {', '.join(known) or 'none'})", f"mode {m!r}")
        for kind, pairs in (("drop", self.drop), ("force", self.force)):
            unknown: dict[str, list[int]] = {}  # one entry per layer, its options as ranges: "drop foo:0-15"
            for l, o in pairs:
                if l != ALL_LAYERS and l not in layers:
                    unknown.setdefault(l, []).append(o)
                    continue
                n = min(layers.values()) if l == ALL_LAYERS and layers else layers.get(l, 0)
                if not 0 <= o < n:
                    say(f"option out of range 0..{n - 1}", f"{kind} {l}:{o}")
            for l, os_ in unknown.items():
                say(f"no routing layer {l!r} (layers: {some(list(layers), 3)})", f"{kind} {l}:{ranges(os_)}")
        for l, n in layers.items():
            routes = sorted({o for fl, o in self.force if fl == l or fl == ALL_LAYERS})
            if len(routes) > 1:  # "*:0" and "parallel.0:1" both route parallel.0
                say("one route per layer", f"layer {l!r} forced to options {listed(routes)} (by "
                    f"{', '.join(f'{fl}:{o}' for fl, o in self.force if fl in (l, ALL_LAYERS))})")
            if self.forced(l) is not None and self.forced(l) in self.dropped(l):
                say("an option both forced and dropped", f"layer {l!r} option {self.forced(l)}")
            if len(self.dropped(l)) >= n:
                say("every option of the layer dropped; at least one must remain", f"layer {l!r}")
                continue
            k, routed = (top_k or {}).get(l, (0, n))
            left = routed - sum(1 for o in self.dropped(l) if o < routed)
            if self.forced(l) is None and left < k and not self.below_top_k:  # it would pick a dropped option
                say(f"fewer options left than the router picks per token (top-{k}); drop at most "
                    f"{routed - k} or force one", f"layer {l!r} keeps {left} of {routed}")
        return bad


def applicable(drop: list[str] | tuple[str, ...] = (), force: list[str] | tuple[str, ...] = (),
               modes: list[str] | tuple[str, ...] = (), *, layers: dict[str, int],
               known_modes: dict[str, str] | None = None, top_k: dict[str, tuple[int, int]] | None = None,
               usage: Usage | None = None, base: Ablation | None = None) -> tuple[Ablation, list[tuple[str, str]]]:
    """Each spec on its own: one that parses, resolves and, added to `base` and the specs applied
    before it, leaves a valid ablation is applied; any other is left out. Returns the ablation of
    `base` and the applied specs (their text in `specs`), and (spec, reason) of each spec left out,
    for one line each (`Ablation.parse` and `validate`, by contrast, refuse every spec for one bad one)."""
    current = base or Ablation()
    left_out: list[tuple[str, str]] = []
    items = [("drop", s) for s in drop] + [("force", s) for s in force] + [("mode", m) for m in modes]
    for kind, spec in items:
        text = str(spec).strip()
        shown = text if kind == "drop" else f"{kind} {text}"
        try:
            if kind == "mode":
                one = Ablation(modes=(text,), specs=(shown,))
            else:
                sel = parse_selector(text, kind)
                if kind == "force" and (sel.invert or sel.top or len(sel.options) != 1):
                    raise SpecError("force takes one option per layer (LAYER:OPTION)", text)
                pairs = resolve([sel], kind, layers, usage)
                one = Ablation(**{kind: pairs}, specs=(shown,))
            merged = Ablation(drop=current.drop + one.drop, force=current.force + one.force,
                              modes=current.modes + one.modes, specs=current.specs + one.specs)
        except SpecError as e:
            left_out.append((shown, e.reason))
            continue
        except AblationError as e:  # resolving (a glob that matches nothing, top N without counts), one route
            left_out.append((shown, _reason(str(e), text)))
            continue
        before = current.problems(layers, known_modes, top_k)
        new = [r for r, specs in merged.problems(layers, known_modes, top_k).items() if specs != before.get(r)]
        if new:
            left_out.append((shown, "; ".join(new)))
            continue
        current = merged
    return current, left_out


def _reason(message: str, text: str) -> str:
    """An AblationError's message without the spec it ends with (the line names the spec first)."""
    for tail in (f": drop {text!r}", f": force {text!r}"):
        message = message.removesuffix(tail)
    return message.removeprefix("force: ")


NO_ABLATION = Ablation()
