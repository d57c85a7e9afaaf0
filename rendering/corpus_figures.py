"""Plotly figures of corpus statistics (`analysis.corpus.reductions` tables; no Streamlit here). Colours follow
the options as everywhere (`figures.PALETTE`: option 0 blue, option 1 orange, ...)."""
from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from routescope.analysis.export import columns as C
from routescope.analysis.corpus import stats as S

from routescope.analysis.runs.routing import MANY_OPTIONS

from routescope.rendering.style import PALETTE, show_token
from routescope.rendering.route_heatmaps import layer_menu_heatmaps, utilisation_heatmap

TOP_TRANSITIONS = 20  # per pair of adjacent layers, with many options

MAX_PANELS = 8  # label values or layer pairs drawn side by side; the table has every one

BAR_HEADROOM = 1.2  # the share axis reaches past the tallest bar, room for a flag's text above it


def _colour(o: int) -> str:
    return PALETTE[o % len(PALETTE)]


def _option_names(df: pd.DataFrame, option: str = C.OPTION, label: str = C.LABEL) -> dict[int, str]:
    """Option -> its label, the layers' own where they agree ("block 1 / expert 1" where not)."""
    out: dict[int, list[str]] = {}
    for o, name in zip(df[option], df[label]):
        out.setdefault(int(o), [])
        if name not in out[int(o)]:
            out[int(o)].append(name)
    return {o: " / ".join(names) for o, names in sorted(out.items())}


def many_options(df: pd.DataFrame, option: str = C.OPTION) -> bool:
    return df[option].nunique() > MANY_OPTIONS if len(df) else False


def utilisation_figure(u: pd.DataFrame) -> go.Figure:
    """Per layer, each option's share of top-k slots (first choices where k = 1) as grouped bars, the
    uniform share as a dashed line, dead and overloaded options marked. With many options a layer x
    option heatmap, busiest options first, the flags marked in their cells."""
    if many_options(u):
        return utilisation_heatmap(u, [], "Utilisation: each option's share of the routing slots per layer "
                                   "(✕ dead: < 1% of uniform; ▲ overloaded: > 2x uniform)", S.SLOT_SHARE,
                                   {"dead": u[S.DEAD].to_numpy(dtype=bool),
                                    "overloaded": u[S.OVERLOADED].to_numpy(dtype=bool)})
    fig = go.Figure()
    layers = list(dict.fromkeys(u[C.LAYER]))
    for o, name in _option_names(u).items():
        d = u[u[C.OPTION] == o]
        flag = np.where(d[S.DEAD], "dead", np.where(d[S.OVERLOADED], "overloaded", ""))
        fig.add_trace(go.Bar(
            x=d[C.LAYER], y=d[S.SLOT_SHARE], name=f"{o}: {name}", marker_color=_colour(o),
            text=[{"dead": "✕ dead", "overloaded": "▲ over"}.get(f, "") for f in flag], textposition="outside",
            cliponaxis=False,
            customdata=np.stack([d[C.LABEL], d[S.FIRST_SHARE], d[S.TOKEN_SHARE], d[S.TOKENS], flag], axis=-1),
            hovertemplate="%{x} · option " + str(o) + " (%{customdata[0]})<br>share of top-k slots %{y:.1%}"
                          "<br>first choices %{customdata[1]:.1%} · tokens picking it %{customdata[2]:.1%} "
                          "(%{customdata[3]:,})<br>%{customdata[4]}<extra></extra>"))
    uniform = u.drop_duplicates(C.LAYER)
    fig.add_trace(go.Scatter(x=uniform[C.LAYER], y=uniform[S.UNIFORM], mode="markers", name="uniform 1/n",
                             marker=dict(symbol="line-ew-open", size=40, color="#444", line=dict(width=2)),
                             hovertemplate="%{x}: uniform share %{y:.1%}<extra></extra>"))
    top = float(np.nanmax(u[S.SLOT_SHARE].to_numpy(dtype=float), initial=0.0))
    # headroom above the tallest bar for its "▲ over" (capped at 100% it was cut off near 100%); ticks stop at 100%
    hi = top * BAR_HEADROOM + 0.05
    fig.update_layout(barmode="group", height=340, yaxis_tickformat=".0%", yaxis_range=[0, hi],
                      yaxis_tickvals=[v / 5 for v in range(6)] if hi > 1 else None,
                      title="Utilisation: each option's share of the routing slots per layer "
                            "(✕ dead: < 1% of uniform; ▲ overloaded: > 2x uniform)",
                      xaxis=dict(categoryorder="array", categoryarray=layers), margin=dict(l=60, r=10, t=50, b=10),
                      plot_bgcolor="white", legend_title_text="option")
    return fig


def label_shares_figure(sh: pd.DataFrame, column: str, reading: str = "token") -> go.Figure:
    """For one label column: per value (a panel each, up to MAX_PANELS) the share of its routes
    taking each option at each layer, stacked."""
    d = sh[(sh[S.LABEL_COLUMN] == column) & (sh[S.READING] == reading)]
    if many_options(d):  # a label x option heatmap per layer, the menu picking the layer
        panels = {}
        for layer, g in d.groupby(C.LAYER, sort=False):
            z = g.pivot_table(index=S.LABEL_VALUE, columns=C.OPTION, values=C.SHARE, aggfunc="first", sort=False)
            panels[str(layer)] = (z.to_numpy(dtype=float), [str(o) for o in z.columns], [str(v) for v in z.index])
        return layer_menu_heatmaps(panels, f"Route shares by {column} "
                                           f"({'every token' if reading == 'token' else 'last token of each row'}): "
                                           "label x option, the menu picks the layer",
                                   f"{{layer}}<br>{html.escape(str(column))} = %{{y}} · option %{{x}}: %{{z:.1%}}",
                                   "option", str(column))
    values = list(dict.fromkeys(d[S.LABEL_VALUE]))[:MAX_PANELS]
    fig = make_subplots(rows=1, cols=max(1, len(values)), subplot_titles=[str(v) for v in values], shared_yaxes=True)
    for o, name in _option_names(d).items():
        for c, value in enumerate(values, start=1):
            s = d[(d[S.LABEL_VALUE] == value) & (d[C.OPTION] == o)]
            fig.add_trace(go.Bar(x=s[C.LAYER], y=s[C.SHARE], name=f"{o}: {name}", legendgroup=str(o),
                                 showlegend=c == 1, marker_color=_colour(o), customdata=s[[C.COUNT, S.N]].to_numpy(),
                                 hovertemplate=f"{column} = {value}<br>%{{x}} · option {o}: %{{y:.1%}} "
                                               "(%{customdata[0]:,} of %{customdata[1]:,})<extra></extra>"),
                          row=1, col=c)
    more = len(set(d[S.LABEL_VALUE])) - len(values)
    fig.update_layout(barmode="stack", height=340, yaxis_tickformat=".0%", plot_bgcolor="white",
                      title=f"Route shares by {column} ({'every token' if reading == 'token' else 'last token of each row'})"
                            + (f"; {more} more values in the table" if more > 0 else ""),
                      margin=dict(l=60, r=10, t=70, b=10), legend_title_text="option")
    return fig


def accuracy_figure(acc: pd.DataFrame) -> go.Figure:
    """Accuracy per layer (and over all layers) of each mapped label value, both readings."""
    fig = go.Figure()
    for (column, value, reading), g in acc.groupby([S.LABEL_COLUMN, S.LABEL_VALUE, S.READING], sort=False):
        intended = g[S.INTENDED].iloc[0]
        name = f"{column} = {value}" + ("" if intended is pd.NA else f" -> option {intended}") + f" ({reading})"
        fig.add_trace(go.Bar(x=g[C.LAYER], y=g[S.ACCURACY], name=name, customdata=g[[C.CORRECT, S.N]].to_numpy(),
                             hovertemplate=name + "<br>%{x}: %{y:.1%} (%{customdata[0]:,} of %{customdata[1]:,})"
                                                  "<extra></extra>"))
    fig.update_layout(barmode="group", height=340, yaxis_tickformat=".0%", yaxis_range=[0, 1], plot_bgcolor="white",
                      title="Accuracy: routes taking the label's intended option", margin=dict(l=60, r=10, t=50, b=10))
    return fig


CO_PANEL_PX, CO_GAP_PX, CO_TOP_PX = 190, 96, 100  # a panel; below it its ticks, axis title, the next row's title
PAGE_PX = 1000  # the width a corpus chart is laid out for (the app's main column, corpus.html's body)


def top_transitions(co: pd.DataFrame, n: int = TOP_TRANSITIONS) -> pd.DataFrame:
    """The n most frequent option transitions (by tokens) of each pair of layers."""
    d = co[co[C.COUNT] > 0].sort_values([S.LAYER_A, S.LAYER_B, C.COUNT], ascending=[True, True, False], kind="stable")
    return d.groupby([S.LAYER_A, S.LAYER_B], sort=False).head(n).reset_index(drop=True)


def co_routing_figure(co: pd.DataFrame) -> go.Figure:
    """P(option b at layer j | option a at layer i) as one heatmap per layer pair (up to MAX_PANELS),
    each titled with its pair on two lines, as many panels a row as their titles leave room for. With
    many options (a 128 x 128 panel a pair) the top transitions of each pair as bars, a menu picking
    the pair."""
    if many_options(co, C.OPTION_A):
        return _top_transitions_figure(top_transitions(co))
    pairs = list(dict.fromkeys(zip(co[S.LAYER_A], co[S.LAYER_B])))[:MAX_PANELS]
    longest = max((len(str(x)) + 2 for p in pairs for x in p), default=10)
    cols = max(1, min(4, len(pairs), PAGE_PX // (8 * longest + 60)))  # about 8 px a character at 13 px
    rows = math.ceil(len(pairs) / cols) if pairs else 1
    plot_px = rows * CO_PANEL_PX + (rows - 1) * CO_GAP_PX
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"{a} →<br>{b}" for a, b in pairs],
                        horizontal_spacing=0.1, vertical_spacing=CO_GAP_PX / plot_px if rows > 1 else 0)
    for k, (la, lb) in enumerate(pairs):
        d = co[(co[S.LAYER_A] == la) & (co[S.LAYER_B] == lb)]
        z = d.pivot(index=C.OPTION_A, columns=C.OPTION_B, values=S.P_B_GIVEN_A)
        n = d.pivot(index=C.OPTION_A, columns=C.OPTION_B, values=C.COUNT)
        fig.add_trace(go.Heatmap(z=z.to_numpy(dtype=float), x=[str(b) for b in z.columns], y=[str(a) for a in z.index],
                                 zmin=0, zmax=1, colorscale="Blues", showscale=k == 0, customdata=n.to_numpy(),
                                 hovertemplate=f"{la} option %{{y}} → {lb} option %{{x}}: P = %{{z:.1%}} "
                                               "(%{customdata:,} tokens)<extra></extra>"),
                      row=k // cols + 1, col=k % cols + 1)
    fig.update_xaxes(title_text="option at the later layer", title_font_size=10)
    fig.update_yaxes(title_text="option at the earlier layer", title_font_size=10, autorange="reversed")
    more = len(set(zip(co[S.LAYER_A], co[S.LAYER_B]))) - len(pairs)
    fig.update_annotations(font_size=13)  # the panels' two-line titles
    fig.update_layout(height=plot_px + CO_TOP_PX + 50, margin=dict(l=60, r=10, t=CO_TOP_PX, b=50),
                      title=dict(text="Co-routing: P(option at the later layer | option at the earlier layer)"
                                      + (f"; {more} more pairs in the table" if more > 0 else ""), y=1,
                                 yref="container", yanchor="top", pad=dict(t=10)))
    return fig


def _top_transitions_figure(top: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    pairs = list(dict.fromkeys(zip(top[S.LAYER_A], top[S.LAYER_B])))
    for j, (la, lb) in enumerate(pairs):
        d = top[(top[S.LAYER_A] == la) & (top[S.LAYER_B] == lb)]
        fig.add_bar(x=d[C.COUNT], y=[f"{a} → {b}" for a, b in zip(d[C.OPTION_A], d[C.OPTION_B])], orientation="h",
                    visible=j == 0, marker_color="#4C78A8", customdata=d[S.P_B_GIVEN_A], name=f"{la} → {lb}",
                    hovertemplate=f"{html.escape(str(la))} → {html.escape(str(lb))}<br>option %{{y}}: %{{x:,}} tokens, "
                                  "P(later | earlier) %{customdata:.1%}<extra></extra>")
    buttons = [dict(label=f"{la} → {lb}", method="update", args=[{"visible": [i == j for i in range(len(pairs))]}])
               for j, (la, lb) in enumerate(pairs)]
    fig.update_layout(updatemenus=[dict(buttons=buttons, direction="down", x=1, xanchor="right", y=1, yanchor="bottom",
                                        pad=dict(b=28), bgcolor="white")],
                      title=dict(text=f"Co-routing: the {TOP_TRANSITIONS} most frequent option transitions of each "
                                      "pair of layers (tokens; the menu picks the pair)", y=1, yref="container",
                                 yanchor="top", pad=dict(t=10)),
                      height=120 + 22 * TOP_TRANSITIONS, margin=dict(l=90, r=10, t=100, b=40), plot_bgcolor="white",
                      xaxis_title="tokens", yaxis=dict(autorange="reversed", type="category"))
    return fig


def call_values_figure(cv: pd.DataFrame) -> go.Figure:
    """Mean of each exported value over the corpus (all rows), per layer and option, a panel per
    kind, error bars one standard deviation."""
    d = cv[cv[S.LABEL_VALUE] == S.ALL]
    kinds = list(dict.fromkeys(zip(d[S.KIND], d[S.SCOPE])))[:MAX_PANELS]
    fig = make_subplots(rows=1, cols=max(1, len(kinds)), subplot_titles=[f"{k} ({s})" for k, s in kinds])
    shown = set()
    for c, (kind, scope) in enumerate(kinds, start=1):
        g = d[(d[S.KIND] == kind) & (d[S.SCOPE] == scope)]
        for o, part in g.groupby(g[C.OPTION].fillna(-1).astype(int), sort=True):
            name = f"{o}: {part[C.LABEL].iloc[0]}" if o >= 0 else "value"
            fig.add_trace(go.Bar(x=part[C.LAYER], y=part[S.MEAN], error_y=dict(type="data", array=part[S.STD]),
                                 name=name, legendgroup=name, showlegend=name not in shown,
                                 marker_color=_colour(o) if o >= 0 else "#9DB5CF",
                                 hovertemplate=f"{kind} · %{{x}} · {name}: mean %{{y:.3f}}<extra></extra>"),
                          row=1, col=c)
            shown.add(name)
    fig.update_layout(barmode="group", height=340, plot_bgcolor="white", margin=dict(l=60, r=10, t=70, b=10),
                      title="What this family records instead of per-token routes: values over the corpus "
                            "(mean, bars one standard deviation)")
    return fig


def compare_figure(c: pd.DataFrame, table: str, names: tuple[str, str]) -> go.Figure | None:
    """Differences (b - a) of a compared table's main measure: utilisation by slot share, label
    shares by share (every token), accuracy; other tables are shown as tables only."""
    a, b = names
    if table == "utilisation":
        d, y, x, title = c, "slot_share_diff", C.LAYER, "slot share"
    elif table == "label_shares":
        d = c[c[S.READING] == "token"]
        d = d.assign(_x=d[S.LABEL_COLUMN] + "=" + d[S.LABEL_VALUE] + " · " + d[C.LAYER])
        y, x, title = "share_diff", "_x", "route share (every token)"
    elif table == "accuracy":
        d = c[c[S.LABEL_VALUE] == S.ALL]
        d = d.assign(_x=d[S.LABEL_COLUMN] + " · " + d[S.READING] + " · " + d[C.LAYER])
        y, x, title = "accuracy_diff", "_x", "accuracy"
    else:
        return None
    fig = go.Figure()
    if table == "accuracy":
        fig.add_trace(go.Bar(x=d[x], y=d[y], name="accuracy", marker_color="#9DB5CF"))
    else:
        for o, name in _option_names(d).items():
            s = d[d[C.OPTION] == o]
            fig.add_trace(go.Bar(x=s[x], y=s[y], name=f"{o}: {name}", marker_color=_colour(o)))
    fig.update_layout(barmode="group", height=340, yaxis_tickformat="+.0%", plot_bgcolor="white",
                      title=f"{title}: {b} minus {a}", margin=dict(l=60, r=10, t=50, b=10))
    return fig


def specialisation_table(sp: pd.DataFrame) -> pd.DataFrame:
    """The specialisation table with token texts made visible (whitespace, control characters)."""
    return sp.assign(**{C.TOKEN: sp[C.TOKEN].map(show_token)}) if C.TOKEN in sp.columns else sp
