"""One `FamilySpec` per family: what the family is (config and model classes, parameter count,
presets) and what it offers (analysis views and export rows, its route reader, probe prompts, the
drawers of its views, app pages of its own). Each layer keeps its own half in a table keyed by family
name (`core_models.registry.MODEL_FAMILIES`, `analysis.runs.family_table`, `rendering.drawers.
FAMILY_DRAWERS`, `app.pages.FAMILY_PAGES`, `cli.routes.COMMANDS`); this module, on top of every
layer, joins them into one spec per family. Nothing below imports it.

Families outside the repository register through the `routescope.families` entry point (its value:
a FamilySpec, or a callable returning one, named as the entry point); each layer then finds its part
of the plugin's spec (`core_models.plugins`), with no edit here. `register(spec)` adds one in-process
(tests).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from routescope.analysis.runs import family_table as FT
from routescope.analysis.runs.views import GENERIC, FamilyAnalysis
from routescope.analysis.runs.family_table import ProbeTable
from routescope.app.pages import FAMILY_PAGES, Page
from routescope.core_models import plugins
from routescope.core_models import registry as M
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.config import BaseConfig
from routescope.rendering import drawers as D
from routescope.rendering.draw_context import Drawer

ENTRY_POINTS = plugins.GROUP


@dataclass(frozen=True)
class FamilySpec:
    """Everything RouteScope knows of one family. `drawers`: view name (as the family's
    `analysis.views` names them) -> the callable that draws it; views not listed use the common
    drawers (`rendering.drawers.DRAWERS`, by the view's kind). `presets`: named configs of
    this family (preset name -> config fields). `probes`: its paper's probe prompts with expected
    routes, where it prints them."""

    name: str
    config: type[BaseConfig]
    model: type[RouteScopeLM]
    param_count: Callable[[Any], int]
    analysis: FamilyAnalysis = GENERIC
    drawers: Mapping[str, Drawer] = field(default_factory=dict)
    pages: tuple[Page, ...] = ()
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    description: str = ""
    probes: ProbeTable | None = None


BUILTIN: tuple[FamilySpec, ...] = tuple(
    FamilySpec(f.name, f.config, f.model, f.param_count, analysis=FT.analysis_of(f.name),
               drawers=D.drawers_of(f.name), pages=FAMILY_PAGES.get(f.name, ()), presets=f.presets,
               description=f.description, probes=FT.probe_table(f.name))
    for f in M.MODEL_FAMILIES)
_BUILTIN = {s.name: s for s in BUILTIN}


def names() -> list[str]:
    """Every family: built-in ones, then plugins."""
    return M.family_names()


def specs() -> list[FamilySpec]:
    return [spec(n) for n in names()]


def spec(family: Any) -> FamilySpec:
    """The spec of `family`; ConfigError in one line naming the known families (and why a plugin
    of that name did not load)."""
    if isinstance(family, str) and family in _BUILTIN:
        return _BUILTIN[family]
    M.model_family(family)  # ConfigError where unknown or broken
    return plugins.plugin(family)


def spec_of(model: RouteScopeLM) -> FamilySpec:
    return spec(model.config.family)


def register(family: FamilySpec) -> None:
    """Add a family in-process (as an entry point would); a built-in family is never replaced."""
    plugins.add(family)


def unregister(name: str) -> None:
    plugins.remove(name)


def presets() -> dict[str, tuple[str, Mapping[str, Any]]]:
    """Every family's presets: preset name -> (family, fields)."""
    return M.presets()


__all__ = ["FamilySpec", "Page", "ProbeTable", "names", "presets", "register", "spec", "spec_of", "specs", "unregister"]
