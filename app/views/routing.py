"""Routing view: one figure per routing view the run has (`analysis.families.RoutingViews`), never
per family name; `figures(run, model)` also feeds the export tab. Option labels come from the
model's routing layers."""
from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from analysis import columns as C
from analysis.session import Run
from core_models.base import RouteScopeLM

from ..components import figures as F


STACKED = "routes"  # the name of the stacked choice heatmaps (figures(..., stacked=True))


def figures(run: Run, model: RouteScopeLM, *, stacked: bool = False) -> dict[str, go.Figure]:
    """Every figure of the run's routing views, by name. The choice heatmaps (the option picked per
    layer and token) are one figure each, or with `stacked` the rows of one figure `STACKED` when
    there are several (the view draws that; the export tab offers each alone)."""
    v, toks, n_prompt = run.views, run.display_tokens(), run.n_prompt
    labels = model.option_labels()
    grids: dict[str, F.ChoiceGrid] = {}
    if v.options is not None:
        grids["option_choice"] = F.choice_grid(v.options, toks, labels)
    if v.gumbel is not None:
        grids["gumbel_routes"] = F.gumbel_grid(v.gumbel, toks, labels)
    if v.cosine is not None and len(v.cosine):
        grids["cosine_dominance"] = F.cosine_grid(v.cosine, toks, labels)
    if v.topk is not None:
        grids["topk_routes"] = F.topk_grid(v.topk, toks, labels)
    figs: dict[str, go.Figure] = {}
    if stacked and len(grids) > 1:
        figs[STACKED] = F.stacked_choice_heatmaps(list(grids.values()), toks, n_prompt)
    else:
        figs.update({name: F.choice_heatmap(g, toks, n_prompt) for name, g in grids.items()})
    if v.options is not None:
        for layer, m in model.routing_modules.items():
            if v.options[C.LAYER].eq(layer).any() and m.n_options > 1:
                figs[f"option_weights_{layer}"] = F.option_weights_figure(v.options, layer, toks, n_prompt)
    if v.utilisation is not None:
        u = v.utilisation.assign(**{C.LABEL: [labels[l][o] for l, o in zip(v.utilisation[C.LAYER],
                                                                             v.utilisation[C.OPTION])]})
        figs["topk_utilisation"] = F.grouped_bars(u, C.LAYER, C.SHARE, C.OPTION,  # colour = option, as everywhere
                                                  "Utilisation: share of tokens selecting each option",
                                                  hover=C.LABEL)
    if v.pgpt is not None:
        p = v.pgpt
        w = p.drop_duplicates(C.OPTION)
        (layer,) = {l for l in p[C.LAYER]}
        names = labels[layer]
        figs["pgpt_weights"] = F.bar_figure([names[o] for o in w[C.OPTION]], list(w[C.WEIGHT]),
                                            "Path weights in this call (renormalised over the paths that run)")
        figs["pgpt_contribution"] = F.share_figure(
            p, toks, C.SHARE, 0, f"Per-token contribution of {names[0]} (norm share of the weighted output)",
            lambda r: f"{names[r.option]}: share {r.share:.1%} (w {r.weight:.3f})", n_prompt)
    if v.dsff is not None:
        figs["dsff_gate"] = F.gate_figure(v.dsff, toks, n_prompt)
    if v.gcla is not None:
        g = v.gcla
        figs["gcla_beta"] = F.bar_figure(list(g[C.LAYER]), list(g[C.BETA]), "GCLA beta = sigmoid(phi) per layer")
    if v.atm is not None and len(v.atm):
        figs["atm_merges"] = F.atm_figure(v.atm, toks, v.atm_tau)
    if v.pagmlp is not None:
        p = v.pagmlp
        s = p.drop_duplicates([C.LAYER, C.OPTION])
        figs["pagmlp_scales"] = F.grouped_bars(s, C.LAYER, C.SCALE, C.LABEL, "PAGMLP alpha (SwiGLU) and beta (GEGLU)")
        figs["pagmlp_share"] = F.share_figure(
            p, toks, C.SHARE, 0, "SwiGLU pathway's share of the FFN output norm per token",
            lambda r: f"{r.label}: share {r.share:.1%}, |out| {r.out_norm:.3f}", n_prompt)
    for fig in figs.values():  # which run a figure shows, kept with it (exports, and the browser test)
        fig.update_layout(meta={"ablation": run.ablation.describe(), "model": run.model_name})
    return figs


def show(run: Run, figs: dict[str, go.Figure]) -> dict[str, go.Figure]:
    """Draw `figs` (`figures(run, model, stacked=True)`, cached with the run by app.resources)."""
    if not figs:
        st.info(f"{run.family} has no routing to show: it is a dense model, or its routing layers record "
                f"nothing this view can draw.")
    elif any(F.has_divider(fig) for fig in figs.values()):
        st.caption(F.DIVIDER_LEGEND)
    for name, fig in figs.items():
        st.plotly_chart(fig, key=f"fig_{name}", width="stretch")
    if run.views.atm_summary is not None:
        st.dataframe(run.views.atm_summary, key="atm_summary", width="stretch")
    if run.views.cosine is not None:
        for note in run.views.cosine.attrs.get("notes", []):
            st.caption(note)
    return figs
