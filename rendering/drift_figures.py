"""Figures of a drift run (`analysis.drift`) and its offline page: plotly only, no Streamlit, so the
CLI's drift.html and the app's Drift view draw the same figures.

- saturation: per layer, the top-k overlap with the last checkpoint (OLMoE's router saturation) and
  with the previous checkpoint, checkpoints on x in the run's order;
- utilisation: one layer's expert x checkpoint heatmap of the top-k slot share (✕ dead, ▲ overloaded);
- specialisation: per layer, the label specialisation index over checkpoints (labelled data only).
"""
from __future__ import annotations

import html
from typing import Any, Mapping

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from routescope.analysis.corpus.page import html_table, render_page
from routescope.analysis.export.plotly_bundle import script_tag

SECTIONS = {
    "saturation": ("Router saturation", "Per routing layer, the mean over tokens of |top-k ∩ top-k of the last "
                   "checkpoint| / k (OLMoE's router saturation, allenai/OLMoE scripts/run_moe_analysis.py), and the "
                   "same against the checkpoint before (how much routing still moves between two snapshots)."),
    "utilisation": ("Expert utilisation over the run", "Per layer, each expert's share of top-k slots at each "
                    "checkpoint. ✕ dead (under 1% of the uniform share 1/n), ▲ overloaded (over twice it), as the "
                    "corpus statistics define them."),
    "specialisation": ("Label specialisation", "Per layer, the token-weighted mean over label values of the total "
                       "variation distance between the value's first-choice distribution and all tokens' (0: routing "
                       "ignores the label, 1: disjoint experts per value)."),
}


def _ticks(df: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The checkpoints in the run's order and their tick labels (name, and step where known)."""
    firsts = df.drop_duplicates("checkpoint")
    names = list(firsts["checkpoint"])
    labels = [f"{n}<br>step {int(s)}" if pd.notna(s) else n for n, s in zip(firsts["checkpoint"], firsts["step"])]
    return names, labels


def saturation(tables: Mapping[str, pd.DataFrame]) -> go.Figure:
    sat = tables["saturation"]
    names, labels = _ticks(sat)
    colors = px.colors.sample_colorscale("Viridis", max(2, sat["layer"].nunique()))
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True,
                        subplot_titles=["overlap with the last checkpoint", "overlap with the previous checkpoint"])
    for j, col in enumerate(("overlap_final", "overlap_previous"), start=1):
        for c, (layer, g) in enumerate(sat.groupby("layer", sort=False)):
            fig.add_trace(go.Scatter(x=g["checkpoint"], y=g[col], mode="lines+markers", name=str(layer),
                                     legendgroup=str(layer), showlegend=j == 1, line=dict(color=colors[c]),
                                     hovertemplate=f"{html.escape(str(layer))}<br>%{{x}}<br>{col} %{{y:.3f}}"
                                                   "<extra></extra>"), row=1, col=j)
        fig.update_xaxes(categoryorder="array", categoryarray=names, tickvals=names, ticktext=labels, row=1, col=j)
    fig.update_yaxes(title_text="top-k overlap", range=[0, 1.02], row=1, col=1)
    fig.update_layout(height=380, margin=dict(l=10, r=10, t=40, b=40), legend_title_text="layer")
    return fig


def utilisation(tables: Mapping[str, pd.DataFrame], layer: str) -> go.Figure:
    u = tables["utilisation"]
    u = u[u["layer"] == layer]
    names, labels = _ticks(u)
    z = u.pivot(index="option", columns="checkpoint", values="share")[names]
    mark = u.assign(m=u["dead"].map({True: "✕", False: ""}) + u["overloaded"].map({True: "▲", False: ""})) \
        .pivot(index="option", columns="checkpoint", values="m")[names]
    n = len(z)
    fig = go.Figure(go.Heatmap(z=z.to_numpy(), x=labels, y=[str(o) for o in z.index], colorscale="Viridis",
                               text=mark.to_numpy(), texttemplate="%{text}" if n <= 64 else None,
                               colorbar=dict(title="slot share"),
                               hovertemplate="expert %{y}<br>%{x}<br>share %{z:.4f} %{text}<extra></extra>"))
    fig.update_layout(title=str(layer), xaxis_title="checkpoint", yaxis_title="expert",
                      yaxis=dict(autorange="reversed", type="category"),
                      height=min(1400, max(300, 14 * n + 120)), margin=dict(l=10, r=10, t=40, b=40))
    return fig


def specialisation(tables: Mapping[str, pd.DataFrame]) -> go.Figure | None:
    spec = tables.get("label_specialisation")
    if spec is None or not len(spec):
        return None
    names, labels = _ticks(spec)
    fig = go.Figure()
    for (layer, column), g in spec.groupby(["layer", "label_column"], sort=False):
        fig.add_trace(go.Scatter(x=g["checkpoint"], y=g["specialisation"], mode="lines+markers",
                                 name=f"{layer} · {column}"))
    fig.update_xaxes(categoryorder="array", categoryarray=names, tickvals=names, ticktext=labels)
    fig.update_layout(yaxis_title="specialisation (TV distance)", height=340, margin=dict(l=10, r=10, t=30, b=40))
    return fig


def changed_most(tables: Mapping[str, pd.DataFrame], top: int = 20) -> pd.DataFrame:
    """The `top` experts whose utilisation moved most over the run (total variation), with their events."""
    return tables["experts"].head(top)


def figures(tables: Mapping[str, pd.DataFrame], layers: list[str] | None = None) -> dict[str, Any]:
    """saturation, utilisation (one per layer in `layers`; default every layer) and specialisation."""
    layers = list(dict.fromkeys(tables["utilisation"]["layer"])) if layers is None else layers
    out: dict[str, Any] = {"saturation": saturation(tables)}
    for layer in layers:
        out[f"utilisation {layer}"] = utilisation(tables, layer)
    if (fig := specialisation(tables)) is not None:
        out["specialisation"] = fig
    return out


def page(tables: Mapping[str, pd.DataFrame], provenance: Mapping[str, Any]) -> str:
    """The drift run as one offline page: the figures, the experts that changed most, every table
    (escaped, the first rows; the files have all), all data as JSON."""
    esc = html.escape
    extra, first = [], True
    for name, fig in figures(tables).items():
        key = name.split(" ")[0]
        heading, about = SECTIONS[key]
        if key == "utilisation":
            heading, about = f"{heading}: {name.split(' ', 1)[1]}", about if first or "layers.0" in name else ""
        extra.append((name.replace(" ", "-"), heading, (script_tag() if first else "")  # the bundle once
                      + (f"<p>{esc(about)}</p>" if about else "")
                      + fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{len(extra) + 1}")))
        first = False
    extra.append(("changed-most", "Experts that changed most", "<p>Ranked by the total variation of their slot share "
                  "over the run (sum of |change| between consecutive checkpoints).</p>" + html_table(changed_most(tables))))
    for name, df in tables.items():
        extra.append((f"table-{name}", name.replace("_", " ").capitalize(), html_table(df)))
    steps = ", ".join(f"{n} ({s})" if s is not None else n for n, s in zip(provenance["names"], provenance["steps"]))
    intro = (f"<p>{len(provenance['names'])} checkpoints in the run's order: {esc(steps)}. Dataset "
             f"{esc(str(provenance['dataset']))} (sha256 {esc(str(provenance['dataset_sha256']))}): "
             f"{provenance['rows']:,} rows, {provenance['tokens']:,} tokens, top-{provenance['top_k']}.</p>")
    return render_page(title="Routing drift over a run", intro=intro, pieces={}, tables=dict(tables), extra=extra,
                       meta=dict(provenance))
