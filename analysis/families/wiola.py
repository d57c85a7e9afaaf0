"""Wiola's analysis (paper Secs. VII-IX): DSFF gates (GATE, eq. 36), GCLA betas (BLEND, eq. 27) and
ATM merges (ADJACENT_COS, MERGE_MAP; Algorithm 1) from a second pass with token merging on, which
generation's KV cache cannot run. Every site comes from the layers' roles.

Export rows: "gate_mean" per token and DSFF layer, "beta" per GCLA block (per call), and with ATM
on "adjacent_cos" and "merge" per token and ATM layer.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from routescope.core_models.ablation import Ablation
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.sites import ADJACENT_COS, BLEND, GATE, MERGE_MAP
from routescope.core_models.trace import Trace, tracing
from routescope.core_models.wiola import ATM, ATM_CAUSAL, ATM_TAU

from routescope.analysis.export import columns as C
from routescope.analysis.runs import routing as R
from routescope.analysis.runs.views import (FAMILY, FamilyAnalysis, RunViews, export_rows, per_call_rows,
                                              role_sites_at, views_of)


NON_CAUSAL_ATM = ("Token merging here is the paper's ATM, which is not causal: a merged pair's output is copied back "
                  "to its first token, so that position reads the next token (README deviations; atm_causal=True "
                  "merges causally).")


def wiola_merge_pass(model: RouteScopeLM, ids: list[int], ablation: Ablation, options: Mapping[str, Any]) -> Trace:
    """A forward of the whole sequence with token merging on, tracing the ATM sites only."""
    sites = [*model.sites_of(ADJACENT_COS).values(), *model.sites_of(MERGE_MAP).values()]
    with tracing(sites) as tr:
        model(torch.tensor([ids]), ablation=ablation, **{**options, ATM: True})
    return tr


def wiola_views(trace: Trace, model: RouteScopeLM, *, second: Trace | Callable[[], Trace] | None = None,
                 options: Mapping[str, Any] = {}) -> RunViews:
    """`second`: the merge pass's trace, or how to get it (`views.once`: run when a merge view is
    first asked for)."""
    tau = options.get(ATM_TAU)
    causal = options.get(ATM_CAUSAL, model.config.atm_causal)
    merged = second if callable(second) else (lambda: second)

    def merges():
        atm = R.atm_merges(merged(), model, tau=tau)
        if len(atm) and not causal:  # said under the view (the Routing view shows frames' notes)
            atm.attrs["notes"] = [*atm.attrs.get("notes", []), NON_CAUSAL_ATM]
        return atm if len(atm) else None

    atm = atm_summary = None
    if second is not None:
        atm, atm_summary = merges, (lambda: R.atm_summary(merged(), model, tau=tau))
    used = {"tau": model.config.atm_tau if tau is None else tau}
    return views_of(("dsff_gate", lambda: R.dsff_gates(trace, model), FAMILY),
                    ("gcla_beta", lambda: R.gcla_betas(trace, model), FAMILY),
                    ("atm_merges", atm, FAMILY, used), ("atm_summary", atm_summary, "table", used))


def wiola_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    g = views["dsff_gate"].frame
    site = role_sites_at(g, model, GATE)
    a = g[C.GATE_MEAN].to_numpy()
    parts = [export_rows(g, site=site, kind="gate_mean", option=0, value=a, selected=a >= 0.5),
             export_rows(g, site=site, kind="gate_mean", option=1, value=1.0 - a, selected=a < 0.5)]
    betas = views["gcla_beta"].frame
    beta_sites = model.sites_of(BLEND)
    parts.append(per_call_rows([(layer, beta_sites[layer], "beta", None, b)
                                for layer, b in zip(betas[C.LAYER], betas[C.BETA])], n_batch))
    atm = R.atm_merges(trace, model)  # rows only when this call merged tokens
    if len(atm):
        cos = atm[atm[C.ADJACENT_COS].notna()]
        parts.append(export_rows(cos, site=role_sites_at(cos, model, ADJACENT_COS), kind="adjacent_cos", option=None,
                                 value=C.ADJACENT_COS))
        parts.append(export_rows(atm, site=role_sites_at(atm, model, MERGE_MAP), kind="merge", option=None,
                                 value=atm[C.GROUP].astype(float).to_numpy(), selected=C.MERGED))
    return parts, []


ANALYSIS = FamilyAnalysis(views=wiola_views, export=wiola_export, second_pass=wiola_merge_pass)
