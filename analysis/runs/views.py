"""What every family's analysis is made of (`FamilyAnalysis`): the routing views of a traced run
(name -> `View`: a tidy frame; the app's Routing and Export views loop over them), the rows a traced
call adds to the export table, the family's per-token routes (`RouteReader`: the report, probe
routes, corpus statistics) and a second pass where its views need one. Each family's own is one
module of `analysis.families` (papaformer, topk for MoEP and Hugging Face MoE, pgpt, wiola, llama),
registered by `analysis.runs.family_table`; code elsewhere asks that table by the model
(`family_analysis(model)`), never compares family names.

Everything else about a family comes from its model: routing layers, the sites of their roles,
option labels and whether forcing means anything (`core_models.sites.RoleLayer`), its label
(`config.label`), its per-call options (`model.run_options()`). A family with no analysis of its own
gets `GENERIC`, built from the OPTION_WEIGHTS role of each routing layer
(`analysis.runs.routing.option_weights`), so a new routed family needs no analysis code to be
explored and exported: "weight" per token and option of every layer recording its option weights
(selected = the largest). What `value` means for each export `kind`: `columns.KINDS`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import threading
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
import torch

from routescope.core_models.ablation import Ablation
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.sites import OPTION_WEIGHTS
from routescope.core_models.trace import Trace

from routescope.analysis.export import columns as C
from routescope.analysis.runs import routing as R


@dataclass(frozen=True)
class View:
    """One named view of a traced run: a tidy frame (a long table of `analysis.runs.routing`) and its kind,
    which names the common drawer that draws it (`routescope.rendering.drawers.DRAWERS`) unless
    the family's spec has a drawer for the view's name.
    `params`: what the drawer needs besides the frame (e.g. the ATM threshold used). Read-only: one
    run may serve many browser sessions. Notes about the frame are in `frame.attrs["notes"]`."""

    frame: pd.DataFrame
    drawer: str
    params: Mapping[str, Any] = field(default_factory=dict)


FAMILY = "family"  # the kind of a view that its family's spec draws (`FamilySpec.drawers`)
RunViews = Mapping[str, View]  # view name -> view, in the order the app shows them


Frame = "pd.DataFrame | None | Callable[[], pd.DataFrame | None]"  # a frame, none, or how to make one


class LazyViews(Mapping):
    """A run's views (name -> View), each frame computed when first asked for and kept: a toggle on a
    page that shows no routing view computes none of them, and a page computes only what it shows.
    Names whose frame comes out None are not in it. Read-only and thread-safe: one cached run may
    serve several browser sessions (a lock makes each frame once)."""

    def __init__(self, makers: Mapping[str, tuple[Any, str, Mapping[str, Any]]]) -> None:
        self._makers = dict(makers)  # name -> (frame or maker, drawer kind, params)
        self._made: dict[str, View | None] = {}
        self._lock = threading.Lock()

    def _view(self, name: str) -> View | None:
        with self._lock:
            if name not in self._made:
                make, drawer, params = self._makers[name]
                with torch.inference_mode():  # as the run was traced: trace tensors are inference tensors
                    frame = make() if callable(make) else make
                self._made[name] = None if frame is None else View(frame, drawer, params)
            return self._made[name]

    def __getitem__(self, name: str) -> View:
        view = self._view(name) if name in self._makers else None
        if view is None:
            raise KeyError(name)
        return view

    def __iter__(self):
        return (name for name in self._makers if self._view(name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def then(self, other: Mapping[str, View]) -> "LazyViews":
        """These views, then `other`'s (lazy ones stay lazy; a name in both: other's)."""
        more = other._makers if isinstance(other, LazyViews) else \
            {n: (v.frame, v.drawer, v.params) for n, v in other.items()}
        return LazyViews({**self._makers, **more})


def once(make: Callable[[], Any]) -> Callable[[], Any]:
    """`make`, called on first use and its result kept (thread-safe): a pass that only some views need
    (Wiola's second pass with token merging on) runs when the first of them is asked for, under
    inference mode as the run was."""
    lock, made = threading.Lock(), []

    def get() -> Any:
        with lock:
            if not made:
                with torch.inference_mode():
                    made.append(make())
            return made[0]
    return get


def views_of(*named: tuple[str, Frame, str] | tuple[str, Frame, str, Mapping]) -> LazyViews:
    """The views of a run from (name, frame, drawer[, params]): a frame, None (left out), or a
    callable that makes one (or None) when the view is first asked for (`LazyViews`)."""
    return LazyViews({name: (frame, drawer, MappingProxyType(dict(params[0])) if params else MappingProxyType({}))
                      for name, frame, drawer, *params in named})


@dataclass(frozen=True)
class RouteReader:
    """How a family's per-token routes are read (the report, probe routes and corpus statistics):
    its routing layers in forward order, the label of each 1-based route r (= option r - 1), the
    sites to trace, and `routes(trace)` -> (L, B, T) 1-based routes, 0 where undefined (a probe's
    expected path r = route r, where the family's spec declares probes). `topk(trace)`, for
    families whose layers pick several options per token: (L, B, T, k) 1-based picks best first,
    0 where undefined or where a layer picks fewer than k (its `sites` are among `sites`).
    `routed`: per layer, how many of its options (the first ones) its router picks among; later
    ones run for every token (a shared expert). None: every option is routed."""

    layers: list[str]
    labels: list[str]
    sites: list[str]
    routes: Callable[[Any], np.ndarray]
    description: str  # for pages: the model and how a route is read
    topk: Callable[[Any], np.ndarray] | None = None
    routed: tuple[int, ...] | None = None
    # (routes, top-k or None) as int64 tensors where the trace holds its records (a GPU corpus traces
    # `on_device` and counts there); None: the reader has numpy only
    tensors: Callable[[Any], tuple[torch.Tensor, torch.Tensor | None]] | None = None


Views = Callable[..., RunViews]  # (trace, model, *, second: Trace | None, options: Mapping) -> RunViews
Export = Callable[[Trace, RouteScopeLM, int, RunViews], "tuple[list[pd.DataFrame], list[str]]"]
SecondPass = Callable[[RouteScopeLM, list[int], Ablation, Mapping[str, Any]], Trace]


@dataclass(frozen=True)
class FamilyAnalysis:
    """How analysis handles one family. `second_pass`: a forward besides generation whose trace
    the views need (Wiola: merge maps come from a pass with token merging on, which generation's
    KV cache cannot run). `route_reader`: the family's per-token routes (None: it has none, e.g.
    pgpt's one learned mix per call)."""

    views: Views
    export: Export
    second_pass: SecondPass | None = None
    route_reader: Callable[[RouteScopeLM], RouteReader] | None = None


# --- rows of the export table -------------------------------------------------------------------

def export_rows(df: pd.DataFrame, *, layer: str | None = None, site: Any, kind: str, value: Any,
                option: Any = C.OPTION, selected: Any = None, per_token: bool = True) -> pd.DataFrame:
    """Reshape an analysis frame into export columns (batch, position, layer, site, kind, option,
    value, selected); `analysis.export.run_table.routing_table` adds the rest. Column names or
    arrays/scalars are accepted."""
    def get(v: Any) -> Any:
        if isinstance(v, str) and v in df.columns:
            return df[v].to_numpy()
        return v.to_numpy() if isinstance(v, pd.Series) else v  # never align on a filtered index

    n = len(df)
    return pd.DataFrame({
        C.BATCH: df[C.BATCH].to_numpy() if C.BATCH in df.columns else np.zeros(n, dtype=int),
        C.POSITION: df[C.POSITION].to_numpy() if per_token else np.full(n, -1),
        C.LAYER: df[C.LAYER].to_numpy() if layer is None else layer,
        C.SITE: get(site), C.KIND: kind, C.OPTION: get(option), C.VALUE: get(value),
        C.SELECTED: get(selected) if selected is not None else pd.NA,
    }, index=range(n))


def per_call_rows(rows: list[tuple[str, str, str, int | None, float]], n_batch: int) -> pd.DataFrame:
    """Per-call values (layer, site, kind, option, value), repeated for every batch row."""
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows * n_batch, columns=[C.LAYER, C.SITE, C.KIND, C.OPTION, C.VALUE])
    df[C.BATCH] = np.repeat(np.arange(n_batch), len(rows))
    df[C.POSITION] = -1
    df[C.SELECTED] = pd.NA
    return df


def role_sites_at(df: pd.DataFrame, model: RouteScopeLM, role: str) -> np.ndarray:
    """The site of `role` (`model.sites_of`) at each row's layer."""
    return df[C.LAYER].map(model.sites_of(role)).to_numpy()


def option_sites_at(df: pd.DataFrame, model: RouteScopeLM, role: str) -> np.ndarray:
    """The site of the per-option `role` (`model.option_sites_of`) at each row's layer and option."""
    sites = model.option_sites_of(role)
    return np.array([sites[layer][j] for layer, j in zip(df[C.LAYER], df[C.OPTION])], dtype=object)


# --- generic: any routing layer's option weights --------------------------------------------------

def _generic_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RunViews:
    w = R.option_weights(trace, model)
    return views_of(("options", w if len(w) else None, "option_weights"))  # OPTION_WEIGHTS only: cheap


def _generic_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    if "options" not in views:
        return [], [f"{model.config.label} records no option weights of its routing layers to export"
                    if model.routing_modules else f"{model.config.label} has no routing layers to export"]
    w = views["options"].frame
    return [export_rows(w, site=role_sites_at(w, model, OPTION_WEIGHTS), kind="weight", value=C.WEIGHT,
                        selected=C.SELECTED)], []


GENERIC = FamilyAnalysis(views=_generic_views, export=_generic_export)
