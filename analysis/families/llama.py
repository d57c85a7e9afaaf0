"""Llama's analysis: PAGMLP pathways where the FFN is `pagmlp` (paper Sec. 3, eq. 3): each pathway's
scale (PATH_SCALES: alpha, beta), activation norm (PATHS) and share of the layer's output. A dense
Llama routes nothing.

Export rows: "alpha"/"beta" per layer (per call), "norm" and "contribution" per token and pathway.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from routescope.core_models.base import RouteScopeLM
from routescope.core_models.sites import PATH_SCALES, PATHS
from routescope.core_models.trace import Trace

from routescope.analysis.export import columns as C
from routescope.analysis.runs import routing as R
from routescope.analysis.runs.views import (FAMILY, FamilyAnalysis, RunViews, export_rows, option_sites_at,
                                              per_call_rows, views_of)


def llama_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RunViews:
    def pathways():
        p = R.pagmlp_pathways(trace, model)
        return p if len(p) else None
    return views_of(("pagmlp_pathways", pathways, FAMILY))


def llama_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    if "pagmlp_pathways" not in views:
        return [], [f"{model.config.label} has no routing layers to export"]
    p = views["pagmlp_pathways"].frame
    site = option_sites_at(p, model, PATHS)
    share = p[C.SHARE].to_numpy()
    dominant = share >= np.repeat(share.reshape(-1, 2).max(1), 2)
    parts = [export_rows(p, site=site, kind="norm", value=C.OUT_NORM),
             export_rows(p, site=site, kind="contribution", value=share, selected=dominant)]
    per_call = []
    scales = model.option_sites_of(PATH_SCALES)
    for layer in dict.fromkeys(p[C.LAYER]):
        alpha, beta = scales[layer]
        per_call += [(layer, alpha, "alpha", 0, float(trace[alpha])), (layer, beta, "beta", 1, float(trace[beta]))]
    parts.append(per_call_rows(per_call, n_batch))
    return parts, []


ANALYSIS = FamilyAnalysis(views=llama_views, export=llama_export)
