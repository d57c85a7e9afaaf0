"""Figures of an expert-importance sweep (`analysis.reports.importance`) and its offline page: plotly only,
no Streamlit, so the CLI's page and the app's Experts view draw the same figures.

- heatmap: layer x option of `delta_nll`, options in their order or sorted by effect per layer; a
  cell whose interval lies outside its layer's random-expert control is marked ★;
- proxies: each cheap proxy against `delta_nll`, one panel per proxy (Spearman per layer on hover);
- pruning: the dataset loss against experts pruned per layer, one curve per ranking (the random
  ranking with its interval over draws).
"""
from __future__ import annotations

import html
from typing import Any, Mapping

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from routescope.analysis.corpus.page import html_table, render_page
from routescope.analysis.reports.importance import outside_control

PROXIES = (("usage", "usage"), ("gate_usage", "gate-weighted usage"), ("reap", "REAP"))
SECTIONS = {
    "heatmap": ("Causal importance", "Mean next-token NLL with each expert dropped alone minus without, over every "
                "predicted position of the dataset (teacher-forced). ★: its 95% bootstrap interval lies outside the "
                "interval of its layer's random-expert control."),
    "proxies": ("Cheap proxies against the causal effect", "Each proxy against delta_nll per expert (REAP: mean "
                "over the tokens routed to the expert of router weight x the norm of its output). Hover a point for its "
                "layer's Spearman rho, listed in the proxy agreement table: where it is low, the proxy does not rank "
                "experts as dropping them does."),
    "pruning": ("Pruning what-if", "Dataset loss with the N least important experts of every layer dropped at once, "
                "ranked by causal effect, by usage and at random (band: 95% of the random draws)."),
}


def flagged(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    imp = tables["importance"].copy()
    imp["outside_control"] = outside_control(imp, tables["control_summary"]) if len(tables["control_summary"]) \
        else False
    return imp


def heatmap(tables: Mapping[str, pd.DataFrame], sort: bool = False) -> go.Figure:
    imp = flagged(tables)
    layers = list(dict.fromkeys(imp["layer"]))
    if sort:  # each layer's options by effect, largest first: column j is the j-th most important
        imp = imp.sort_values(["layer", "delta_nll"], ascending=[True, False])
        imp["col"] = imp.groupby("layer", sort=False).cumcount()
    else:
        imp["col"] = imp["option"]
    z = imp.pivot(index="layer", columns="col", values="delta_nll").reindex(layers)
    text = imp.assign(t=np.where(imp["outside_control"], "★", "")).pivot(index="layer", columns="col",
                                                                         values="t").reindex(layers)
    hover = imp.assign(h=[f"{r.label}<br>delta_nll {r.delta_nll:.4g} [{r.delta_nll_low:.4g}, {r.delta_nll_high:.4g}]"
                          f"<br>KL {r.kl:.3g} · flips {r.flip_rate:.3g} · usage {r.usage:.3g}"
                          for r in imp.itertuples()]).pivot(index="layer", columns="col", values="h").reindex(layers)
    fig = go.Figure(go.Heatmap(z=z.to_numpy(), x=list(z.columns), y=layers, text=text.fillna("").to_numpy(),
                               texttemplate="%{text}", customdata=hover.fillna("").to_numpy(),
                               hovertemplate="%{y}<br>%{customdata}<extra></extra>", colorscale="Viridis",
                               colorbar=dict(title="ΔNLL")))
    fig.update_layout(xaxis_title="rank within layer (most important first)" if sort else "option",
                      yaxis=dict(autorange="reversed"), height=max(260, 28 * len(layers) + 140),
                      margin=dict(l=10, r=10, t=30, b=40))
    return fig


def proxies(tables: Mapping[str, pd.DataFrame]) -> go.Figure:
    prox, agree = tables["proxies"], tables["proxy_agreement"]
    shown = [(c, t) for c, t in PROXIES if c in prox and prox[c].notna().any()]
    colors = px.colors.qualitative.Plotly
    fig = make_subplots(rows=1, cols=max(1, len(shown)), shared_yaxes=True, subplot_titles=[t for _, t in shown])
    for j, (col, _) in enumerate(shown, start=1):
        for layer, g in prox.groupby("layer", sort=False):
            rho = agree[(agree["layer"] == layer) & (agree["proxy"] == col)]["spearman"]
            r = f"{float(rho.iloc[0]):.2f}" if len(rho) and np.isfinite(rho.iloc[0]) else "n/a"
            fig.add_trace(go.Scatter(x=g[col], y=g["delta_nll"], mode="markers", name=f"{layer}",
                                     legendgroup=layer, showlegend=j == 1, text=g["label"],
                                     marker=dict(color=colors[list(prox["layer"].unique()).index(layer) % len(colors)]),
                                     hovertemplate=f"{layer}<br>%{{text}}<br>{col} %{{x:.4g}}<br>ΔNLL %{{y:.4g}}"
                                                   f"<br>Spearman ρ {r}<extra></extra>"), row=1, col=j)
    fig.update_yaxes(title_text="delta_nll", row=1, col=1)
    fig.update_layout(height=380, margin=dict(l=10, r=10, t=40, b=40))
    return fig


def pruning(tables: Mapping[str, pd.DataFrame]) -> go.Figure | None:
    curve = tables.get("pruning_curve")
    if curve is None or not len(curve):
        return None
    fig = go.Figure()
    for ranking, g in curve.groupby("ranking", sort=False):
        if ranking == "random" and (g["draws"] > 1).any():
            fig.add_trace(go.Scatter(x=list(g["n_pruned"]) + list(g["n_pruned"])[::-1],
                                     y=list(g["loss_high"]) + list(g["loss_low"])[::-1], fill="toself",
                                     line=dict(width=0), opacity=0.25, name="random (95% of draws)",
                                     hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=g["n_pruned"], y=g["loss"], mode="lines+markers", name=f"by {ranking}"))
    fig.update_layout(xaxis_title="experts pruned per layer", yaxis_title="dataset loss (mean NLL)", height=360,
                      margin=dict(l=10, r=10, t=30, b=40))
    return fig


def figures(tables: Mapping[str, pd.DataFrame], sort: bool = False) -> dict[str, go.Figure]:
    out = {"heatmap": heatmap(tables, sort), "proxies": proxies(tables)}
    fig = pruning(tables)
    if fig is not None:
        out["pruning"] = fig
    return out


def page(tables: Mapping[str, pd.DataFrame], provenance: Mapping[str, Any], notes=()) -> str:
    """The sweep as one offline page: the figures, then every table (escaped), all data as JSON."""
    esc = html.escape
    extra, first = [], True
    for name, fig in figures(tables).items():
        heading, text = SECTIONS[name]
        extra.append((name, heading, f"<p>{esc(text)}</p>" + fig.to_html(full_html=False, include_plotlyjs=first,
                                                                         div_id=f"fig-{name}")))
        first = False
    for name, df in tables.items():
        extra.append((f"table-{name}", name.replace("_", " ").capitalize(), html_table(df)))
    intro = (f"<p>{esc(str(provenance.get('model')))} on {esc(str(provenance.get('dataset')))} "
             f"(sha256 {esc(str(provenance.get('dataset_sha256')))}): {provenance.get('rows', 0):,} rows, "
             f"{provenance.get('predicted_positions', 0):,} predicted positions, unablated loss "
             f"{float(provenance.get('base_loss', float('nan'))):.4f}; effects in "
             f"{esc(str(provenance.get('effects_dtype')))}, {esc(str(provenance.get('method')))}.</p>")
    return render_page(title=f"Which experts matter: {provenance.get('model')}", intro=intro, pieces={},
                       tables=dict(tables), notes=list(notes), extra=extra, meta=dict(provenance))
