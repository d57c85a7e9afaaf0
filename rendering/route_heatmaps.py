"""Route heatmaps (no Streamlit here): a routing layer's choices, weights, shares, gates and cosines
per layer and token, drawn from the analysis tables, and layer x option heatmaps for many options
(an expert matrix, utilisation) with a layer dropdown. Colours and the token axis: `style`."""
from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from routescope.analysis.export import columns as C
from routescope.analysis.runs.routing import option_names

from routescope.rendering.style import (DIVIDER, DIVIDER_TEXT, HIGH_IS_BLUE, HIGHLIGHT, MARGIN_R, MARGIN_T, PALETTE,
                                        TICK_FONT, fixed_margins, heatmap_height, layer_menu, rows_top_down, show_token,
                                        title_layout, token_axis, token_ticks, token_window, total_height)

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
    token_axis(fig, tokens, n_prompt)
    title_layout(fig, g.title, len(g.layers))
    rows_top_down(fig)
    fixed_margins(fig, g.layers)
    total_height(fig, heatmap_height(len(g.layers)))
    return fig


STACK_GAP = 48  # px between stacked rows: the next row's title


def stacked_choice_heatmaps(grids: list[ChoiceGrid], tokens: list[str], n_prompt: int | None = None) -> go.Figure:
    """Several choice grids of one run as the rows of one figure: a shared token axis, one colour bar
    (the grid with the most options names them). One chart instead of several is also about 100 ms
    less per update in the browser, where Streamlit mounts and lays out every chart on its own.
    Built as one plain dict, what `style`'s helpers (token_axis, rows_top_down, fixed_margins,
    total_height) would set on it (tests/app/test_stacked_figure.py checks the two agree), and wrapped
    without plotly's validation: 19.3 -> 1.6 ms on papaformer-gumbel-v2's 64-token toggle."""
    widest = max(grids, key=lambda g: len(g.labels))
    n = max(1, len(widest.labels))
    heights = [heatmap_height(len(g.layers)) for g in grids]
    plot_px = sum(heights) + STACK_GAP * (len(grids) - 1)
    colorbar = {**_colorbar(widest.labels), "title": {"text": ""}, **COLORBAR}
    x = list(range(len(tokens)))
    traces = [{"type": "heatmap", "z": g.z, "x": x, "y": g.layers, "customdata": g.hover,
               "hovertemplate": "%{customdata}<extra></extra>", "colorscale": _discrete_scale(n), "zmin": -0.5,
               "zmax": n - 0.5, "xgap": 1, "ygap": 1, "showscale": g is widest, "colorbar": colorbar,
               "xaxis": f"x{_axis(row)}", "yaxis": f"y{_axis(row)}"} for row, g in enumerate(grids)]
    layout = stacked_rows(heights, STACK_GAP / plot_px, [g.title for g in grids])
    for key, value in token_layout(tokens, n_prompt, len(grids)).items():
        if key.startswith(("xaxis", "yaxis")):
            layout[key].update(value)
        else:  # the divider's label after the rows' titles
            layout[key] = layout.get(key, []) + value if isinstance(value, list) else value
    layout["plot_bgcolor"] = "white"
    rows = [l for g in grids for l in g.layers]
    margin = dict(l=16 + 7 * max(map(len, rows), default=0), r=MARGIN_R, t=MARGIN_T,
                  b=16 + 7 * max(map(len, token_ticks(tokens)[1]), default=0), autoexpand=False)
    layout.update(margin=margin, height=plot_px + margin["t"] + margin["b"])
    return go.Figure({"data": traces, "layout": layout}, _validate=False)


COLORBAR = dict(thickness=14, x=1.0, xanchor="left", xpad=8)  # `style.fixed_margins`' colour bar


def token_layout(tokens: list[str], n_prompt: int | None, rows: int) -> dict:
    """The layout `style.token_axis`, `rows_top_down` and `fixed_margins` give `rows` stacked rows
    (axes x, x2, ..., y, y2, ...), as a dict to merge into `stacked_rows`' (its axes updated in place)."""
    vals, ticks = token_ticks(tokens)
    out: dict = {"dragmode": "pan"}
    for row in range(rows):
        a = _axis(row)
        out[f"xaxis{a}"] = dict(tickmode="array", tickvals=vals, ticktext=ticks, tickangle=-90, tickfont=TICK_FONT,
                                range=token_window(len(tokens)), showgrid=False, ticks="", automargin=False)
        out[f"yaxis{a}"] = dict(fixedrange=True, tickfont=dict(size=12, color=HIGHLIGHT), autorange="reversed",
                                automargin=False)
    if n_prompt is not None and 0 < n_prompt < len(tokens):  # prompt | generated boundary
        line = dict(color="#444", dash="dot", width=1)
        out["shapes"] = [dict(type="line", x0=n_prompt - 0.5, x1=n_prompt - 0.5, xref=f"x{_axis(r)}", y0=0, y1=1,
                              yref=f"y{_axis(r)} domain", line=line, name=DIVIDER) for r in range(rows)]
        out["annotations"] = [dict(x=n_prompt - 0.5, xref="x", y=1, yref="paper", yanchor="bottom",
                                   yshift=24 if rows > 1 else 2, text=DIVIDER_TEXT, showarrow=False,
                                   font=dict(size=11, color="#444"), name=DIVIDER)]
    return out


def _axis(row: int) -> str:
    """Plotly's axis suffix of a 0-based row: "", "2", "3", ..."""
    return "" if row == 0 else str(row + 1)


def stacked_rows(heights: list[int], gap: float, titles: list[str]) -> dict:
    """The layout of rows stacked top to bottom, sharing the bottom row's x axis, each titled at its
    top left: what `make_subplots(rows, 1, shared_xaxes=True, row_heights=heights,
    vertical_spacing=gap, subplot_titles=titles)` lays out, as a plain dict (make_subplots' property
    updates took most of a toggle's drawing time on the seed checkpoints)."""
    rows, total = len(heights), float(sum(heights))
    room = 1.0 - gap * (rows - 1)
    layout: dict = {"annotations": []}
    top = 1.0
    for row, h in enumerate(heights):
        bottom = max(0.0, top - room * h / total)
        a = _axis(row)
        layout[f"xaxis{a}"] = {"anchor": f"y{a}", "domain": [0.0, 1.0]}
        if row < rows - 1:
            layout[f"xaxis{a}"].update(matches=f"x{_axis(rows - 1)}", showticklabels=False)
        layout[f"yaxis{a}"] = {"anchor": f"x{a}", "domain": [bottom, top]}
        layout["annotations"].append({"text": titles[row], "showarrow": False, "xref": "paper", "yref": "paper",
                                      "x": 0, "xanchor": "left", "y": top, "yanchor": "bottom",
                                      "font": {"size": 15, "color": HIGHLIGHT}})  # like a title
        top = bottom - gap
    return layout


def value_heatmap(z: np.ndarray, hover: np.ndarray, layers: list[str], tokens: list[str], title: str,
                  n_prompt: int | None = None, zmin: float | None = None, zmax: float | None = None,
                  colorscale: str = "Viridis", colorbar_title: str = "") -> go.Figure:
    fig = go.Figure(go.Heatmap(z=z, x=list(range(len(tokens))), y=layers, customdata=hover,
                               hovertemplate="%{customdata}<extra></extra>", colorscale=colorscale, zmin=zmin,
                               zmax=zmax, xgap=1, ygap=1, colorbar=dict(title=colorbar_title)))
    token_axis(fig, tokens, n_prompt)
    title_layout(fig, title, len(layers))
    rows_top_down(fig)
    fixed_margins(fig, [str(l) for l in layers])
    total_height(fig, heatmap_height(len(layers)))
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


def _layers(df: pd.DataFrame, depth: Iterable[str] = ()) -> list[str]:
    """The frame's layers in model depth order: as `depth` lists them (the model's routing layers,
    `model.option_labels()`, are in forward order), then any others by name with numbers compared
    as numbers ("blocks.10" after "blocks.9"), which is depth order for block-indexed names."""
    rank = {l: i for i, l in enumerate(depth)}
    return sorted(df[C.LAYER].unique(), key=lambda l: (rank.get(l, len(rank)),
                                                        [(0, int(p), "") if p.isdigit() else (1, 0, p)
                                                         for p in str(l).split(".")]))


def choice_grid(view: pd.DataFrame, tokens: list[str], labels: dict[str, list[str]]) -> ChoiceGrid:
    """Any routing layer's option weights (analysis.runs.routing.option_weights): the largest per token."""
    return _selected_grid(view, tokens, labels, lambda r: f"weight {r.weight:.3f}",
                          "Option with the largest weight per token (every weight on hover)")


def _selected_grid(view: pd.DataFrame, tokens: list[str], labels: dict[str, list[str]],
                   value: Callable[[Any], str], title: str) -> ChoiceGrid:
    """Layers x tokens, each cell the option selected there; every option's `value` on hover."""
    v = view[view[C.BATCH] == 0]
    layers, T = _layers(v, labels), len(tokens)
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
    layers, T = _layers(v, labels), len(tokens)
    z = _grid(v[v[C.DOMINANT]], C.OPTION, layers, T)
    hover = _hover(v, layers, T, tokens,
                   lambda r: f"{'▶ ' if r.dominant else ''}{labels[r.layer][r.option]}: cos {r.cosine:.3f}")
    n_outputs = int(v[C.OPTION].max()) + 1 if len(v) else 1  # paths / blocks only: "combined" has no cosine
    return ChoiceGrid(z, hover, layers, option_names(labels, layers)[:n_outputs],
                      "Cosine dominance: the output most aligned with the combined output")


def topk_grid(view: pd.DataFrame, tokens: list[str], labels: dict[str, list[str]]) -> ChoiceGrid:
    v = view[view[C.BATCH] == 0]
    layers, T = _layers(v, labels), len(tokens)
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
    return value_heatmap(z, hover, layers, tokens, title, n_prompt, zmin=0.0, zmax=1.0, colorscale=HIGH_IS_BLUE,
                         colorbar_title=value)


def gate_figure(view: pd.DataFrame, tokens: list[str], n_prompt: int | None) -> go.Figure:
    v = view[view[C.BATCH] == 0]
    layers, T = _layers(v), len(tokens)
    z = _grid(v, C.GATE_MEAN, layers, T)
    hover = _hover(v, layers, T, tokens, lambda r: f"mean alpha (stream A): {r.gate_mean:.3f}")
    return value_heatmap(z, hover, layers, tokens, "DSFF gate: mean alpha (weight of the narrow SwiGLU stream)",
                         n_prompt, zmin=0.0, zmax=1.0, colorscale=HIGH_IS_BLUE, colorbar_title="alpha")


def atm_figure(merges: pd.DataFrame, tokens: list[str], tau: float, n_prompt: int | None = None) -> go.Figure:
    """Per active ATM layer: the adjacent-cosine strip, with merged pairs bracketed above it."""
    m = merges[merges[C.BATCH] == 0]
    layers = _layers(m)
    T = len(tokens)
    z = _grid(m, C.ADJACENT_COS, layers, T)
    hover = _hover(m, layers, T, tokens,
                   lambda r: f"cos(t, t+1) {r.adjacent_cos:.3f}" + (f"<br>merged with {r.partner}" if r.merged else ""))
    fig = value_heatmap(z, hover, layers, tokens, f"ATM adjacent cosines; merged pairs bracketed (tau = {tau:.2f})",
                        n_prompt, zmin=-1.0, zmax=1.0, colorscale=HIGH_IS_BLUE, colorbar_title="cos")
    for li, layer in enumerate(layers):  # rows run top down: a bracket above row li is at y < li
        rows = m[(m[C.LAYER] == layer) & m[C.MERGED]]
        for a in sorted(int(p) for p, q in zip(rows[C.POSITION], rows[C.PARTNER]) if int(q) > int(p)):
            y0, y1 = li - 0.2, li - 0.42
            fig.add_shape(type="path", path=f"M {a - 0.3},{y0} L {a - 0.3},{y1} L {a + 1.3},{y1} L {a + 1.3},{y0}",
                          line=dict(color="black", width=2))
    total_height(fig, max(heatmap_height(len(layers)), 60 * len(layers) + 20))
    return fig


# --- many options: place on an axis, not colour (analysis.runs.routing.MANY_OPTIONS) ------------------

def matrix_layers(view: pd.DataFrame, depth: Iterable[str] = ()) -> list[str]:
    """The layers `expert_matrix_figure` can draw, in depth order."""
    return _layers(view[view[C.BATCH] == 0], depth)


def expert_matrix_figure(view: pd.DataFrame, tokens: list[str], n_prompt: int | None,
                         depth: Iterable[str] = (), only: Iterable[str] | None = None) -> go.Figure:
    """Per layer (a dropdown picks it), experts x tokens: colour = the router's probability, the
    token's top-k picks marked with their rank. Hover names the layer, expert, token and value.
    Values are rounded to 4 decimals, which keeps a 128-expert x 24-layer page small. `only`: these
    layers alone (one: no dropdown, the layer named in the title)."""
    v = view[view[C.BATCH] == 0]
    layers, T = _layers(v, depth), len(tokens)
    if only is not None:
        keep = set(only)
        layers = [l for l in layers if l in keep]
        v = v[v[C.LAYER].isin(keep)]
    fig = go.Figure()
    tallest = 1
    for j, layer in enumerate(layers):
        g = v[v[C.LAYER] == layer]
        n = int(g[C.OPTION].max()) + 1
        tallest = max(tallest, n)
        z = np.full((n, T), np.nan)
        z[g[C.OPTION].to_numpy(), g[C.POSITION].to_numpy()] = np.round(g[C.PROB].to_numpy(dtype=float), 4)
        fig.add_heatmap(z=z, x=list(range(T)), y=list(range(n)), colorscale="Blues", zmin=0, zmax=1,
                        visible=j == 0, colorbar=dict(title="router p"), name=layer,
                        hovertemplate=f"{html.escape(layer)}<br>expert %{{y}} · pos %{{x}}<br>p %{{z:.4f}}<extra></extra>")
        s = g[g[C.SELECTED]]
        fig.add_scatter(x=s[C.POSITION], y=s[C.OPTION], mode="markers", visible=j == 0, showlegend=False,
                        marker=dict(symbol="circle-open", size=7, color=HIGHLIGHT, line=dict(width=1.5)),
                        customdata=s[C.RANK] + 1, name=layer,
                        hovertemplate=f"{html.escape(layer)}<br>expert %{{y}} · pos %{{x}}: pick #%{{customdata}}<extra></extra>")
    token_axis(fig, tokens, n_prompt)
    plot_px = max(240, min(720, 5 * tallest))
    title = "Top-k routing: router probability per expert and token (○ picked)"
    if len(layers) == 1:
        title += f"<br><span style='font-size:13px'>{html.escape(layers[0])}</span>"
    fig.update_layout(title=dict(text=title, y=1, yref="container", yanchor="top", pad=dict(t=10)),
                      plot_bgcolor="white", margin=dict(t=100 if len(layers) > 1 else 70))
    fig.update_yaxes(title="expert", autorange="reversed", tickfont=dict(size=11))
    if len(layers) > 1:
        layer_menu(fig, layers, 2)
    fixed_margins(fig, ["expert 000"])
    total_height(fig, plot_px)
    return fig


FLAG_SYMBOLS = {"dead": "x-thin", "overloaded": "triangle-up"}  # ✕ and ▲, as the titles name them
LEGEND_PX, TITLE_LINE_PX = 34, 24  # a row of buttons and the horizontal legend; a title line at plotly's 17 px font


ONE_ORDER = "option, by its share summed over all layers (busiest left, one order for every layer)"
PER_LAYER = "rank in its own layer (busiest left; hover names the option)"


def utilisation_heatmap(u: pd.DataFrame, depth: Iterable[str], title: str, value: str,
                        flags: dict[str, np.ndarray], note: str = "") -> go.Figure:
    """Layers x options, colour = `value` (a share), in either of two column orders that buttons above
    the plot switch between: one order for every layer, the options by their `value` summed over all
    layers (option ids on the axis; hover gives a cell's rank in its layer), or each layer sorted by
    its own load (ranks on the axis, ties by option id; hover names the option). Each flag (name ->
    boolean per row of `u`: dead ✕, overloaded ▲) marks its cells in both; a flag with no cell has no
    legend entry. The title (and `note`, a line under it) sits at the top, buttons and the flags'
    legend between it and the plot."""
    u = u.reset_index(drop=True)  # flags are positional
    layers = _layers(u, depth)
    order = list(u.groupby(C.OPTION)[value].sum().sort_values(ascending=False, kind="stable").index)
    col = {o: i for i, o in enumerate(order)}
    li = {l: i for i, l in enumerate(layers)}
    # each row's place in its layer: by value, largest first, ties by option id
    place = (u.sort_values([value, C.OPTION], ascending=[False, True], kind="stable").groupby(C.LAYER).cumcount()
             .reindex(u.index).to_numpy())
    rows, vals = u[C.LAYER].map(li).to_numpy(), u[value].to_numpy(dtype=float)
    shape = (len(layers), len(order))
    z, zs = np.full(shape, np.nan), np.full(shape, np.nan)
    rank, option = np.zeros(shape, dtype=int), np.zeros(shape, dtype=int)
    cols = u[C.OPTION].map(col).to_numpy()
    z[rows, cols], rank[rows, cols] = vals, place + 1
    zs[rows, place], option[rows, place] = vals, u[C.OPTION].to_numpy()
    x, xs = [str(o) for o in order], [f"#{r + 1}" for r in range(len(order))]
    common = dict(y=layers, colorscale="Blues", zmin=0, colorbar=dict(title="share"))
    fig = go.Figure(go.Heatmap(z=np.round(z, 5), x=x, customdata=rank, **common,
                               hovertemplate="%{y}<br>option %{x}: share %{z:.4f} (#%{customdata} in its layer)"
                                             "<extra></extra>"))
    fig.add_heatmap(z=np.round(zs, 5), x=xs, customdata=option, visible=False, **common,
                    hovertemplate="%{y}<br>%{x} in its layer: option %{customdata}, share %{z:.4f}<extra></extra>")
    size = 7 if len(order) <= 64 else 5
    for flag, hit in flags.items():
        f = np.asarray(hit, dtype=bool)
        if not f.any():
            continue
        marker = dict(symbol=FLAG_SYMBOLS.get(flag, "circle-open"), size=size, color="#E45756",
                      line=dict(width=1.5, color="#E45756"))
        fig.add_scatter(x=u[C.OPTION][f].astype(str), y=u[C.LAYER][f], mode="markers", name=flag, marker=marker,
                        legendgroup=flag, hovertemplate=f"%{{y}}<br>option %{{x}}: {flag}<extra></extra>")
        fig.add_scatter(x=[xs[p] for p in place[f]], y=u[C.LAYER][f], mode="markers", name=flag, marker=marker,
                        legendgroup=flag, visible=False, customdata=u[C.OPTION][f],
                        hovertemplate=f"%{{y}}<br>%{{x}}: option %{{customdata}}, {flag}<extra></extra>")
    one = [i % 2 == 0 for i in range(len(fig.data))]  # the heatmaps, then each flag's pair, in that order
    buttons = [dict(label=label, method="update", args=[{"visible": [v == (j == 0) for v in one]},
                                                        {"xaxis.categoryarray": xa, "xaxis.title.text": t}])
               for j, (label, xa, t) in enumerate([("one order for every layer", x, ONE_ORDER),
                                                   ("each layer busiest first", xs, PER_LAYER)])]
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=x, tickfont=dict(size=9), showgrid=False,
                     title=ONE_ORDER)
    fig.update_yaxes(autorange="reversed", fixedrange=True)
    lines = 1 + bool(note)
    fig.update_layout(title=dict(text=title, y=1, yref="container", yanchor="top", pad=dict(t=10),
                                 subtitle=dict(text=note, font=dict(size=13))),
                      plot_bgcolor="white", height=max(260, 22 * len(layers) + 140), showlegend=True,
                      legend=dict(orientation="h", y=1, yref="paper", yanchor="bottom", x=1, xanchor="right"),
                      updatemenus=[dict(type="buttons", direction="right", buttons=buttons, active=0, showactive=True,
                                        x=0, xanchor="left", y=1, yanchor="bottom", pad=dict(b=4, t=0, l=0, r=0),
                                        font=dict(size=11))],
                      margin=dict(l=10, r=10, t=10 + TITLE_LINE_PX * lines + LEGEND_PX, b=40))
    return fig


def layer_menu_heatmaps(panels: dict[str, tuple[np.ndarray, list[str], list[str]]], title: str, hover: str,
                        x_title: str, y_title: str) -> go.Figure:
    """One heatmap per layer (name -> (z, x labels, y labels)), a dropdown picking the layer: many
    options x many rows in one figure. `hover`: the hovertemplate ({layer} is filled in)."""
    fig = go.Figure()
    for j, (layer, (z, x, y)) in enumerate(panels.items()):
        fig.add_heatmap(z=np.round(z, 4), x=x, y=y, colorscale="Blues", zmin=0, zmax=1, visible=j == 0, name=layer,
                        hovertemplate=hover.replace("{layer}", html.escape(layer)) + "<extra></extra>")
    layer_menu(fig, list(panels), 1)
    rows = max((len(p[2]) for p in panels.values()), default=1)
    fig.update_xaxes(type="category", title=x_title, tickfont=dict(size=9), showgrid=False)
    fig.update_yaxes(type="category", title=y_title, autorange="reversed")
    fig.update_layout(title=dict(text=title, y=1, yref="container", yanchor="top", pad=dict(t=10)),
                      plot_bgcolor="white", height=max(300, min(720, 18 * rows + 180)), margin=dict(t=100))
    return fig
