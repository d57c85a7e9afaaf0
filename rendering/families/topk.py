"""The top-k drawers (MoEP and Hugging Face MoE): first choices, every option's probability at many
options, utilisation and co-selection."""
from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
import plotly.graph_objects as go

from routescope.analysis.export import columns as C
from routescope.analysis.runs.views import View
from routescope.analysis.runs.routing import (DEAD_FRACTION, DEAD_PER_OPTION, MANY_OPTIONS, OVERLOAD_FACTOR,
                                              TOO_FEW_FOR_DEAD, option_names)

from routescope.rendering import bar_figures as BF
from routescope.rendering import route_heatmaps as RH
from routescope.rendering import style as ST
from routescope.rendering.draw_context import DrawContext, Drawer, PerLayer, Piece

COSELECTED_TOP = 20  # pairs shown per layer when a layer has many options


def _many(ctx: DrawContext) -> bool:
    return any(len(names) > MANY_OPTIONS for names in ctx.labels.values())


def topk_choice(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    """The first choice per token in its option's colour; with many options none (colours cannot tell
    them apart: `topk_matrix` draws the view of every option's probability instead)."""
    return {} if _many(ctx) else {name: RH.topk_grid(view.frame, ctx.tokens, dict(ctx.labels))}


def topk_matrix(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    """Every option's probability per token, a layer at a time (`PerLayer`: the app sends the picked
    layer's panel, an offline page every layer behind a dropdown)."""
    frame, depth = view.frame, list(ctx.labels)
    return {name: PerLayer(tuple(RH.matrix_layers(frame, depth)),
                           lambda only: RH.expert_matrix_figure(frame, ctx.tokens, ctx.n_prompt, depth, only))}


def utilisation(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    """Bars per layer (model depth order, left to right), one per option in the heatmap's colour and
    with the heatmap's legend names ("expert 0 / block 0")."""
    u = view.frame
    if _many(ctx):  # thousands of bars would carry no meaning: a layer x option heatmap, flags marked
        return {name: utilisation_heatmap(u, ctx.labels)}
    layers = [l for l in ctx.labels if u[C.LAYER].eq(l).any()]  # depth order: the model's routing layers
    layers += [l for l in dict.fromkeys(u[C.LAYER]) if l not in layers]
    names = option_names(dict(ctx.labels), [l for l in layers if l in ctx.labels])
    u = u.assign(**{C.LABEL: [ctx.labels[l][o] for l, o in zip(u[C.LAYER], u[C.OPTION])],
                    "option_name": [names[o] for o in u[C.OPTION]]}).sort_values(C.OPTION, kind="stable")
    colors = {names[o]: ST.PALETTE[o % len(ST.PALETTE)] for o in u[C.OPTION].unique()}  # colour = option, as everywhere
    fig = BF.grouped_bars(u, C.LAYER, C.SHARE, "option_name", "Utilisation: share of tokens selecting each option",
                         y_title="share of tokens", hover=C.LABEL, colors=colors, x_title="routing layer")
    fig.update_xaxes(categoryarray=layers)
    return {name: fig}


def utilisation_heatmap(u: pd.DataFrame, depth: Iterable[str]) -> go.Figure:
    """The layer x option heatmap of one run's `topk_utilisation` frame. ▲ overloaded: over
    OVERLOAD_FACTOR times the layer's mean count; ✕ dead: under DEAD_FRACTION of it, called only in a
    layer whose selections (tokens x k) number DEAD_PER_OPTION per option, enough to reach every one
    (33 tokens x top-8 cannot reach 128 experts: most would read dead); where not, the subtitle says so
    and those layers have no ✕."""
    g = u.groupby(C.LAYER)[C.COUNT]
    mean, picks, n = g.transform("mean"), g.transform("sum"), g.transform("size")
    reached = picks >= DEAD_PER_OPTION * n
    flags = {"dead": reached & (u[C.COUNT] < DEAD_FRACTION * mean), "overloaded": u[C.COUNT] > OVERLOAD_FACTOR * mean}
    title = (f"Utilisation in this run: each option's share of tokens (▲ overloaded: > {OVERLOAD_FACTOR:g}x the mean"
             + (f"; ✕ dead: < {DEAD_FRACTION:.0%} of it)" if reached.any() else ")"))
    note = ""
    if not reached.all():
        where = "" if not reached.any() else f" in {u[~reached][C.LAYER].nunique()} of {u[C.LAYER].nunique()} layers"
        note = (f"{TOO_FEW_FOR_DEAD.capitalize()}{where}: {int(picks[~reached].min()):,} selections for "
                f"{int(n[~reached].max())} options, under {DEAD_PER_OPTION} per option (no ✕ there)")
    return RH.utilisation_heatmap(u, depth, title, C.SHARE, flags, note)


def coselection(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    """Pairs of options a token selected together, with their labels (with many options, the
    COSELECTED_TOP most frequent pairs of each layer: 8,128 pairs a layer at 128 experts)."""
    c = view.frame
    if _many(ctx):
        c = c[c[C.COUNT] > 0].sort_values([C.LAYER, C.COUNT], ascending=[True, False], kind="stable")
        c = c.groupby(C.LAYER, sort=False).head(COSELECTED_TOP)
    return {name: c.assign(label_a=[ctx.labels[l][a] for l, a in zip(c[C.LAYER], c[C.OPTION_A])],
                           label_b=[ctx.labels[l][b] for l, b in zip(c[C.LAYER], c[C.OPTION_B])])}


DRAWERS: dict[str, Drawer] = {"topk_routes": topk_choice, "topk_probs": topk_matrix, "topk_utilisation": utilisation,
           "topk_coselection": coselection}
