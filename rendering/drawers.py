"""The drawer table: how each kind of view (`analysis.runs.families.View.drawer`) becomes figures.

A drawer takes a view and the run's drawing context and returns its pieces by name, in order:
a `figures.ChoiceGrid` (a discrete choice per layer and token; the Routing view stacks a run's
grids into one chart), a plotly figure, or a DataFrame (shown as a table). The Routing view, the
Export view and `routescope.figures` loop over a run's views and this table; none of them knows a
family: FAMILY_DRAWERS maps each family's views to the drawers below, and the common
drawers (generic option weights, tables, corpus views) are found by a view's kind. No Streamlit here.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Union

import pandas as pd
import plotly.graph_objects as go

from routescope.core_models import plugins

from routescope.analysis.export import columns as C
from routescope.analysis.corpus.columns import shown_compare, shown_table
from routescope.analysis.runs.families import View
from routescope.analysis.runs.routing import DEAD_FRACTION, MANY_OPTIONS, OVERLOAD_FACTOR, option_names

from routescope.rendering import corpus_figures as CF
from routescope.rendering import style as ST
from routescope.rendering import route_heatmaps as RH
from routescope.rendering import bar_figures as BF

COSELECTED_TOP = 20  # pairs shown per layer when a layer has many options

Piece = Union[RH.ChoiceGrid, go.Figure, pd.DataFrame]


@dataclass(frozen=True)
class DrawContext:
    """What every drawer may use besides its view: the tokens shown on the axis (prompt, then
    generated), where the prompt ends, and each routing layer's option labels."""

    tokens: list[str]
    n_prompt: int | None
    labels: Mapping[str, list[str]]


Drawer = Callable[[str, View, DrawContext], dict[str, Piece]]  # (view name, view, context) -> pieces


def _option_weights(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    """The option with the largest weight per token, and each layer's weights per option."""
    out: dict[str, Piece] = {"option_choice": RH.choice_grid(view.frame, ctx.tokens, dict(ctx.labels))}
    for layer, names in ctx.labels.items():
        if view.frame[C.LAYER].eq(layer).any() and len(names) > 1:
            out[f"option_weights_{layer}"] = RH.option_weights_figure(view.frame, layer, ctx.tokens, ctx.n_prompt)
    return out


def gumbel_choice(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: RH.gumbel_grid(view.frame, ctx.tokens, dict(ctx.labels))}


def cosine_choice(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: RH.cosine_grid(view.frame, ctx.tokens, dict(ctx.labels))} if len(view.frame) else {}


def _many(ctx: DrawContext) -> bool:
    return any(len(names) > MANY_OPTIONS for names in ctx.labels.values())


def topk_choice(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    """The first choice per token in its option's colour; with many options none (colours cannot tell
    them apart: `topk_matrix` draws the view of every option's probability instead)."""
    return {} if _many(ctx) else {name: RH.topk_grid(view.frame, ctx.tokens, dict(ctx.labels))}


def topk_matrix(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: RH.expert_matrix_figure(view.frame, ctx.tokens, ctx.n_prompt, ctx.labels)}


def utilisation(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    """Bars per layer (model depth order, left to right), one per option in the heatmap's colour and
    with the heatmap's legend names ("expert 0 / block 0")."""
    u = view.frame
    if _many(ctx):  # thousands of bars would carry no meaning: a layer x option heatmap, flags marked
        mean = u.groupby(C.LAYER)[C.COUNT].transform("mean")
        flags = {"dead": u[C.COUNT] < DEAD_FRACTION * mean, "overloaded": u[C.COUNT] > OVERLOAD_FACTOR * mean}
        return {name: RH.utilisation_heatmap(u, ctx.labels, "Utilisation in this run: share of tokens selecting each "
                                            "option (✕ dead: unused, ▲ overloaded: > 2x the mean)", C.SHARE, flags)}
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


def coselection(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    """Pairs of options a token selected together, with their labels (with many options, the
    COSELECTED_TOP most frequent pairs of each layer: 8,128 pairs a layer at 128 experts)."""
    c = view.frame
    if _many(ctx):
        c = c[c[C.COUNT] > 0].sort_values([C.LAYER, C.COUNT], ascending=[True, False], kind="stable")
        c = c.groupby(C.LAYER, sort=False).head(COSELECTED_TOP)
    return {name: c.assign(label_a=[ctx.labels[l][a] for l, a in zip(c[C.LAYER], c[C.OPTION_A])],
                           label_b=[ctx.labels[l][b] for l, b in zip(c[C.LAYER], c[C.OPTION_B])])}


def pgpt_paths(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    p = view.frame
    w = p.drop_duplicates(C.OPTION)
    (layer,) = set(p[C.LAYER])
    names = ctx.labels[layer]
    return {
        "pgpt_weights": BF.bar_figure([names[o] for o in w[C.OPTION]], list(w[C.WEIGHT]),
                                     "Path weights in this call (renormalised over the paths that run)"),
        "pgpt_contribution": RH.share_figure(
            p, ctx.tokens, C.SHARE, 0, f"Per-token contribution of {names[0]} (norm share of the weighted output)",
            lambda r: f"{names[r.option]}: share {r.share:.1%} (w {r.weight:.3f})", ctx.n_prompt)}


def dsff_gate(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: RH.gate_figure(view.frame, ctx.tokens, ctx.n_prompt)}


def gcla_beta(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    g = view.frame
    return {name: BF.bar_figure(list(g[C.LAYER]), list(g[C.BETA]), "GCLA beta = sigmoid(phi) per layer")}


def atm_merges(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: RH.atm_figure(view.frame, ctx.tokens, view.params["tau"], ctx.n_prompt)}


def pagmlp_pathways(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    p = view.frame
    s = p.drop_duplicates([C.LAYER, C.OPTION])
    return {
        "pagmlp_scales": BF.grouped_bars(s, C.LAYER, C.SCALE, C.LABEL, "PAGMLP alpha (SwiGLU) and beta (GEGLU)"),
        "pagmlp_share": RH.share_figure(p, ctx.tokens, C.SHARE, 0, "SwiGLU pathway's share of the FFN output norm per token",
                                       lambda r: f"{r.label}: share {r.share:.1%}, |out| {r.out_norm:.3f}", ctx.n_prompt)}


def _table(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: view.frame}


# --- corpus views (analysis.corpus.run.corpus_views): a figure, then the table it draws ---------------

def _corpus_utilisation(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: CF.utilisation_figure(view.frame), f"{name}_table": shown_table(view.frame)}


def _corpus_label_shares(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    columns = dict.fromkeys(view.frame["label_column"])
    return {**{f"{name}_{c}": CF.label_shares_figure(view.frame, c) for c in columns},
            f"{name}_table": shown_table(view.frame)}


def _corpus_accuracy(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: CF.accuracy_figure(view.frame), f"{name}_table": shown_table(view.frame)}


def _corpus_specialisation(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: shown_table(CF.specialisation_table(view.frame))}


def _corpus_co_routing(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: CF.co_routing_figure(view.frame), f"{name}_table": shown_table(view.frame)}


def _corpus_call_values(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return ({name: CF.call_values_figure(view.frame)} if len(view.frame) else {}) | \
        {f"{name}_table": shown_table(view.frame)}


def _corpus_compare(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    table, names = view.params["table"], tuple(view.params["names"])
    fig = CF.compare_figure(view.frame, table, names)
    return ({name: fig} if fig is not None else {}) | {f"{name}_table": shown_compare(view.frame, table, names)}


DRAWERS: dict[str, Drawer] = {
    "option_weights": _option_weights,
    "table": _table,
    "corpus_utilisation": _corpus_utilisation,
    "corpus_label_shares": _corpus_label_shares,
    "corpus_accuracy": _corpus_accuracy,
    "corpus_specialisation": _corpus_specialisation,
    "corpus_co_routing": _corpus_co_routing,
    "corpus_call_values": _corpus_call_values,
    "corpus_compare": _corpus_compare,
}


TOPK_DRAWERS = {"topk_routes": topk_choice, "topk_probs": topk_matrix, "topk_utilisation": utilisation,
                "topk_coselection": coselection}

# The rendering half of every family: its views' own drawers by view name (views not listed use
# DRAWERS, by the view's kind). Plugins bring theirs in their spec's `drawers`.
FAMILY_DRAWERS: Mapping[str, Mapping[str, Drawer]] = MappingProxyType({
    "llama": {"pagmlp_pathways": pagmlp_pathways},
    "papaformer": {"gumbel_routes": gumbel_choice, "cosine_dominance": cosine_choice},
    "pgpt": {"pgpt_paths": pgpt_paths},
    "moep": TOPK_DRAWERS,
    "wiola": {"dsff_gate": dsff_gate, "gcla_beta": gcla_beta, "atm_merges": atm_merges},
    "hf": TOPK_DRAWERS,
})


def drawers_of(family: str) -> Mapping[str, Drawer]:
    """Family `family`'s own drawers (built in or a plugin's); {} where it has none."""
    if family in FAMILY_DRAWERS:
        return FAMILY_DRAWERS[family]
    return plugins.part(family, "drawers", None) or {}


def draw(views: Mapping[str, View], ctx: DrawContext, family: Mapping[str, Drawer] = {}) -> dict[str, Piece]:
    """Every piece of every view, in view order: a view's drawer is the family's for its name
    (`FamilySpec.drawers`), else the common one of its kind. A view with neither is an error that
    names it."""
    out: dict[str, Piece] = {}
    for name, view in views.items():
        drawer = family.get(name) or DRAWERS.get(view.drawer)
        if drawer is None:
            raise ValueError(f"view {name!r}: no drawer in its family's spec and no common drawer {view.drawer!r} "
                             f"(common drawers: {', '.join(DRAWERS)})")
        out.update(drawer(name, view, ctx))
    return out


def notes(views: Mapping[str, View]) -> list[str]:
    """What the views' frames say about themselves (e.g. a layer whose cosine is undefined)."""
    return [n for v in views.values() for n in v.frame.attrs.get("notes", [])]


STACKED = "routes"  # the name of a run's stacked choice heatmaps


def run_pieces(run: Any, model: Any) -> dict[str, Piece]:
    """Every view of an analysed run (`analysis.runs.session.Run`) drawn once."""
    return draw(run.views, DrawContext(run.display_tokens(), run.n_prompt, model.option_labels()),
                drawers_of(model.config.family))


def draw_run(run: Any, model: Any, *, stacked: bool = False, pieces: Mapping[str, Piece] | None = None
             ) -> tuple[dict[str, go.Figure], dict[str, pd.DataFrame]]:
    """The figures and tables of every view of an analysed run, each figure carrying the model and
    ablation it shows in its layout's meta (`pieces`: the run's views already drawn, `run_pieces`)."""
    toks = run.display_tokens()
    pieces = run_pieces(run, model) if pieces is None else pieces
    figs = run_figures(pieces, stacked=stacked, stacked_name=STACKED, tokens=toks, n_prompt=run.n_prompt,
                       meta={"ablation": run.ablation.describe(), "model": run.model_name})
    return figs, tables(pieces)


def run_figures(pieces: Mapping[str, Piece], *, stacked: bool, stacked_name: str, tokens: list[str],
                n_prompt: int | None, meta: Mapping[str, Any]) -> dict[str, go.Figure]:
    """The figures of drawn pieces: choice grids one figure each, or with `stacked` (and more than
    one) the rows of one figure `stacked_name`; tables left out. `meta` (which run a figure shows)
    is kept in every figure's layout."""
    grids = {n: p for n, p in pieces.items() if isinstance(p, RH.ChoiceGrid)}
    figs: dict[str, go.Figure] = {}
    if stacked and len(grids) > 1:
        figs[stacked_name] = RH.stacked_choice_heatmaps(list(grids.values()), tokens, n_prompt)
    else:
        figs.update({n: RH.choice_heatmap(g, tokens, n_prompt) for n, g in grids.items()})
    figs.update({n: p for n, p in pieces.items() if isinstance(p, go.Figure)})
    ST.align_token_charts(figs.values())
    for fig in figs.values():
        fig.update_layout(meta=dict(meta))
    return figs


def tables(pieces: Mapping[str, Piece]) -> dict[str, pd.DataFrame]:
    return {n: p for n, p in pieces.items() if isinstance(p, pd.DataFrame)}
