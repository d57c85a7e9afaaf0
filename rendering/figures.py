"""Plotly figures built from the analysis tables (no Streamlit here, so they are testable alone)."""
from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from routescope.analysis.export import columns as C
from routescope.analysis.runs.routing import option_names

# one colour per option index (option 0 blue, option 1 orange, ...), used for nothing else; 24
# distinct ones, so a model with 16 experts (olmoe-tiny) never shows two experts in one colour
PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D",
           "#DA16FF", "#B68100", "#750D86", "#00A08B", "#FB00D1", "#6C7C32", "#862A16", "#A777F1",
           "#1616A7", "#222A2A", "#EB663B", "#620042", "#1CA71C", "#0D2A63", "#B2828D", "#AF0038"]
NEUTRAL, HIGHLIGHT = "#9DB5CF", "#1F2D3D"  # bars that are not options: plain, and the one picked out
# every continuous heatmap (weights, shares, gates, cosines): blue = high, red = low, white between
HIGH_IS_BLUE = "RdBu"
DIVIDER_LEGEND = "Dotted vertical line: the prompt ends there; tokens to its right were generated."


def show_token(tok: str) -> str:
    """Make whitespace and control characters visible on an axis or in a tooltip."""
    out = tok.replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍")
    out = "".join(ch if ch.isprintable() or ch == " " else f"\\x{ord(ch):02x}" for ch in out)
    return out if out.strip() else out.replace(" ", "␣") or "∅"


# The token axis of every per-token chart. Each token of the window has its own tick (font TICK_FONT,
# turned upright), cut to LABEL_CHARS characters; hover shows every token whole. The window is
# TOKEN_WINDOW tokens wide: at 1600 px a chart's plot area is about 650-750 px, so each tick gets
# 16-19 px, enough for an upright 12 px label. A longer run opens on its last TOKEN_WINDOW tokens
# (the continuation and the end of the prompt) and the axis pans (drag) and zooms (double-click:
# back, then all of it). Only the ticks inside the shown range are drawn, so a long run costs no
# more labels than a short one (each label is a text node the browser lays out on every redraw).
TOKEN_WINDOW = 40
LABEL_CHARS = 12
TICK_FONT = dict(size=12, color=HIGHLIGHT)
ROW_PX = 34  # one heatmap row
MARGIN_R = 150  # room for the colour bar, the same on every token chart so their columns line up
MARGIN_T = 60  # the title, and above the plot the prompt | generated label
DIVIDER = "prompt | generated"  # the name of the line where the prompt ends
DIVIDER_TEXT = "← prompt · generated →"


def token_label(tok: str) -> str:
    """A token as its tick shows it: `show_token`, cut to LABEL_CHARS characters ("…" at the end)."""
    t = show_token(tok)
    return t if len(t) <= LABEL_CHARS else t[:LABEL_CHARS - 1] + "…"


def token_ticks(tokens: list[str]) -> tuple[list[int], list[str]]:
    """Positions and texts of the token ticks: one per token (the axis shows TOKEN_WINDOW at once)."""
    return list(range(len(tokens))), [token_label(t) for t in tokens]


def token_window(n: int) -> list[float]:
    """The x range a chart of n tokens opens on: all of them up to TOKEN_WINDOW, else the last
    TOKEN_WINDOW."""
    return [max(0, n - TOKEN_WINDOW) - 0.5, n - 0.5]


def _axis(fig: go.Figure, tokens: list[str], n_prompt: int | None, rows: int = 1) -> None:
    """The token axis (ticks, window, panning; the bottom one of stacked rows), and the prompt |
    generated line in every row with its label once above the top row."""
    vals, ticks = token_ticks(tokens)
    fig.update_xaxes(tickmode="array", tickvals=vals, ticktext=ticks, tickangle=-90, tickfont=TICK_FONT,
                     range=token_window(len(tokens)), showgrid=False)
    fig.update_xaxes(ticks="")
    fig.update_yaxes(fixedrange=True, tickfont=dict(size=12, color=HIGHLIGHT))  # a drag pans along the tokens only
    fig.update_layout(dragmode="pan")
    if n_prompt is not None and 0 < n_prompt < len(tokens):  # prompt | generated boundary
        fig.add_vline(x=n_prompt - 0.5, line=dict(color="#444", dash="dot", width=1), name=DIVIDER,
                      **({"row": "all", "col": 1} if rows > 1 else {}))
        # above the plot (over no cell), and above the top row's title when rows are stacked
        fig.add_annotation(x=n_prompt - 0.5, xref="x", y=1, yref="paper", yanchor="bottom",
                           yshift=24 if rows > 1 else 2, text=DIVIDER_TEXT, showarrow=False,
                           font=dict(size=11, color="#444"), name=DIVIDER)


def has_divider(fig: go.Figure) -> bool:
    """Whether the figure marks where the prompt ends (DIVIDER_LEGEND explains the line)."""
    return any(getattr(shape, "name", None) == DIVIDER for shape in fig.layout.shapes)


def is_token_chart(fig: go.Figure) -> bool:
    """Whether the figure is drawn over the token axis (`_axis`)."""
    return fig.layout.xaxis.tickangle == -90 and fig.layout.xaxis.ticktext is not None


def _bottom_margin(fig: go.Figure) -> int:
    """Room for the upright token ticks: about 7 px a character at TICK_FONT's 12 px."""
    ticks = [t for a in fig.select_xaxes() for t in (a.ticktext or ())]
    return 16 + 7 * max(map(len, ticks), default=0)


def _fixed_margins(fig: go.Figure, rows: list[str]) -> None:
    """Margins sized from the labels instead of plotly's automargin, which lays a heatmap out again
    (about half of its drawing time in Chromium): layer names on the left at about 7 px a character,
    upright token ticks below, the colour bar in a right margin of MARGIN_R (its own, fixed: a
    colour bar pushing the margin would give every chart another plot width). `align_token_charts`
    gives every chart of a run the widest left margin, so their token columns line up."""
    fig.update_xaxes(automargin=False)
    fig.update_yaxes(automargin=False)
    fig.update_layout(margin=dict(l=16 + 7 * max(map(len, rows), default=0), r=MARGIN_R, t=MARGIN_T,
                                  b=_bottom_margin(fig), autoexpand=False))
    fig.update_traces(colorbar=dict(thickness=14, x=1.0, xanchor="left", xpad=8), selector=dict(type="heatmap"))


def align_token_charts(figs) -> None:
    """Give every token chart of `figs` the same left and right margins, so token t sits at the same
    x in each (the plot areas are the same width in the same page width)."""
    charts = [f for f in figs if is_token_chart(f)]
    left = max((f.layout.margin.l or 0 for f in charts), default=0)
    for f in charts:
        f.update_layout(margin=dict(l=left, r=MARGIN_R))


def _height(n_rows: int) -> int:
    """The plot area of n heatmap rows (margins come on top)."""
    return max(110, ROW_PX * n_rows + 20)


def _layout(fig: go.Figure, title: str, n_rows: int) -> go.Figure:
    fig.update_layout(title=dict(text=title, y=1, yref="container", yanchor="top", pad=dict(t=10)),
                      height=_height(n_rows), plot_bgcolor="white")
    return fig


def _total_height(fig: go.Figure, plot_px: int) -> None:
    m = fig.layout.margin
    fig.update_layout(height=plot_px + (m.t or 0) + (m.b or 0))


def titled_for_export(fig: go.Figure, model: str, ablation: str) -> go.Figure:
    """A copy of `fig` whose visible title names the run it shows (model, ablation) above the chart's
    own title: an exported page stands alone, away from the app's caption."""
    out = go.Figure(fig)
    run = html.escape(f"{model} · ablation: {ablation}")
    own = fig.layout.title.text
    extra = 26 if own else 0
    m = out.layout.margin
    out.update_layout(title=dict(text=f"{run}<br><span style='font-size:0.85em'>{own}</span>" if own else run,
                                 y=1, yref="container", yanchor="top", pad=dict(t=30 if own else 10)),
                      margin=dict(t=max(m.t or 0, MARGIN_T) + extra + (0 if own else 20)))
    if fig.layout.height:
        out.update_layout(height=fig.layout.height + extra + (0 if own else 20))
    whole_token_axis(out)
    return out


EXPORT_TICK_PX = 18  # a token's column on an exported page: an upright 12 px tick with room to spare


def whole_token_axis(fig: go.Figure) -> None:
    """Open a windowed token chart (`_axis`) on every token: the x range covers them all and the page
    is made wide enough for EXPORT_TICK_PX a token (it scrolls sideways), so an exported page shows
    the whole prompt and continuation, not the app's last TOKEN_WINDOW."""
    n = max((len(a.tickvals or ()) for a in fig.select_xaxes() if a.tickangle == -90), default=0)
    windowed = [a for a in fig.select_xaxes() if a.range is not None and a.tickangle == -90
                and a.range[1] - a.range[0] < n]
    if not windowed:
        return
    for a in windowed:
        a.range = [-0.5, n - 0.5]
    m = fig.layout.margin
    fig.update_layout(width=(m.l or 80) + (m.r or 80) + EXPORT_TICK_PX * n)


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


def _rows_top_down(fig: go.Figure) -> None:
    """The first layer on top (heatmaps put the first category at the bottom): rows read in model
    depth order, top to bottom, as the utilisation chart reads them left to right."""
    fig.update_yaxes(autorange="reversed")


def choice_heatmap(g: ChoiceGrid, tokens: list[str], n_prompt: int | None = None) -> go.Figure:
    """Layer x token heatmap of a discrete choice, hover with details."""
    n = max(1, len(g.labels))
    fig = go.Figure(_choice_trace(g, n, tokens, colorbar=_colorbar(g.labels)))
    _axis(fig, tokens, n_prompt)
    _layout(fig, g.title, len(g.layers))
    _rows_top_down(fig)
    _fixed_margins(fig, g.layers)
    _total_height(fig, _height(len(g.layers)))
    return fig


STACK_GAP = 48  # px between stacked rows: the next row's title


def stacked_choice_heatmaps(grids: list[ChoiceGrid], tokens: list[str], n_prompt: int | None = None) -> go.Figure:
    """Several choice grids of one run as the rows of one figure: a shared token axis, one colour bar
    (the grid with the most options names them). One chart instead of several is also about 100 ms
    less per update in the browser, where Streamlit mounts and lays out every chart on its own."""
    from plotly.subplots import make_subplots

    widest = max(grids, key=lambda g: len(g.labels))
    n = max(1, len(widest.labels))
    heights = [_height(len(g.layers)) for g in grids]
    plot_px = sum(heights) + STACK_GAP * (len(grids) - 1)
    fig = make_subplots(rows=len(grids), cols=1, shared_xaxes=True, vertical_spacing=STACK_GAP / plot_px,
                        subplot_titles=[g.title for g in grids], row_heights=heights)
    for row, g in enumerate(grids, start=1):
        fig.add_trace(_choice_trace(g, n, tokens, showscale=g is widest, colorbar=_colorbar(widest.labels)),
                      row=row, col=1)
    fig.update_annotations(x=0, xanchor="left", font=dict(size=15, color=HIGHLIGHT))  # row titles: left, like a title
    _axis(fig, tokens, n_prompt, rows=len(grids))
    fig.update_layout(plot_bgcolor="white")
    _rows_top_down(fig)
    _fixed_margins(fig, [l for g in grids for l in g.layers])
    _total_height(fig, plot_px)
    return fig


def value_heatmap(z: np.ndarray, hover: np.ndarray, layers: list[str], tokens: list[str], title: str,
                  n_prompt: int | None = None, zmin: float | None = None, zmax: float | None = None,
                  colorscale: str = "Viridis", colorbar_title: str = "") -> go.Figure:
    fig = go.Figure(go.Heatmap(z=z, x=list(range(len(tokens))), y=layers, customdata=hover,
                               hovertemplate="%{customdata}<extra></extra>", colorscale=colorscale, zmin=zmin,
                               zmax=zmax, xgap=1, ygap=1, colorbar=dict(title=colorbar_title)))
    _axis(fig, tokens, n_prompt)
    _layout(fig, title, len(layers))
    _rows_top_down(fig)
    _fixed_margins(fig, [str(l) for l in layers])
    _total_height(fig, _height(len(layers)))
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


def bar_figure(labels: list[str], values: list[float], title: str, y_title: str = "",
               colors: list[str] | None = None) -> go.Figure:
    fig = go.Figure(go.Bar(x=labels, y=values, marker_color=colors or NEUTRAL,
                           hovertemplate="%{x}: %{y:.4f}<extra></extra>"))
    fig.update_layout(title=title, yaxis_title=y_title, height=300, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def grouped_bars(df: pd.DataFrame, x: str, y: str, group: str, title: str, y_title: str = "",
                 hover: str | None = None, colors: dict[Any, str] | None = None, x_title: str = "") -> go.Figure:
    """Bars of y per x, one colour per group (`colors`: group -> colour; default PALETTE in order of
    appearance); `hover`: a column shown on hover (e.g. the option label). x keeps the frame's order."""
    fig = go.Figure()
    for i, (name, g) in enumerate(df.groupby(group, sort=False)):
        extra = dict(customdata=g[hover], hovertemplate=f"{name}<br>%{{customdata}}: %{{y:.4f}}<extra></extra>") \
            if hover else {}
        color = colors[name] if colors else PALETTE[i % len(PALETTE)]
        fig.add_bar(x=g[x].astype(str), y=g[y], name=str(name), marker_color=color, **extra)
    fig.update_layout(title=title, barmode="group", yaxis_title=y_title, xaxis_title=x_title, height=320,
                      margin=dict(l=10, r=10, t=40, b=10))
    fig.update_xaxes(categoryorder="array", categoryarray=list(dict.fromkeys(df[x].astype(str))))
    return fig


def candidates_figure(tokens: list[str], probs: list[float], chosen: str, position: int) -> go.Figure:
    labels = [show_token(t) for t in tokens]
    colors = [HIGHLIGHT if t == chosen else NEUTRAL for t in tokens]  # not option colours
    fig = go.Figure(go.Bar(x=probs[::-1], y=labels[::-1], orientation="h", marker_color=colors[::-1],
                           text=[format_prob(p) for p in probs[::-1]], textposition="outside",
                           customdata=[format_prob(p) for p in probs[::-1]],
                           hovertemplate="%{y}: %{customdata}<extra></extra>"))
    top = max(probs, default=1.0)
    fig.update_layout(title=f"Next-token candidates at position {position} (dark: the token generated)",
                      # the axis fits the largest value, with room for its label outside the bar
                      xaxis=dict(range=[0, min(1.0, top) * 1.2], tickformat=".0%" if top >= 0.05 else ".1%"),
                      height=60 + 26 * len(tokens), margin=dict(l=10, r=10, t=40, b=10))
    return fig


def kl_figure(effects: pd.DataFrame, tokens: list[str], n_prompt: int | None = None) -> go.Figure:
    """KL at every position (the distribution at position p predicts token p + 1) in rows of
    TOKEN_WINDOW positions, the prompt | generated line between the prompt's last token and the first
    generated one."""
    e = effects[effects[C.BATCH] == 0].sort_values(C.POSITION)
    colors = [PALETTE[3] if f else PALETTE[0] for f in e[C.FLIPPED]]
    hover = [f"{html.escape(show_token(tokens[p]))} (pos {p})<br>KL {k:.4f} nats<br>p(base top-1): {a:.3f} → {b:.3f}"
             f"{'<br><b>top-1 flipped</b>' if f else ''}"
             for p, k, a, b, f in zip(e[C.POSITION], e[C.KL], e[C.BASE_PROB], e[C.ABLATED_PROB], e[C.FLIPPED])]
    return wrapped_token_bars(tokens[:len(e)], [float(k) for k in e[C.KL]], colors, hover,
                              "KL(base ‖ ablated) of the next-token distribution at each position "
                              "(red: top-1 flipped)", y_title="nats", n_prompt=n_prompt)


POSITIVE, NEGATIVE = PALETTE[2], PALETTE[3]  # an effect's sign: green raises the log-prob, red lowers it


def sign_colours(values: Iterable[float]) -> list[str]:
    return [POSITIVE if v >= 0 else NEGATIVE for v in values]


def attribution_figure(tokens: list[str], values: list[float], title: str) -> go.Figure:
    """Every input token's attribution, the whole prompt in rows of TOKEN_WINDOW tokens (nothing
    windowed away: the start of a prompt is often what an attribution is about)."""
    hover = [f"{html.escape(show_token(t))} (pos {i}): {v:.4f}" for i, (t, v) in enumerate(zip(tokens, values))]
    return wrapped_token_bars(tokens, values, sign_colours(values), hover, title, y_title="attribution")


BAR_ROW_PX = 130  # the plot area of one row of wrapped token bars


def wrapped_token_bars(tokens: list[str], values: list[float], colors: list[str], hover: list[str], title: str,
                       y_title: str = "", n_prompt: int | None = None, per_row: int = TOKEN_WINDOW) -> go.Figure:
    """Bars over every token, wrapped into rows of `per_row` tokens (the density the windowed charts
    were sized for), each row ticked with its own tokens and on one shared value scale, so every token
    is on screen with a readable tick and none is a pan away. The prompt | generated line, where
    `n_prompt` falls inside the tokens, is drawn in its row."""
    from plotly.subplots import make_subplots

    n = len(tokens)
    rows = max(1, math.ceil(n / per_row))
    ticks = [token_label(t) for t in tokens]
    gap = 16 + 7 * max(map(len, ticks), default=0) + 24  # the row's upright ticks, then the next row's label
    plot_px = rows * BAR_ROW_PX + (rows - 1) * gap
    fig = make_subplots(rows=rows, cols=1, vertical_spacing=gap / plot_px if rows > 1 else 0)
    finite = [v for v in values if v == v]
    lo, hi = min([0.0, *finite]), max([0.0, *finite])
    pad = 0.08 * (hi - lo or 1.0)
    for r in range(rows):
        a, b = r * per_row, min(n, (r + 1) * per_row)
        fig.add_trace(go.Bar(x=list(range(a, b)), y=values[a:b], marker_color=colors[a:b], customdata=hover[a:b],
                             hovertemplate="%{customdata}<extra></extra>", showlegend=False), row=r + 1, col=1)
        fig.update_xaxes(tickmode="array", tickvals=list(range(a, b)), ticktext=ticks[a:b], tickangle=-90,
                         tickfont=TICK_FONT, range=[a - 0.5, a + per_row - 0.5], showgrid=False, ticks="",
                         fixedrange=True, row=r + 1, col=1)
    fig.update_yaxes(range=[lo - pad, hi + pad], fixedrange=True, title_text=y_title, title_font_size=11,
                     tickfont=dict(size=11, color=HIGHLIGHT), zeroline=True, zerolinecolor="#888")
    if n_prompt is not None and 0 < n_prompt < n:
        r = n_prompt // per_row  # the row of the first generated token; the line is at its left
        fig.add_vline(x=n_prompt - 0.5, line=dict(color="#444", dash="dot", width=1), name=DIVIDER, row=r + 1, col=1)
        fig.add_annotation(x=n_prompt - 0.5, xref=f"x{r + 1 if r else ''}", y=1, yref=f"y{r + 1 if r else ''} domain",
                           yanchor="bottom", yshift=2, text=DIVIDER_TEXT, showarrow=False,
                           font=dict(size=11, color="#444"), name=DIVIDER)
    fig.update_layout(title=dict(text=title, y=1, yref="container", yanchor="top", pad=dict(t=10)),
                      plot_bgcolor="white", bargap=0.15, margin=dict(l=60, r=20, t=MARGIN_T, b=gap - 24),
                      height=plot_px + MARGIN_T + gap - 24)
    return fig


def axis_ticks(fig: go.Figure) -> list[str]:
    """Every token tick of a figure, over all its x axes in order (the wrapped rows' too)."""
    return [t for a in fig.select_xaxes() for t in (a.ticktext or ())]


def path_effects_figure(names: list[str], values: list[float], title: str) -> go.Figure:
    """Horizontal bars, largest |effect| on top, green where the option raises the log-prob and red
    where it lowers it; tall enough that every option's label has its own line."""
    order = sorted(range(len(values)), key=lambda i: -abs(values[i]))
    y = [names[i] for i in order][::-1]  # plotly draws the first category at the bottom
    x = [values[i] for i in order][::-1]
    fig = go.Figure(go.Bar(x=x, y=y, orientation="h", marker_color=sign_colours(x),
                           hovertemplate="%{y}: %{x:+.4f} nats<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="nats (green: raises the log-prob, red: lowers it)",
                      height=90 + 24 * len(values), plot_bgcolor="white",
                      margin=dict(l=16 + 7 * max(map(len, names), default=0), r=20, t=40, b=50))
    fig.update_yaxes(automargin=False, tickfont=dict(size=12, color=HIGHLIGHT), type="category")
    fig.update_xaxes(zeroline=True, zerolinecolor="#888", showgrid=True, gridcolor="#eee")
    return fig


def format_prob(p: float) -> str:
    """A probability readable at any size: one decimal of a percent from 0.1%, two significant
    digits of a percent below (0.034%), scientific notation under a millionth (3.4e-09); never a
    "0.0%" for a candidate the model did rank."""
    if p != p:
        return "n/a"
    if p >= 1e-3 or p == 0:
        return f"{p:.1%}"
    if p >= 1e-6:
        return f"{p * 100:.2g}%"
    return f"{p:.1e}"


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
    _total_height(fig, max(_height(len(layers)), 60 * len(layers) + 20))
    return fig


# --- many options: place on an axis, not colour (analysis.runs.routing.MANY_OPTIONS) ------------------

def _layer_menu(fig: go.Figure, layers: list[str], traces_per_layer: int) -> None:
    """A dropdown that shows one layer's traces at a time (the first layer's at first): one figure
    however many layers, in the app and in its offline page alike."""
    n = len(layers) * traces_per_layer
    buttons = [dict(label=layer, method="update",
                    args=[{"visible": [i // traces_per_layer == j for i in range(n)]}])
               for j, layer in enumerate(layers)]
    fig.update_layout(updatemenus=[dict(buttons=buttons, direction="down", x=1, xanchor="right", y=1, yanchor="bottom",
                                        showactive=True, active=0, pad=dict(t=0, b=28), bgcolor="white",
                                        font=dict(size=12, color=HIGHLIGHT))])


def expert_matrix_figure(view: pd.DataFrame, tokens: list[str], n_prompt: int | None,
                         depth: Iterable[str] = ()) -> go.Figure:
    """Per layer (a dropdown picks it), experts x tokens: colour = the router's probability, the
    token's top-k picks marked with their rank. Hover names the layer, expert, token and value.
    Values are rounded to 4 decimals, which keeps a 128-expert x 24-layer page small."""
    v = view[view[C.BATCH] == 0]
    layers, T = _layers(v, depth), len(tokens)
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
    _axis(fig, tokens, n_prompt)
    plot_px = max(240, min(720, 5 * tallest))
    fig.update_layout(title=dict(text="Top-k routing: router probability per expert and token (○ picked)",
                                 y=1, yref="container", yanchor="top",
                                 pad=dict(t=10)),
                      plot_bgcolor="white", margin=dict(t=100))
    fig.update_yaxes(title="expert", autorange="reversed", tickfont=dict(size=11))
    _layer_menu(fig, layers, 2)
    _fixed_margins(fig, ["expert 000"])
    _total_height(fig, plot_px)
    return fig


def utilisation_heatmap(u: pd.DataFrame, depth: Iterable[str], title: str, value: str,
                        flags: dict[str, np.ndarray]) -> go.Figure:
    """Layers x options, colour = `value` (a share), options ordered by their load over all layers
    (busiest left); each flag (name -> boolean per row of `u`: dead ✕, overloaded ▲) marks its cells.
    Hover names layer, option and value."""
    layers = _layers(u, depth)
    load = u.groupby(C.OPTION)[value].sum().sort_values(ascending=False, kind="stable")
    order = list(load.index)
    col = {o: i for i, o in enumerate(order)}
    li = {l: i for i, l in enumerate(layers)}
    z = np.full((len(layers), len(order)), np.nan)
    z[u[C.LAYER].map(li).to_numpy(), u[C.OPTION].map(col).to_numpy()] = u[value].to_numpy(dtype=float)
    x = [str(o) for o in order]
    fig = go.Figure(go.Heatmap(z=np.round(z, 5), x=x, y=layers, colorscale="Blues", zmin=0,
                               colorbar=dict(title="share"),
                               hovertemplate="%{y}<br>option %{x}: share %{z:.4f}<extra></extra>"))
    for (flag, hit), symbol in zip(flags.items(), ("x-thin", "triangle-up")):
        f = u[np.asarray(hit, dtype=bool)]
        fig.add_scatter(x=f[C.OPTION].astype(str), y=f[C.LAYER], mode="markers", name=flag,
                        marker=dict(symbol=symbol, size=7 if len(order) <= 64 else 5, color="#E45756",
                                    line=dict(width=1.5, color="#E45756")),
                        hovertemplate=f"%{{y}}<br>option %{{x}}: {flag}<extra></extra>")
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=x, title="option (busiest first)",
                     tickfont=dict(size=9), showgrid=False)
    fig.update_yaxes(autorange="reversed", fixedrange=True)
    fig.update_layout(title=title, plot_bgcolor="white", height=max(260, 22 * len(layers) + 140),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
                      margin=dict(l=10, r=10, t=60, b=40))
    return fig


def layer_menu_heatmaps(panels: dict[str, tuple[np.ndarray, list[str], list[str]]], title: str, hover: str,
                        x_title: str, y_title: str) -> go.Figure:
    """One heatmap per layer (name -> (z, x labels, y labels)), a dropdown picking the layer: many
    options x many rows in one figure. `hover`: the hovertemplate ({layer} is filled in)."""
    fig = go.Figure()
    for j, (layer, (z, x, y)) in enumerate(panels.items()):
        fig.add_heatmap(z=np.round(z, 4), x=x, y=y, colorscale="Blues", zmin=0, zmax=1, visible=j == 0, name=layer,
                        hovertemplate=hover.replace("{layer}", html.escape(layer)) + "<extra></extra>")
    _layer_menu(fig, list(panels), 1)
    rows = max((len(p[2]) for p in panels.values()), default=1)
    fig.update_xaxes(type="category", title=x_title, tickfont=dict(size=9), showgrid=False)
    fig.update_yaxes(type="category", title=y_title, autorange="reversed")
    fig.update_layout(title=dict(text=title, y=1, yref="container", yanchor="top", pad=dict(t=10)),
                      plot_bgcolor="white", height=max(300, min(720, 18 * rows + 180)), margin=dict(t=100))
    return fig
