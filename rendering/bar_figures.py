"""Bar charts (no Streamlit here): plain and grouped bars, the next-token candidates of a generation
step, the KL of an ablation at every position, an attribution per input token (both wrapped into
rows of tokens) and the effect of each path. Colours and token labels: `style`."""
from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from routescope.analysis.export import columns as C

from routescope.rendering.style import (DIVIDER, DIVIDER_TEXT, HIGHLIGHT, MARGIN_T, NEUTRAL, PALETTE, TICK_FONT,
                                        TOKEN_WINDOW, format_prob, show_token, sign_colours, token_label)
from routescope.rendering.numbers import effect_unit

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


def candidates_figure(tokens: list[str], probs: list[float], chosen: str | int, position: int,
                      ids: list[int] | None = None) -> go.Figure:
    """The next-token candidates of one step, the most probable on top, every one a bar of its own:
    each bar's category is its rank (plotly merges bars whose category strings are equal, and two
    byte tokens both read "�"), its tick the token as shown, prefixed by the rank, with the token id
    where two candidates read alike. `chosen`: the generated token's id (with `ids`) or its text."""
    labels = [show_token(t) for t in tokens]
    alike = {l for l in labels if labels.count(l) > 1}
    ticks = [f"#{r + 1} {l}" + (f" (id {ids[r]})" if ids is not None and l in alike else "")
             for r, l in enumerate(labels)]
    picked = [i == chosen for i in ids] if ids is not None else [t == chosen for t in tokens]
    colors = [HIGHLIGHT if p else NEUTRAL for p in picked]  # not option colours
    keys = [f"r{r}" for r in range(len(tokens))][::-1]  # plotly draws the first category at the bottom
    fig = go.Figure(go.Bar(x=probs[::-1], y=keys, orientation="h", marker_color=colors[::-1],
                           text=[format_prob(p) for p in probs[::-1]], textposition="outside", cliponaxis=False,
                           customdata=[[html.escape(t), format_prob(p)] for t, p in zip(ticks[::-1], probs[::-1])],
                           hovertemplate="%{customdata[0]}: %{customdata[1]}<extra></extra>"))
    top = min(1.0, max(probs, default=1.0)) or 1.0
    fig.update_layout(title=f"Next-token candidates at position {position} (dark: the token generated)",
                      # the axis fits the largest value, with room for its label outside the bar
                      xaxis=dict(range=[0, top * 1.2], **prob_ticks(top * 1.2)),
                      height=60 + 26 * len(tokens), margin=dict(l=10, r=10, t=40, b=10))
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=keys, tickmode="array", tickvals=keys,
                     ticktext=ticks[::-1])
    return fig


def prob_ticks(hi: float, n: int = 4) -> dict:
    """Axis settings for probabilities from 0 to `hi`: about `n` ticks a round step apart (1, 2 or 5
    times a power of ten) and just the decimals of a percent that tell them apart (a ".1%" axis up to
    0.06% reads "0.0%" at every tick)."""
    raw = hi / n if hi > 0 else 0.25
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    decimals = max(0, -math.floor(math.log10(step * 100) + 1e-9))
    return dict(tick0=0, dtick=step, tickformat=f".{decimals}%")


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


def path_effects_figure(names: list[str], values: list[float], title: str,
                        unit: tuple[float, str] | None = None) -> go.Figure:
    """Horizontal bars, largest |effect| on top, green where the option raises the log-prob and red
    where it lowers it; tall enough that every option's label has its own line. Values are drawn in
    `unit` ((factor, name); default `effect_unit` of the values), which `path_effects_table` shares."""
    factor, name = unit or effect_unit(values)
    order = sorted(range(len(values)), key=lambda i: -abs(values[i]))
    y = [names[i] for i in order][::-1]  # plotly draws the first category at the bottom
    x = [values[i] * factor for i in order][::-1]
    fig = go.Figure(go.Bar(x=x, y=y, orientation="h", marker_color=sign_colours(x),
                           hovertemplate=f"%{{y}}: %{{x:+.3g}} {name}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title=f"{name} (green: raises the log-prob, red: lowers it)",
                      height=90 + 24 * len(values), plot_bgcolor="white",
                      margin=dict(l=16 + 7 * max(map(len, names), default=0), r=20, t=40, b=50))
    fig.update_yaxes(automargin=False, tickfont=dict(size=12, color=HIGHLIGHT), type="category")
    fig.update_xaxes(zeroline=True, zerolinecolor="#888", showgrid=True, gridcolor="#eee", exponentformat="none")
    return fig


def path_effects_table(df: pd.DataFrame, names: list[str]) -> tuple[pd.DataFrame, str, tuple[float, str]]:
    """A path attribution's rows (`analysis.runs.attribution`, largest |effect| first) for a table:
    the option's name, its contribution in the unit that fits (`effect_unit`, the chart's), then the
    other columns. Returns (table, the contribution column's name, (factor, unit))."""
    unit = effect_unit(df[C.CONTRIBUTION])
    column = f"{C.CONTRIBUTION} ({unit[1]})"
    table = pd.DataFrame({"option name": names, column: df[C.CONTRIBUTION].to_numpy(dtype=float) * unit[0]})
    return pd.concat([table, df.drop(columns=C.CONTRIBUTION).reset_index(drop=True)], axis=1), column, unit
