"""What every RouteScope figure shares (no Streamlit here): the option colours, the token axis of the
per-token charts (window, ticks, the prompt | generated line), their margins and heights, a layer
dropdown, how a token and a probability are shown, and the copy of a figure an exported page shows.
The figures themselves: `route_heatmaps` (routes per layer and token) and `bar_figures` (candidates,
effects, attributions)."""
from __future__ import annotations

import html
from collections.abc import Iterable

import plotly.graph_objects as go

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


def token_axis(fig: go.Figure, tokens: list[str], n_prompt: int | None, rows: int = 1) -> None:
    """The token axis (ticks, window, panning; the bottom one of stacked rows), and the prompt |
    generated line in every row with its label once above the top row."""
    vals, ticks = token_ticks(tokens)
    fig.update_xaxes(tickmode="array", tickvals=vals, ticktext=ticks, tickangle=-90, tickfont=TICK_FONT,
                     range=token_window(len(tokens)), showgrid=False)
    fig.update_xaxes(ticks="")
    fig.update_yaxes(fixedrange=True, tickfont=dict(size=12, color=HIGHLIGHT))  # a drag pans along the tokens only
    fig.update_layout(dragmode="pan")
    if n_prompt is not None and 0 < n_prompt < len(tokens):  # prompt | generated boundary
        line = dict(color="#444", dash="dot", width=1)
        if rows == 1:
            fig.add_vline(x=n_prompt - 0.5, line=line, name=DIVIDER)
        else:  # one per row, by axis name (stacked rows are laid out without make_subplots' grid)
            for a in ["", *map(str, range(2, rows + 1))]:
                fig.add_shape(type="line", x0=n_prompt - 0.5, x1=n_prompt - 0.5, xref=f"x{a}", y0=0, y1=1,
                              yref=f"y{a} domain", line=line, name=DIVIDER)
        # above the plot (over no cell), and above the top row's title when rows are stacked
        fig.add_annotation(x=n_prompt - 0.5, xref="x", y=1, yref="paper", yanchor="bottom",
                           yshift=24 if rows > 1 else 2, text=DIVIDER_TEXT, showarrow=False,
                           font=dict(size=11, color="#444"), name=DIVIDER)


def has_divider(fig: go.Figure) -> bool:
    """Whether the figure marks where the prompt ends (DIVIDER_LEGEND explains the line)."""
    return any(getattr(shape, "name", None) == DIVIDER for shape in fig.layout.shapes)


def is_token_chart(fig: go.Figure) -> bool:
    """Whether the figure is drawn over the token axis (`token_axis`)."""
    return fig.layout.xaxis.tickangle == -90 and fig.layout.xaxis.ticktext is not None


def _bottom_margin(fig: go.Figure) -> int:
    """Room for the upright token ticks: about 7 px a character at TICK_FONT's 12 px."""
    ticks = [t for a in fig.select_xaxes() for t in (a.ticktext or ())]
    return 16 + 7 * max(map(len, ticks), default=0)


def fixed_margins(fig: go.Figure, rows: list[str]) -> None:
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


def align_token_charts(figs, only: go.Figure | None = None) -> None:
    """Give every token chart of `figs` the same left and right margins, so token t sits at the same
    x in each (the plot areas are the same width in the same page width). `only`: change that figure
    alone (the others are shared, read-only, and already aligned among themselves)."""
    charts = [f for f in figs if is_token_chart(f)]
    left = max((f.layout.margin.l or 0 for f in charts), default=0)
    for f in charts if only is None else [only] if is_token_chart(only) else []:
        f.update_layout(margin=dict(l=left, r=MARGIN_R))


def heatmap_height(n_rows: int) -> int:
    """The plot area of n heatmap rows (margins come on top)."""
    return max(110, ROW_PX * n_rows + 20)


def title_layout(fig: go.Figure, title: str, n_rows: int) -> go.Figure:
    """The title at the top of the figure, the height of `n_rows` heatmap rows, a white plot."""
    fig.update_layout(title=dict(text=title, y=1, yref="container", yanchor="top", pad=dict(t=10)),
                      height=heatmap_height(n_rows), plot_bgcolor="white")
    return fig


def total_height(fig: go.Figure, plot_px: int) -> None:
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
    """Open a windowed token chart (`token_axis`) on every token: the x range covers them all and the page
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


def rows_top_down(fig: go.Figure) -> None:
    """The first layer on top (heatmaps put the first category at the bottom): rows read in model
    depth order, top to bottom, as the utilisation chart reads them left to right."""
    fig.update_yaxes(autorange="reversed")


POSITIVE, NEGATIVE = PALETTE[2], PALETTE[3]  # an effect's sign: green raises the log-prob, red lowers it


def sign_colours(values: Iterable[float]) -> list[str]:
    return [POSITIVE if v >= 0 else NEGATIVE for v in values]


def axis_ticks(fig: go.Figure) -> list[str]:
    """Every token tick of a figure, over all its x axes in order (the wrapped rows' too)."""
    return [t for a in fig.select_xaxes() for t in (a.ticktext or ())]


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


def layer_menu(fig: go.Figure, layers: list[str], traces_per_layer: int) -> None:
    """A dropdown that shows one layer's traces at a time (the first layer's at first): one figure
    however many layers, in the app and in its offline page alike."""
    n = len(layers) * traces_per_layer
    buttons = [dict(label=layer, method="update",
                    args=[{"visible": [i // traces_per_layer == j for i in range(n)]}])
               for j, layer in enumerate(layers)]
    fig.update_layout(updatemenus=[dict(buttons=buttons, direction="down", x=1, xanchor="right", y=1, yanchor="bottom",
                                        showactive=True, active=0, pad=dict(t=0, b=28), bgcolor="white",
                                        font=dict(size=12, color=HIGHLIGHT))])
