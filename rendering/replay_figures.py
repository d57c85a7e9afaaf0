"""Figures of a routing-trace replay (`analysis.replay.run.replay`) and its offline page: plotly and
escaped HTML only, no Streamlit, so `routescope replay`'s page and the app's Replay view draw the same.

- agreement: per routing layer the share of tokens whose top-k set equals the reference's and the
  mean overlap |S_engine & S_ref| / k;
- first divergence: how many tokens first differ at each layer;
- row map: one row's layer x position overlap / k (1: the same set; a mismatch is darker);
- row text: the row's tokens, those differing at any layer marked (their title names the layers).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from routescope.analysis.corpus.page import html_table, render_page
from routescope.analysis.export.html_safe import attr, text
from routescope.analysis.replay.compare import RowResult

SECTIONS = {
    "agreement": ("Agreement per layer", "The share of tokens whose top-k set at the layer equals the reference's, "
                  "and the mean overlap |S_engine ∩ S_ref| / k. The row 'all' of the table: the share of tokens equal "
                  "at every layer (one minus the share that differs in at least one layer)."),
    "first_divergence": ("First divergent layer", "Each token's first layer whose top-k set differs from the "
                         "reference's ('none': equal at every layer)."),
    "mismatches": ("Mismatches", "Every (row, position, layer) whose sets differ: the engine's and the reference's "
                   "experts, the reference router's margin between its k-th and (k+1)-th logit, whether the mismatch is "
                   "a near-tie (its swap gap, the reference's lowest logit among the experts the engine left out "
                   "minus its highest among those it took, within the trace dtype's resolution; a larger gap is "
                   "flagged), and whether the engine's set equals the float32 reference's."),
    "checks": ("Broken-trace checks", "Rows failing each check, by name. Rows of all zeros and rows with another "
               "layer count or k are left out of the comparison."),
    "rows": ("Rows", "Per row: positions compared, tokens differing in at least one layer, mismatches."),
}
MARK = "#d62728"


def agreement_figure(agreement: pd.DataFrame) -> go.Figure:
    per = agreement[agreement["layer"] != "all"]
    fig = go.Figure([go.Bar(name="agreement (set equal)", x=list(per["layer"]), y=list(per["agreement"])),
                     go.Bar(name="mean overlap / k", x=list(per["layer"]), y=list(per["mean_overlap"]))])
    fig.update_layout(barmode="group", yaxis=dict(range=[0, 1.02], title="share of tokens"), height=340,
                      margin=dict(l=40, r=10, t=30, b=40), legend=dict(orientation="h"))
    return fig


def divergence_figure(first: pd.DataFrame) -> go.Figure:
    fig = go.Figure(go.Bar(x=list(first["layer"]), y=list(first["tokens"]), marker_color=MARK))
    fig.update_layout(yaxis_title="tokens", xaxis_title="first divergent layer", height=300,
                      margin=dict(l=40, r=10, t=20, b=40))
    return fig


def row_map(detail: RowResult, layers: Sequence[str], k: int, tokens: Sequence[str] | None = None) -> go.Figure:
    """Layer (y) x position (x) of the row's overlap / k; hover: the token and the layer."""
    z = (detail.overlap.T / k).astype(float)  # [L, n]
    n, s = z.shape[1], detail.start
    labels = list(tokens[s:s + n]) if tokens is not None else [str(t) for t in detail.token_ids[s:s + n]]
    hover = [[f"position {s + p}: {labels[p]!r}<br>{layers[l]}<br>overlap {int(detail.overlap[p, l])}/{k}"
              for p in range(n)] for l in range(len(layers))]
    scale = [[0.0, "#67001f"], [0.999, "#f4a582"], [1.0, "#e8eef7"]]  # equal sets pale, any mismatch red
    fig = go.Figure(go.Heatmap(z=z, x=list(range(s, s + n)), y=list(layers), zmin=0, zmax=1, colorscale=scale,
                               customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                               colorbar=dict(title="overlap/k")))
    fig.update_layout(xaxis_title="position", height=120 + 22 * len(layers), margin=dict(l=40, r=10, t=20, b=40),
                      yaxis=dict(autorange="reversed"))
    return fig


def row_text_html(detail: RowResult, layers: Sequence[str], tokens: Sequence[str] | None = None) -> str:
    """The row's tokens as escaped HTML, each differing token marked, its title naming its layers
    (tokens before the routing's start, context only, in grey)."""
    n, s = len(detail.first), detail.start
    labels = list(tokens) if tokens is not None else [f"<{t}>" for t in detail.token_ids]
    parts = [f'<span style="color:#888" title="position {p}: context, not compared">{text(labels[p])}</span>'
             for p in range(min(s, len(labels)))]
    for p in range(s, s + n):
        bad = np.nonzero(~detail.equal[p - s])[0]
        if len(bad):
            title = f"position {p}: differs at " + ", ".join(layers[i] for i in bad)
            parts.append(f'<mark class="rs-mismatch" style="background:#f8c4c4" title="{attr(title)}">'
                         f"{text(labels[p])}</mark>")
        else:
            parts.append(f'<span title="position {p}">{text(labels[p])}</span>')
    return '<div class="rs-replay-text" style="white-space:pre-wrap;font-family:monospace">' + "".join(parts) + \
        "</div>"


def figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    return {"agreement": agreement_figure(tables["agreement"]),
            "first_divergence": divergence_figure(tables["first_divergence"])}


def summary_line(summary: Mapping[str, Any]) -> str:
    """The corpus figures in one sentence (the CLI prints it; the page and the view show it)."""
    T = summary["tokens"]
    share = summary["differing_share"]
    s = (f"{T:,} tokens in {summary['rows_compared']:,} rows; "
         f"{'n/a' if share is None or (isinstance(share, float) and math.isnan(share)) else f'{share:.2%}'} differ "
         f"in at least one layer; {summary['mismatches']:,} mismatches, {summary['near_ties']:,} near-ties, "
         f"{summary['large_margin']:,} with a large margin")
    if summary.get("gone_in_float32") is not None:
        s += f"; {summary['gone_in_float32']:,} go away in float32"
    return s


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    return obj


def page(result: Any, decode: Callable[[int], str] | None = None, rows: int = 8) -> str:
    """The replay as one offline page: the summary, the figures, the first `rows` rows' maps and
    marked text, then every table (escaped; the first rows of each, the files have all)."""
    tables, prov = result.tables, result.provenance
    layers = list(tables["agreement"]["layer"][:-1])
    extra, first = [], True
    for name, fig in figures(tables).items():
        heading, about = SECTIONS[name]
        extra.append((name, heading, f"<p>{text(about)}</p>" + fig.to_html(full_html=False, include_plotlyjs=first,
                                                                        div_id=f"fig-{name}")))
        first = False
    for i, d in enumerate(result.details[:rows]):
        toks = [decode(int(t)) for t in d.token_ids] if decode is not None else None
        body = row_text_html(d, layers, toks) + row_map(d, layers, prov["top_k"], toks).to_html(
            full_html=False, include_plotlyjs=False, div_id=f"fig-row-{i}")
        extra.append((f"row-{i}", f"Row {d.row}", body))
    for name in ("agreement", "checks", "mismatches", "first_divergence", "rows"):
        heading, about = SECTIONS.get(name, (name, ""))
        extra.append((f"table-{name}", heading, f"<p>{text(about)}</p>" + html_table(tables[name])))
    intro = (f"<p>{text(prov.get('model'))} ({text(prov.get('family'))}) against the trace "
             f"{text(prov.get('trace'))}: {text(summary_line(result.summary))}. Reference in {text(prov.get('dtype'))}"
             f"{', and float32' if prov.get('reference_float32') else ''}; near-ties: a margin of at most "
             f"{text(prov.get('tie_ulps'))} ulps of {text(prov.get('trace_dtype'))}.</p>")
    return render_page(title=f"Routing replay: {prov.get('model')}", intro=intro, pieces={}, tables=dict(tables),
                       notes=list(result.notes), extra=extra, meta=_finite(dict(prov)))
