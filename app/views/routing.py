"""Routing views per family (plotly); `figures(run, model)` also feeds the export tab."""
from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from analysis import columns as C
from analysis.routing import option_labels as gumbel_labels
from analysis.session import Run

from ..components import figures as F


def figures(run: Run, model) -> dict[str, go.Figure]:
    c, v, toks, n_prompt = model.config, run.views, run.tokens, run.n_prompt
    figs: dict[str, go.Figure] = {}
    if "gumbel" in v:
        figs["gumbel_routes"] = F.gumbel_figure(v["gumbel"], toks, gumbel_labels(c), n_prompt)
    if "cosine" in v and len(v["cosine"]):
        figs["cosine_dominance"] = F.cosine_figure(v["cosine"], toks, c.n_paths, n_prompt)
    if "topk" in v:
        figs["topk_routes"] = F.topk_figure(v["topk"], toks, model.routing_layers(), n_prompt)
        u = v["utilisation"]
        figs["topk_utilisation"] = F.grouped_bars(u, C.OPTION, C.SHARE, C.LAYER,
                                                  "Utilisation: share of tokens selecting each block / expert")
    if "pgpt" in v:
        p = v["pgpt"]
        w = p.drop_duplicates(C.OPTION)
        figs["pgpt_weights"] = F.bar_figure([f"path {o + 1}" for o in w[C.OPTION]], list(w[C.WEIGHT]),
                                            "Path weights in this call (renormalised over the paths that run)")
        figs["pgpt_contribution"] = F.share_figure(
            p, toks, C.SHARE, 0, "Per-token contribution of path 1 (norm share of the weighted output)",
            lambda r: f"path {r.option + 1}: share {r.share:.1%} (w {r.weight:.3f})", n_prompt)
    if "dsff" in v:
        figs["dsff_gate"] = F.gate_figure(v["dsff"], toks, n_prompt)
        g = v["gcla"]
        figs["gcla_beta"] = F.bar_figure(list(g[C.LAYER]), list(g[C.BETA]), "GCLA beta = sigmoid(phi) per layer")
    if "atm" in v and len(v["atm"]):
        tau = run.settings.atm_tau if run.settings.atm_tau is not None else c.atm_tau
        figs["atm_merges"] = F.atm_figure(v["atm"], toks, tau)
    if "pagmlp" in v:
        p = v["pagmlp"]
        s = p.drop_duplicates([C.LAYER, C.OPTION])
        figs["pagmlp_scales"] = F.grouped_bars(s, C.LAYER, C.SCALE, C.LABEL, "PAGMLP alpha (SwiGLU) and beta (GEGLU)")
        figs["pagmlp_share"] = F.share_figure(
            p, toks, C.SHARE, 0, "SwiGLU pathway's share of the FFN output norm per token",
            lambda r: f"{r.label}: share {r.share:.1%}, |out| {r.out_norm:.3f}", n_prompt)
    for fig in figs.values():  # which run a figure shows, kept with it (exports, and the browser test)
        fig.update_layout(meta={"ablation": run.ablation.describe(), "model": run.model_name})
    return figs


def show(run: Run, model) -> dict[str, go.Figure]:
    figs = figures(run, model)
    if not figs:
        st.info(f"{run.family} is a dense model: it has no routing to show.")
    for name, fig in figs.items():
        st.plotly_chart(fig, key=f"fig_{name}", width="stretch")
    if "atm_summary" in run.views:
        st.dataframe(run.views["atm_summary"], key="atm_summary", width="stretch")
    if "cosine" in run.views and run.views["cosine"].attrs.get("notes"):
        for note in run.views["cosine"].attrs["notes"]:
            st.caption(note)
    return figs
