"""Plotly figures built from the analysis tables (no Streamlit here, so they are testable alone)."""
from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from routescope.analysis import columns as C
from routescope.analysis.routing import option_names

# one colour per option index (option 0 blue, option 1 orange, ...), used for nothing else
PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D"]
NEUTRAL, HIGHLIGHT = "#9DB5CF", "#1F2D3D"  # bars that are not options: plain, and the one picked out
DIVIDER_LEGEND = "Dotted vertical line: the prompt ends there; tokens to its right were generated."


def show_token(tok: str) -> str:
    """Make whitespace and control characters visible on an axis or in a tooltip."""
    out = tok.replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍")
    out = "".join(ch if ch.isprintable() or ch == " " else f"\\x{ord(ch):02x}" for ch in out)
    return out if out.strip() else out.replace(" ", "␣") or "∅"


MAX_TOKEN_LABELS = 32  # per axis; every token stays on hover


def token_ticks(tokens: list[str]) -> tuple[list[int], list[str]]:
    """Positions and texts of the token labels on an axis: all of them up to MAX_TOKEN_LABELS, else
    every k-th. Each label is a text node the browser lays out on every redraw: 88 of them cost
    about 100 ms per heatmap in Chromium here, 30 about 35 ms (measured with plotly.js alone)."""
    step = -(-len(tokens) // MAX_TOKEN_LABELS) if tokens else 1
    vals = list(range(0, len(tokens), step))
    return vals, [show_token(tokens[i]) for i in vals]


def _axis(fig: go.Figure, tokens: list[str], n_prompt: int | None, rows: int = 1) -> None:
    """Token labels on the x axis (the bottom one of stacked rows), and the prompt | generated line
    in every row."""
    vals, ticks = token_ticks(tokens)
    fig.update_xaxes(tickmode="array", tickvals=vals, ticktext=ticks, tickangle=-60, tickfont=dict(size=10))
    if n_prompt is not None and 0 < n_prompt < len(tokens):  # prompt | generated boundary
        line = dict(x=n_prompt - 0.5, line=dict(color="#444", dash="dot", width=1), name="prompt | generated")
        if rows == 1:
            fig.add_vline(**line, annotation=dict(text="generated →", font=dict(size=10, color="#444")),
                          annotation_position="top right")
        else:  # unlabelled: a label would cross the row titles; the app's caption (DIVIDER_LEGEND) says it
            fig.add_vline(**line, row="all", col=1)


def has_divider(fig: go.Figure) -> bool:
    """Whether the figure marks where the prompt ends (DIVIDER_LEGEND explains the line)."""
    return any(getattr(shape, "name", None) == "prompt | generated" for shape in fig.layout.shapes)


def _fixed_margins(fig: go.Figure, rows: list[str]) -> None:
    """Margins sized from the labels instead of plotly's automargin, which lays a heatmap out again
    (about half of its drawing time in Chromium): layer names on the left at about 7 px a character,
    token labels below, turned 60 degrees, at about 5.5 px of height a character."""
    ticks = [t for a in fig.select_xaxes() for t in (a.ticktext or ())]
    fig.update_xaxes(automargin=False)
    fig.update_yaxes(automargin=False)
    fig.update_layout(margin=dict(l=16 + 7 * max(map(len, rows), default=0),
                                  b=14 + round(5.5 * max(map(len, ticks), default=0))))


def _height(n_rows: int) -> int:
    return max(220, 70 + 34 * n_rows)


def _layout(fig: go.Figure, title: str, n_rows: int) -> go.Figure:
    fig.update_layout(title=title, height=_height(n_rows), margin=dict(l=10, r=10, t=40, b=10),
                      plot_bgcolor="white")
    return fig


def _discrete_scale(n: int) -> list[list]:
    cols = [PALETTE[i % len(PALETTE)] for i in range(n)]
    scale = []
    for i, c in enumerate(cols):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


@dataclass(frozen=True)
class ChoiceGrid:
    """A discrete choice (path / block / expert) per layer and token, ready to draw: `z[layer, pos]`
    the option index (NaN: none), `hover` its text, `labels` the colour bar's option names."""
    z: np.ndarray  # (n_layers, T)
    hover: np.ndarray  # (n_layers, T) str
    layers: list[str]
    labels: list[str]
    title: str


def _choice_trace(g: ChoiceGrid, n: int, tokens: list[str], **kw) -> go.Heatmap:
    """Option j is PALETTE[j] for any n >= number of options, so stacked grids share one colour bar."""
    return go.Heatmap(z=g.z, x=list(range(len(tokens))), y=g.layers, customdata=g.hover,
                      hovertemplate="%{customdata}<extra></extra>", colorscale=_discrete_scale(n), zmin=-0.5,
                      zmax=n - 0.5, xgap=1, ygap=1, **kw)


def _colorbar(labels: list[str]) -> dict:
    return dict(tickmode="array", tickvals=list(range(len(labels))), ticktext=labels, title="")


def choice_heatmap(g: ChoiceGrid, tokens: list[str], n_prompt: int | None = None) -> go.Figure:
    """Layer x token heatmap of a discrete choice, hover with details."""
    n = max(1, len(g.labels))
    fig = go.Figure(_choice_trace(g, n, tokens, colorbar=_colorbar(g.labels)))
    _axis(fig, tokens, n_prompt)
    _layout(fig, g.title, len(g.layers))
    _fixed_margins(fig, g.layers)
    return fig


def stacked_choice_heatmaps(grids: list[ChoiceGrid], tokens: list[str], n_prompt: int | None = None) -> go.Figure:
    """Several choice grids of one run as the rows of one figure: a shared token axis, one colour bar
    (the grid with the most options names them). One chart instead of several is also about 100 ms
    less per update in the browser, where Streamlit mounts and lays out every chart on its own."""
    from plotly.subplots import make_subplots

    widest = max(grids, key=lambda g: len(g.labels))
    n = max(1, len(widest.labels))
    fig = make_subplots(rows=len(grids), cols=1, shared_xaxes=True, vertical_spacing=0.25 / len(grids),
                        subplot_titles=[g.title for g in grids], row_heights=[max(1, len(g.layers)) for g in grids])
    for row, g in enumerate(grids, start=1):
        fig.add_trace(_choice_trace(g, n, tokens, showscale=g is widest, colorbar=_colorbar(widest.labels)),
                      row=row, col=1)
    _axis(fig, tokens, n_prompt, rows=len(grids))
    fig.update_layout(height=sum(_height(len(g.layers)) for g in grids), margin=dict(l=10, r=10, t=40, b=10),
                      plot_bgcolor="white")
    _fixed_margins(fig, [l for g in grids for l in g.layers])
    return fig


def value_heatmap(z: np.ndarray, hover: np.ndarray, layers: list[str], tokens: list[str], title: str,
                  n_prompt: int | None = None, zmin: float | None = None, zmax: float | None = None,
                  colorscale: str = "Viridis", colorbar_title: str = "") -> go.Figure:
    fig = go.Figure(go.Heatmap(z=z, x=list(range(len(tokens))), y=layers, customdata=hover,
                               hovertemplate="%{customdata}<extra></extra>", colorscale=colorscale, zmin=zmin,
                               zmax=zmax, xgap=1, ygap=1, colorbar=dict(title=colorbar_title)))
    _axis(fig, tokens, n_prompt)
    _layout(fig, title, len(layers))
    _fixed_margins(fig, [str(l) for l in layers])
    return fig


def _grid(df: pd.DataFrame, value: str, layers: list[str], T: int, fill=np.nan) -> np.ndarray:
    z = np.full((len(layers), T), fill, dtype=float)
    li = {l: i for i, l in enumerate(layers)}
    z[df[C.LAYER].map(li).to_numpy(), df[C.POSITION].to_numpy()] = df[value].to_numpy(dtype=float)
    return z


def _hover(df: pd.DataFrame, layers: list[str], T: int, tokens: list[str], line) -> np.ndarray:
    """Hover text per (layer, position): token, layer, then one line per option row."""
    out = np.full((len(layers), T), "", dtype=object)
    li = {l: i for i, l in enumerate(layers)}
    lines: dict[tuple[int, int], list[str]] = {}
    for r in df.itertuples(index=False):  # one pass over all rows (per-group iteration is ~50x slower)
        lines.setdefault((li[r.layer], int(r.position)), []).append(line(r))
    shown = [html.escape(show_token(t)) for t in tokens]
    for (i, pos), ls in lines.items():
        out[i, pos] = f"<b>{shown[pos]}</b> (pos {pos})<br>{layers[i]}<br>" + "<br>".join(ls)
    return out


def _layers(df: pd.DataFrame) -> list[str]:
    return sorted(df[C.LAYER].unique(), key=lambda l: [int(p) if p.isdigit() else p for p in l.split(".")])


def choice_grid(view: pd.DataFrame, tokens: list[str], labels: dict[str, list[str]]) -> ChoiceGrid:
    """Any routing layer's option weights (analysis.routing.option_weights): the largest per token."""
    return _selected_grid(view, tokens, labels, lambda r: f"weight {r.weight:.3f}",
                          "Option with the largest weight per token (every weight on hover)")


def _selected_grid(view: pd.DataFrame, tokens: list[str], labels: dict[str, list[str]],
                   value: Callable[[Any], str], title: str) -> ChoiceGrid:
    """Layers x tokens, each cell the option selected there; every option's `value` on hover."""
    v = view[view[C.BATCH] == 0]
    layers, T = _layers(v), len(tokens)
    z = _grid(v[v[C.SELECTED]], C.OPTION, layers, T)
    hover = _hover(v, layers, T, tokens, lambda r: f"{'▶ ' if r.selected else ''}{r.label}: {value(r)}")
    return ChoiceGrid(z, hover, layers, option_names(labels, layers), title)


def option_weights_figure(view: pd.DataFrame, layer: str, tokens: list[str], n_prompt: int | None) -> go.Figure:
    """One routing layer's option weights per token: options x tokens."""
    v = view[(view[C.BATCH] == 0) & (view[C.LAYER] == layer)]
    names = list(dict.fromkeys(v[C.LABEL]))
    z = np.full((len(names), len(tokens)), np.nan)
    z[v[C.OPTION].to_numpy(), v[C.POSITION].to_numpy()] = v[C.WEIGHT].to_numpy(dtype=float)
    shown = [html.escape(show_token(t)) for t in tokens]
    hover = np.array([[f"<b>{shown[t]}</b> (pos {t})<br>{layer} · {names[o]}: {z[o, t]:.3f}"
                       for t in range(len(tokens))] for o in range(len(names))], dtype=object)
    return value_heatmap(z, hover, names, tokens, f"{layer}: weight of each option per token", n_prompt,
                         zmin=0.0, zmax=1.0, colorscale="Blues", colorbar_title="weight")


def gumbel_grid(view: pd.DataFrame, tokens: list[str], labels: dict[str, list[str]]) -> ChoiceGrid:
    return _selected_grid(view, tokens, labels, lambda r: f"{r.prob:.1%}",
                          "Gumbel route per token (noise-free probabilities on hover)")


def cosine_grid(view: pd.DataFrame, tokens: list[str], labels: dict[str, list[str]]) -> ChoiceGrid:
    v = view[(view[C.BATCH] == 0) & view[C.COSINE].notna()]
    layers, T = _layers(v), len(tokens)
    z = _grid(v[v[C.DOMINANT]], C.OPTION, layers, T)
    hover = _hover(v, layers, T, tokens,
                   lambda r: f"{'▶ ' if r.dominant else ''}{labels[r.layer][r.option]}: cos {r.cosine:.3f}")
    n_outputs = int(v[C.OPTION].max()) + 1 if len(v) else 1  # paths / blocks only: "combined" has no cosine
    return ChoiceGrid(z, hover, layers, option_names(labels, layers)[:n_outputs],
                      "Cosine dominance: the output most aligned with the combined output")


def topk_grid(view: pd.DataFrame, tokens: list[str], labels: dict[str, list[str]]) -> ChoiceGrid:
    v = view[view[C.BATCH] == 0]
    layers, T = _layers(v), len(tokens)
    z = _grid(v[v[C.RANK] == 0], C.OPTION, layers, T)
    hover = _hover(v, layers, T, tokens,
                   lambda r: f"#{r.rank + 1} {labels[r.layer][r.option]}: weight {r.weight:.3f} (p {r.prob:.3f})")
    return ChoiceGrid(z, hover, layers, option_names(labels, layers),
                      "Top-k routing: first choice per token (all selections on hover)")


def share_figure(view: pd.DataFrame, tokens: list[str], value: str, option: int, title: str, label,
                 n_prompt: int | None) -> go.Figure:
    v = view[view[C.BATCH] == 0]
    layers, T = _layers(v), len(tokens)
    z = _grid(v[v[C.OPTION] == option], value, layers, T)
    hover = _hover(v, layers, T, tokens, label)
    return value_heatmap(z, hover, layers, tokens, title, n_prompt, zmin=0.0, zmax=1.0, colorscale="RdBu",
                         colorbar_title=value)


def gate_figure(view: pd.DataFrame, tokens: list[str], n_prompt: int | None) -> go.Figure:
    v = view[view[C.BATCH] == 0]
    layers, T = _layers(v), len(tokens)
    z = _grid(v, C.GATE_MEAN, layers, T)
    hover = _hover(v, layers, T, tokens, lambda r: f"mean alpha (stream A): {r.gate_mean:.3f}")
    return value_heatmap(z, hover, layers, tokens, "DSFF gate: mean alpha (weight of the narrow SwiGLU stream)",
                         n_prompt, zmin=0.0, zmax=1.0, colorscale="RdBu", colorbar_title="alpha")


def bar_figure(labels: list[str], values: list[float], title: str, y_title: str = "",
               colors: list[str] | None = None) -> go.Figure:
    fig = go.Figure(go.Bar(x=labels, y=values, marker_color=colors or NEUTRAL,
                           hovertemplate="%{x}: %{y:.4f}<extra></extra>"))
    fig.update_layout(title=title, yaxis_title=y_title, height=300, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def grouped_bars(df: pd.DataFrame, x: str, y: str, group: str, title: str, y_title: str = "",
                 hover: str | None = None) -> go.Figure:
    """Bars of y per x, one colour per group; `hover`: a column shown on hover (e.g. the option label)."""
    fig = go.Figure()
    for i, (name, g) in enumerate(df.groupby(group, sort=False)):
        extra = dict(customdata=g[hover], hovertemplate=f"{name}<br>%{{customdata}}: %{{y:.4f}}<extra></extra>") \
            if hover else {}
        fig.add_bar(x=g[x].astype(str), y=g[y], name=str(name), marker_color=PALETTE[i % len(PALETTE)], **extra)
    fig.update_layout(title=title, barmode="group", yaxis_title=y_title, height=320,
                      margin=dict(l=10, r=10, t=40, b=10))
    return fig


def candidates_figure(tokens: list[str], probs: list[float], chosen: str, position: int) -> go.Figure:
    labels = [show_token(t) for t in tokens]
    colors = [HIGHLIGHT if t == chosen else NEUTRAL for t in tokens]  # not option colours
    fig = go.Figure(go.Bar(x=probs[::-1], y=labels[::-1], orientation="h", marker_color=colors[::-1],
                           text=[f"{p:.1%}" for p in probs[::-1]], textposition="outside",
                           hovertemplate="%{y}: %{x:.4%}<extra></extra>"))
    fig.update_layout(title=f"Next-token candidates at position {position} (dark: the token generated)",
                      xaxis=dict(range=[0, 1.1],
                      tickformat=".0%"), height=60 + 26 * len(tokens), margin=dict(l=10, r=10, t=40, b=10))
    return fig


def kl_figure(effects: pd.DataFrame, tokens: list[str]) -> go.Figure:
    e = effects[effects[C.BATCH] == 0]
    colors = [PALETTE[3] if f else PALETTE[0] for f in e[C.FLIPPED]]
    hover = [f"{html.escape(show_token(tokens[p]))} (pos {p})<br>KL {k:.4f} nats<br>p(base top-1): {a:.3f} → {b:.3f}"
             f"{'<br><b>top-1 flipped</b>' if f else ''}"
             for p, k, a, b, f in zip(e[C.POSITION], e[C.KL], e[C.BASE_PROB], e[C.ABLATED_PROB], e[C.FLIPPED])]
    fig = go.Figure(go.Bar(x=e[C.POSITION], y=e[C.KL], marker_color=colors, customdata=hover,
                           hovertemplate="%{customdata}<extra></extra>"))
    _axis(fig, tokens[:len(e)], None)
    fig.update_layout(title="KL(base ‖ ablated) of the next-token distribution per position (red: top-1 flipped)",
                      yaxis_title="nats", height=320, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def attribution_figure(tokens: list[str], values: list[float], title: str) -> go.Figure:
    colors = [PALETTE[2] if v >= 0 else PALETTE[3] for v in values]
    fig = go.Figure(go.Bar(x=list(range(len(tokens))), y=values, marker_color=colors,
                           customdata=[html.escape(show_token(t)) for t in tokens],
                           hovertemplate="%{customdata}: %{y:.4f}<extra></extra>"))
    _axis(fig, tokens, None)
    fig.update_layout(title=title, height=320, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def atm_figure(merges: pd.DataFrame, tokens: list[str], tau: float) -> go.Figure:
    """Per active ATM layer: the adjacent-cosine strip, with merged pairs bracketed above it."""
    m = merges[merges[C.BATCH] == 0]
    layers = _layers(m)
    T = len(tokens)
    z = _grid(m, C.ADJACENT_COS, layers, T)
    hover = _hover(m, layers, T, tokens,
                   lambda r: f"cos(t, t+1) {r.adjacent_cos:.3f}" + (f"<br>merged with {r.partner}" if r.merged else ""))
    fig = value_heatmap(z, hover, layers, tokens, f"ATM adjacent cosines; merged pairs bracketed (tau = {tau:.2f})",
                        None, zmin=-1.0, zmax=1.0, colorscale="RdBu_r", colorbar_title="cos")
    for li, layer in enumerate(layers):
        rows = m[(m[C.LAYER] == layer) & m[C.MERGED]]
        for a in sorted(int(p) for p, q in zip(rows[C.POSITION], rows[C.PARTNER]) if int(q) > int(p)):
            y0, y1 = li + 0.2, li + 0.42
            fig.add_shape(type="path", path=f"M {a - 0.3},{y0} L {a - 0.3},{y1} L {a + 1.3},{y1} L {a + 1.3},{y0}",
                          line=dict(color="black", width=2))
    fig.update_layout(height=max(240, 90 + 60 * len(layers)))
    return fig
