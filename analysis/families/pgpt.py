"""ParallelGPT's analysis (paper Sec. 3, eqs. 1-3: P paths mixed by learned weights): each path's
mixing weight (PATH_WEIGHTS) and its share of the mixed output's norm (PATHS). No per-token routes:
the mix is one per call.

Export rows: "weight" per path (per call), "contribution" per token and path.
"""
from __future__ import annotations

from typing import Any

from routescope.core_models.base import RouteScopeLM
from routescope.core_models.sites import PATH_WEIGHTS, PATHS
from routescope.core_models.trace import Trace

from routescope.analysis.export import columns as C
from routescope.analysis.runs import routing as R
from routescope.analysis.runs.views import (FAMILY, FamilyAnalysis, RunViews, export_rows, option_sites_at,
                                              per_call_rows, views_of)


def pgpt_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RunViews:
    return views_of(("pgpt_paths", lambda: R.pgpt_paths(trace, model), FAMILY))


def pgpt_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    p = views["pgpt_paths"].frame
    parts = [export_rows(p, site=option_sites_at(p, model, PATHS), kind="contribution", value=C.SHARE,
                         selected=C.DOMINANT)]
    for layer, weights in model.sites_of(PATH_WEIGHTS).items():
        w = trace[weights].float().tolist()
        parts.append(per_call_rows([(layer, weights, "weight", j, x) for j, x in enumerate(w)], n_batch))
    return parts, []


ANALYSIS = FamilyAnalysis(views=pgpt_views, export=pgpt_export)
