"""The app half of every family: views of a family's own, shown beside the common views (PaPaformer:
its paper's Table 6 probes). Plugins bring theirs in their spec's `pages`."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from routescope.core_models import plugins
from routescope.core_models.ablation import Ablation
from routescope.core_models.base import RouteScopeLM

from routescope.app.views import table6


@dataclass(frozen=True)
class Page:
    """An app view of a family's own, offered beside the common views where `applies(model)`.
    `show(model, path, mtime, ablation, described)` draws it; `tables(model, path, mtime, ablation)`,
    if given, gives the tables the Export view offers for it (label -> (file name part, frame))."""

    title: str
    show: Callable[..., None]
    applies: Callable[[RouteScopeLM], bool] = lambda model: True
    tables: Callable[..., Mapping[str, Any]] | None = None


def _table6_tables(model: RouteScopeLM, path: str, mtime: float, ablation: Ablation) -> dict[str, Any]:
    report = table6.default_report(model, path, mtime, ablation)
    return {} if report is None else {"Table 6 report": ("table6", report["report"]),
                                      "Table 6 summary": ("table6_summary", report["summary"])}


FAMILY_PAGES: Mapping[str, tuple[Page, ...]] = MappingProxyType({
    "papaformer": (Page("Table 6", table6.show, tables=_table6_tables),),  # the paper's routing probes
})


def pages(model: RouteScopeLM) -> tuple[Page, ...]:
    """The pages of the model's family (built in or a plugin's) that apply to it."""
    family = model.config.family
    found = FAMILY_PAGES[family] if family in FAMILY_PAGES else plugins.part(family, "pages", ()) or ()
    return tuple(p for p in found if p.applies(model))
