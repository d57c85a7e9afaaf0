"""PaPaformer's analysis (Share-Linear, Gumbel MoE v1/v2; paper Sec. 3.3): its views, export
rows and per-token routes. Routes follow the paper's Sec. 5 reading: a Gumbel layer's route is its
router's choice (CHOICE), a Share-Linear layer's the path (PATHS) whose output has the highest cosine
with the layer's COMBINED output. Every site comes from the layers' roles. The paper's probe prompts
and their routes are `analysis.runs.domain`.

Export rows: Gumbel: "prob" per candidate (selected = the recorded choice), "cosine" per path.
Share-Linear: "cosine" per path (selected = dominant); with fused_grow the last layer's cosine is
undefined and the layer is skipped (noted in `df.attrs["notes"]`).
"""
from __future__ import annotations

import html
from typing import Any

import numpy as np

from routescope.core_models.base import RouteScopeLM
from routescope.core_models.sites import CHOICE, COMBINED, PATHS, PROBS
from routescope.core_models.trace import Trace

from routescope.analysis.export import columns as C
from routescope.analysis.runs import routing as R
from routescope.analysis.runs.views import (FAMILY, FamilyAnalysis, RouteReader, RunViews, export_rows,
                                              option_sites_at, views_of)


def papaformer_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RunViews:
    gumbel = (lambda: R.gumbel_routes(trace, model)) if any(m.stochastic for m in model.routing_modules.values()) \
        else None
    return views_of(("gumbel_routes", gumbel, FAMILY), ("cosine_dominance", lambda: R.cosine_dominance(trace, model), FAMILY))


def papaformer_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    parts = []
    if "gumbel_routes" in views:
        g = views["gumbel_routes"].frame
        probs = {name: m.roles[PROBS] for name, m in model.routing_modules.items() if PROBS in m.roles}
        parts.append(export_rows(g, site=g[C.LAYER].map(probs), kind="prob", value=C.PROB, selected=C.SELECTED))
    cos = views["cosine_dominance"].frame
    notes = list(cos.attrs.get("notes", []))
    cos = cos[cos[C.COSINE].notna()]
    parts.append(export_rows(cos, site=option_sites_at(cos, model, PATHS), kind="cosine",
                             value=C.COSINE, selected=C.DOMINANT))
    return parts, notes


def papaformer_token_routes(trace: Trace, model: RouteScopeLM) -> np.ndarray:
    """(n_parallel_layers, B, T) 1-based route of every token, 0 where undefined. A layer with a
    router (Gumbel) routes by its recorded choice; a Share-Linear layer by the path whose output has
    the highest cosine with the combined output (undefined where the cosine is: fused grow). Pure."""
    per_layer = []
    cos = None
    for layer in _parallel_layers(model):
        choice = model.routing_modules[layer].roles.get(CHOICE)
        if model.routing_modules[layer].stochastic:
            if choice not in trace:
                raise ValueError(f"the trace has no site {choice!r}")
            per_layer.append(trace[choice].cpu().numpy().astype(np.int64) + 1)
            continue
        cos = R.cosine_dominance(trace, model) if cos is None else cos
        c = cos[cos[C.LAYER] == layer]
        if not len(c):
            raise ValueError(f"the trace has no path/combined outputs for {layer}")
        B, T = int(c[C.BATCH].max()) + 1, int(c[C.POSITION].max()) + 1
        dom = c[c[C.DOMINANT]]
        r = np.zeros((B, T), dtype=np.int64)
        r[dom[C.BATCH].to_numpy(), dom[C.POSITION].to_numpy()] = dom[C.OPTION].to_numpy() + 1
        per_layer.append(r)
    return np.stack(per_layer)


def _parallel_layers(model: RouteScopeLM) -> list[str]:
    return list(model.routing_layers())  # PaPaformer's routing layers are its parallel layers, in order


def _papaformer_route_sites(model: RouteScopeLM) -> list[str]:
    """The sites `papaformer_token_routes` reads (Gumbel: router choices; Share-Linear: path and
    combined outputs)."""
    out = []
    for m in model.routing_modules.values():
        out += [m.roles[CHOICE]] if m.stochastic else [m.roles[COMBINED], *m.option_roles[PATHS]]
    return out


def route_labels(config: Any) -> list[str]:
    """Label of each 1-based route as the PaPaformer paper numbers them (route r = option r - 1):
    index r - 1 -> "route r", the last Gumbel route "combined"."""
    return [f"route {j}" for j in range(1, config.n_paths + 1)] + (["combined"] if config.has_combined_route else [])


def papaformer_reader(model: RouteScopeLM) -> RouteReader:
    cfg = model.config
    return RouteReader(
        _parallel_layers(model), route_labels(cfg), _papaformer_route_sites(model),
        lambda tr: papaformer_token_routes(tr, model),
        f"PaPaformer, combiner <b>{html.escape(cfg.combiner)}</b>, {cfg.n_parallel_layers} parallel layers of "
        f"{cfg.n_paths} paths. A route is the Gumbel router's choice, or Share-Linear's path whose output has "
        "the highest cosine with the combined output (undefined routes left out). Routes are 1-based like "
        "the paper (route r = path r - 1).")


ANALYSIS = FamilyAnalysis(views=papaformer_views, export=papaformer_export, route_reader=papaformer_reader)
