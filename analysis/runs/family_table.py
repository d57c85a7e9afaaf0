"""The analysis half of every family, as one table: how its traced runs become views and export rows
(`FamilyAnalysis`, each family's in its module of `analysis.families`) and, where its paper prints expected routes,
its probe prompts (`ProbeTable`). Families from outside the repository bring theirs in their spec
(`core_models.plugins`); a family with neither gets `GENERIC`, read from its routing layers' roles.
Code elsewhere asks this table by the model, never compares family names."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

import pandas as pd

from routescope.core_models import plugins
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.registry import family_names
from routescope.core_models.trace import Trace

from routescope.analysis.families import llama, papaformer, pgpt, topk, wiola
from routescope.analysis.runs import domain
from routescope.analysis.runs import views as A
from routescope.analysis.runs import routing as R


@dataclass(frozen=True)
class ProbeTable:
    """Probe prompts whose expected route a family's paper prints, as data the generic code loops
    over: the report's accuracy section, the corpus view's shipped datasets and `routescope routes`.
    `sets`: probe set name -> TSV (the first: the paper's own); `accuracy(model, tokenizer, sets)` ->
    (long accuracy table: probe_set, route_at, source, metric, value; per-probe tables by name);
    `intended()`: the corpus view's intended option per label value (from the first set);
    `note`: what the report says of the accuracy; `command(args, model, tokenizer)`: the table
    `routescope routes` prints (its exit status); a built-in family's command is the CLI's
    (`cli.routes.COMMANDS`)."""

    sets: Mapping[str, Any]
    accuracy: Callable[..., tuple[Any, Mapping[str, Any]]]
    intended: Callable[[], Mapping[str, Mapping[str, int]]]
    note: str
    command: Callable[..., int] | None = None


# each family's analysis is its module of analysis.families
ANALYSES: Mapping[str, A.FamilyAnalysis] = MappingProxyType({
    "llama": llama.ANALYSIS, "papaformer": papaformer.ANALYSIS, "pgpt": pgpt.ANALYSIS, "moep": topk.MOEP,
    "wiola": wiola.ANALYSIS, "hf": topk.HF,
})  # lgpt and cgpt route nothing: generic views of their (absent) option weights

# the paper's Table 6 probes and our held-out ones, read at the last prompt token or by majority
PROBES: Mapping[str, ProbeTable] = MappingProxyType({
    "papaformer": ProbeTable(sets=dict(domain.PROBE_SETS), accuracy=domain.probe_accuracy,
                             intended=domain.probe_intended, note=domain.REPORT_NOTE),
})

# Views every family gets, read from its routing layers' roles: (name, frame of (trace, model) or
# None, drawer kind). A new one is a function in analysis.runs.routing and a row here.
GENERIC_VIEWS: tuple[tuple[str, Callable[[Trace, RouteScopeLM], pd.DataFrame | None], str], ...] = (
    ("router_entropy", R.router_entropy, "table"),
)


def analysis_of(family: str) -> A.FamilyAnalysis:
    """The analysis of family `family` (built in, a plugin's, else GENERIC)."""
    if family in ANALYSES:
        return ANALYSES[family]
    return plugins.part(family, "analysis", None) or A.GENERIC


def family_analysis(model: RouteScopeLM) -> A.FamilyAnalysis:
    return analysis_of(model.config.family)


def probe_table(family: str) -> ProbeTable | None:
    """Family `family`'s probe prompts with expected routes, or None where its paper prints none."""
    return PROBES[family] if family in PROBES else plugins.part(family, "probes", None)


def probe_tables() -> dict[str, ProbeTable]:
    """Every family's probe table, in family order."""
    return {name: t for name in family_names() if (t := probe_table(name)) is not None}


def routing_views(trace: Trace, model: RouteScopeLM, *, second: Trace | None = None,
                  options: Mapping[str, Any] = {}) -> A.RunViews:
    """The views the app draws for this model's traced call (`second`: the family's second pass):
    the family's own, then GENERIC_VIEWS (each left out where it finds nothing to show), each
    computed when first asked for (`LazyViews`)."""
    views = family_analysis(model).views(trace, model, second=second, options=options)
    generic = A.views_of(*((name, functools.partial(view, trace, model), drawer) for name, view, drawer in GENERIC_VIEWS))
    lazy = views if isinstance(views, A.LazyViews) else A.views_of().then(views)  # a plugin's plain mapping
    return lazy.then(generic)


def route_reader(model: RouteScopeLM) -> A.RouteReader:
    """The model's per-token routes, or ValueError naming the families that have them."""
    analysis = family_analysis(model)
    if analysis.route_reader is None:
        having = ", ".join(n for n in family_names() if analysis_of(n).route_reader is not None)
        raise ValueError(f"{model.config.label} has no per-token routes to read (families with them: {having})")
    return analysis.route_reader(model)
