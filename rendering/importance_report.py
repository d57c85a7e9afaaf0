"""An expert-importance sweep (`analysis.reports.importance`) as figures with their captions and as one
offline page: plotly only, no Streamlit, so the CLI's page and the app's Experts view show the same
figures, captions and notes. The figures are `importance_figures`' (heatmap, per-layer effects with
intervals, estimate against exact, pruning and merging) and the proxies' scatter here.
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
from routescope.rendering import importance_figures as F

PROXIES = (("usage", "usage"), ("gate_usage", "gate-weighted usage"), ("reap", "REAP"))
SECTIONS = {
    "heatmap": ("Causal importance", "Mean next-token NLL with each expert dropped alone minus without, over every "
                "predicted position of the dataset (teacher-forced). Blue: the loss rises when the expert is dropped; "
                "red: it falls; white: no change. ★: its 95% bootstrap interval lies outside the interval of its "
                "layer's random-expert control."),
    "effects": ("Each expert with its interval", "One layer at a time (pick it in the menu at the top right): each "
                "expert's effect with its 95% bootstrap interval over rows (whiskers), over the band of the layer's "
                "random-expert control. The axis names each expert, sorted or not."),
    "estimate": ("First-order estimate against the exact effect", "Over the experts measured both ways: the estimate "
                 "from one forward and one backward pass (x) against the exact drop (y); on the dotted line they agree. "
                 "The legend gives each layer's Spearman rho (estimate agreement table)."),
    "proxies": ("Cheap proxies against the causal effect", "Each proxy against delta_nll per expert (REAP: mean "
                "over the tokens routed to the expert of router weight x the norm of its output). Hover a point for its "
                "layer's Spearman rho, listed in the proxy agreement table: where it is low, the proxy does not rank "
                "experts as dropping them does."),
    "pruning": ("Pruning and merging what-if", "Loss with the N least important experts of every layer removed at "
                "once, judged on held-out rows that did not rank them: dropped (ranked by causal effect, by usage and at "
                "random; band: 95% of the random draws) or merged into their most similar kept expert."),
}


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


def figures(tables: Mapping[str, pd.DataFrame], sort: bool = False,
            in_sample: bool = False) -> dict[str, go.Figure]:
    """The sweep's figures by section name (SECTIONS), those its tables can draw."""
    out = {"heatmap": F.heatmap(tables), "effects": F.effects(tables, sort), "estimate": F.estimate_scatter(tables),
           "proxies": proxies(tables), "pruning": F.pruning(tables, in_sample)}
    return {k: v for k, v in out.items() if v is not None}


PRUNING_NOTES = ("no held-out pruning curve", "no pruning curve", "no merge curve")  # the sweep's notes on them


def captions(tables: Mapping[str, pd.DataFrame], in_sample: bool = False, notes=()) -> dict[str, list[str]]:
    """Lines shown under a section (the view and the page alike): which cells are estimates, the layers
    where the estimate ranks badly, what the pruning curve was judged on; the sweep's `notes` on
    those go with them (`unplaced`: the others)."""
    imp = F.flagged(tables)
    out: dict[str, list[str]] = {"heatmap": [], "estimate": [], "pruning": [F.pruning_caption(tables, in_sample)]}
    est = int((~imp["exact"] & imp["effect"].notna()).sum())
    if est:
        out["heatmap"].append(f"{est:,} of {len(imp):,} experts were not measured exactly: their cells show the "
                              "first-order estimate (diamonds in the chart below, no interval).")
    if F.ESTIMATE not in imp:
        out["estimate"].append("This sweep made no first-order estimate (no delta_nll_estimate column).")
    elif F.agreement(tables) is None:
        out["estimate"].append("No estimate_agreement table: no expert was measured both ways.")
    else:
        out["estimate"] += F.low_agreement(tables, notes) or [
            f"The estimate ranks every layer at Spearman ρ {F.LOW_SPEARMAN} or more."]
    out["pruning"] += [n for n in notes if n.startswith(PRUNING_NOTES)]
    return out


def unplaced(lines: Mapping[str, list[str]], notes) -> list[str]:
    """The sweep's notes that no section shows (`captions`)."""
    shown = {n for v in lines.values() for n in v}
    return [n for n in notes if n not in shown]


def page(tables: Mapping[str, pd.DataFrame], provenance: Mapping[str, Any], notes=()) -> str:
    """The sweep as one offline page: the figures, then every table (escaped), all data as JSON."""
    esc = html.escape
    extra, first = [], True
    curve = tables.get("pruning_curve")
    in_sample = curve is not None and "evaluated_on" in curve and (curve["evaluated_on"] == F.IN_SAMPLE).any()
    lines = captions(tables, in_sample, notes)  # the in-sample curve is in the tables only when it was asked for
    figs = figures(tables, in_sample=in_sample)
    for name, (heading, text) in SECTIONS.items():
        fig = figs.get(name)
        if fig is None and not lines.get(name):
            continue
        below = "".join(f"<p class='note'>{esc(n)}</p>" for n in lines.get(name, ()))
        drawn = "" if fig is None else f"<p>{esc(text)}</p>" + fig.to_html(full_html=False, include_plotlyjs=first,
                                                                           div_id=f"fig-{name}")
        first = first and fig is None
        extra.append((name, heading, drawn + below))
    for name, df in tables.items():
        extra.append((f"table-{name}", name.replace("_", " ").capitalize(), html_table(df)))
    intro = (f"<p>{esc(str(provenance.get('model')))} on {esc(str(provenance.get('dataset')))} "
             f"(sha256 {esc(str(provenance.get('dataset_sha256')))}): {provenance.get('rows', 0):,} rows, "
             f"{provenance.get('predicted_positions', 0):,} predicted positions, unablated loss "
             f"{float(provenance.get('base_loss', float('nan'))):.4f}; effects in "
             f"{esc(str(provenance.get('effects_dtype')))}, {esc(str(provenance.get('method')))}.</p>")
    return render_page(title=f"Which experts matter: {provenance.get('model')}", intro=intro, pieces={},
                       tables=dict(tables), notes=unplaced(lines, notes), extra=extra, meta=dict(provenance))
