"""The ablation spec grammar: the CLI's --drop/--force, rs.run(drop=...) and the app's Specs box.

Syntax only (no model, no torch): a spec parses to a `Selector`, and `resolve` turns selectors into
(layer, option) pairs against the model's {layer: options} and usage counts. `ablation.Ablation`
holds the pairs for one call.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Callable

ALL_LAYERS = "*"


class AblationError(ValueError):
    """An ablation names a layer or option the model does not have, or a spec is malformed."""


# --- the spec grammar (the CLI's --drop/--force, rs.run(drop=...), the app's spec box) ---------------
#
#   SPEC   := [LAYER ":"] SET                 no LAYER: every layer ("*")
#   LAYER  := a routing layer's name, "*" (every layer) or a glob over names ("model.layers.*.mlp.gate")
#   SET    := LIST                            these options          "model.layers.3.mlp.gate:0-15"
#           | "!" LIST                        all but these options  "*:!0"  (keep only option 0)
#           | "top" N ["@" SOURCE]            the N most used options of each layer, SOURCE "run" (default:
#                                             the unablated model on this run's tokens) or "corpus"
#   LIST   := ITEM ("," ITEM)*   ITEM := N | N "-" M  (0-based, inclusive)
#
# A spec is syntax only until it is resolved against the model's {layer: options} (globs, "!", top)
# and, for "top", usage counts: `Ablation.parse(..., layers=, usage=)` does both.

SOURCES = ("run", "corpus")
_SET = re.compile(r"^(?:(?P<invert>!)?\s*(?P<list>\d+(?:\s*-\s*\d+)?(?:\s*,\s*\d+(?:\s*-\s*\d+)?)*)"
                  r"|top\s*(?P<top>\d+)(?:\s*@\s*(?P<source>\w+))?)$", re.ASCII)  # ASCII: int() reads "１" too
_LAYER = re.compile(r"^[\w.*?\[\]-]+$", re.ASCII)
_GLOB = re.compile(r"[*?\[]")
SPEC_HELP = ("OPTIONS or LAYER:OPTIONS; OPTIONS: 3, 0-15, 0,4-7, !5 (all but 5) or top8 (the 8 most used, "
             "top8@corpus over the corpus); LAYER: a routing layer, * (every layer) or a glob")


@dataclass(frozen=True)
class Selector:
    """One parsed spec: options of the layers it names (module comment above)."""

    text: str
    layer: str
    options: frozenset[int] = frozenset()
    invert: bool = False
    top: int = 0
    source: str = "run"

    @property
    def needs_model(self) -> bool:
        return self.invert or bool(self.top) or (self.layer != ALL_LAYERS and bool(_GLOB.search(self.layer)))


class SpecError(AblationError):
    """A malformed spec: `reason` first, then the spec it concerns."""

    def __init__(self, reason: str, spec: str) -> None:
        super().__init__(f"{reason}: {spec}")
        self.reason, self.spec = reason, spec


def parse_selector(spec: str, kind: str = "drop") -> Selector:
    """The syntax of one spec (no model needed); SpecError saying what is wrong first."""
    text = str(spec).strip()
    named = f"{kind} {text[:80]!r}"
    layer, colon, sets = text.rpartition(":")
    layer, sets = layer.strip(), sets.strip()
    if colon and not _LAYER.match(layer):
        raise SpecError("no layer before the colon" if not layer else "bad layer name", named)
    m = _SET.match(sets)
    if not m:
        raise SpecError("cannot read the options" if sets else "no options", named)
    layer = layer or ALL_LAYERS
    if m["top"] is not None:
        source = (m["source"] or "run").lower()
        if source not in SOURCES:
            raise SpecError(f"unknown usage source {source!r} (top N@run or top N@corpus)", named)
        if int(m["top"]) < 1:
            raise SpecError("top N needs N >= 1", named)
        return Selector(text, layer, top=int(m["top"]), source=source)
    options: set[int] = set()
    for item in m["list"].split(","):
        lo, _, hi = item.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise SpecError(f"range {a}-{b} runs backwards", named)
        if b - a > 1_000_000:
            raise SpecError(f"range {a}-{b} is larger than any layer", named)
        options.update(range(a, b + 1))
    return Selector(text, layer, frozenset(options), invert=bool(m["invert"]))


Usage = Callable[[str], "dict[str, Any]"]  # source ("run" / "corpus") -> {layer: counts per option}


def _targets(sel: Selector, kind: str, layers: dict[str, int] | None) -> list[str]:
    if layers is None:
        raise AblationError(f"a glob, '!' or top N needs the model's routing layers to resolve: {kind} {sel.text!r}")
    if sel.layer == ALL_LAYERS:
        return list(layers)
    if _GLOB.search(sel.layer):
        found = [l for l in layers if fnmatch.fnmatchcase(l, sel.layer)]
        if not found:
            raise AblationError(f"no routing layer matches {sel.layer!r} (layers: {some(list(layers), 3)}): "
                                f"{kind} {sel.text!r}")
        return found
    return [sel.layer]


def _most_used(sel: Selector, kind: str, layer: str, n: int, usage: Usage | None) -> list[int]:
    if usage is None:
        raise AblationError(f"top N needs usage counts ({sel.source}), which are not available here: {kind} {sel.text!r}")
    counts = usage(sel.source).get(layer)
    if counts is None:
        raise AblationError(f"no usage counts for layer {layer!r} (it has no per-token routes): {kind} {sel.text!r}")
    counts = [int(c) for c in list(counts)[:n]]
    return sorted(sorted(range(len(counts)), key=lambda o: (-counts[o], o))[:sel.top])  # ties: the lower option


def resolve(selectors: list[Selector], kind: str, layers: dict[str, int] | None = None,
            usage: Usage | None = None) -> tuple[tuple[str, int], ...]:
    """(layer, option) pairs of parsed specs: "*" stays "*" where no model is needed."""
    pairs: list[tuple[str, int]] = []
    for sel in selectors:
        if not sel.needs_model:
            pairs += [(sel.layer, o) for o in sorted(sel.options)]
            continue
        for layer in _targets(sel, kind, layers):
            n = layers.get(layer, 0) if layers else 0
            if sel.top:
                pairs += [(layer, o) for o in _most_used(sel, kind, layer, n, usage)]
            elif sel.invert:
                pairs += [(layer, o) for o in range(n) if o not in sel.options]
                pairs += [(layer, o) for o in sorted(sel.options) if o >= n]  # named, so validate says why
            else:
                pairs += [(layer, o) for o in sorted(sel.options)]
    return tuple(pairs)


def ranges(options) -> str:
    """Options as the spec grammar writes them: [0, 1, 2, 3, 7] -> "0-3,7"."""
    out, run = [], []
    for o in sorted(set(options)):
        if run and o == run[-1] + 1:
            run.append(o)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)))
        run = [o]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)))
    return ",".join(out)


def listed(options) -> str:
    """A few options as "0, 1"; many as ranges."""
    options = sorted(set(options))
    return ", ".join(map(str, options)) if len(options) <= 8 else ranges(options)


def in_order(pair: tuple[str, int]) -> tuple:
    """(layer, option) in the model's order: "*" first, numbers in names compared as numbers."""
    layer, option = pair
    return (layer != ALL_LAYERS, [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", layer)],
            option)


def some(items: list[str], limit: int = 6) -> str:
    """A list for one line: the first `limit` items, then how many more."""
    if not items:
        return "none"
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"


def summarised(head: str, problems: list[str], limit: int = 3) -> str:
    """One error line: `head`, then the first `limit` problems and how many more."""
    shown = "; ".join(problems[:limit])
    more = f"; and {len(problems) - limit} more problems" if len(problems) > limit else ""
    return f"{head}: {shown}{more}"
