"""The drawer table: how each kind of view (`analysis.runs.views.View.drawer`) becomes figures.

A drawer takes a view and the run's drawing context and returns its pieces by name, in order:
a `figures.ChoiceGrid` (a discrete choice per layer and token; the Routing view stacks a run's
grids into one chart), a plotly figure, or a DataFrame (shown as a table). The Routing view, the
Export view and `routescope.figures` loop over a run's views and this table; none of them knows a
family: FAMILY_DRAWERS maps each family's views to its drawing module's drawers, and the common
drawers (generic option weights, tables, corpus views) are found by a view's kind. No Streamlit here.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from routescope.core_models import plugins

from routescope.analysis.export import columns as C
from routescope.analysis.corpus.columns import shown_compare, shown_table
from routescope.analysis.runs.views import View

from routescope.rendering import corpus_figures as CF
from routescope.rendering import style as ST
from routescope.rendering import route_heatmaps as RH
from routescope.rendering.draw_context import DrawContext, Drawer, PerLayer, Piece
from routescope.rendering.families import llama, papaformer, pgpt, topk, wiola



def _option_weights(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    """The option with the largest weight per token, and each layer's weights per option."""
    out: dict[str, Piece] = {"option_choice": RH.choice_grid(view.frame, ctx.tokens, dict(ctx.labels))}
    for layer, names in ctx.labels.items():
        if view.frame[C.LAYER].eq(layer).any() and len(names) > 1:
            out[f"option_weights_{layer}"] = RH.option_weights_figure(view.frame, layer, ctx.tokens, ctx.n_prompt)
    return out


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


FAMILY_DRAWERS: Mapping[str, Mapping[str, Drawer]] = MappingProxyType({
    "llama": llama.DRAWERS,
    "papaformer": papaformer.DRAWERS,
    "pgpt": pgpt.DRAWERS,
    "moep": topk.DRAWERS,
    "wiola": wiola.DRAWERS,
    "hf": topk.DRAWERS,
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


def draw_run(run: Any, model: Any, *, stacked: bool = False, pieces: Mapping[str, Piece] | None = None,
             layered: bool = False) -> tuple[dict[str, go.Figure | PerLayer], dict[str, pd.DataFrame]]:
    """The figures and tables of every view of an analysed run, each figure carrying the model and
    ablation it shows in its layout's meta (`pieces`: the run's views already drawn, `run_pieces`).
    `layered`: a per-layer figure stays a `PerLayer` (drawn a layer at a time: `layer_figure`);
    otherwise it is drawn whole, every layer behind a dropdown."""
    toks = run.display_tokens()
    pieces = run_pieces(run, model) if pieces is None else pieces
    figs = run_figures(pieces, stacked=stacked, stacked_name=STACKED, tokens=toks, n_prompt=run.n_prompt,
                       meta=run_meta(run), layered=layered)
    return figs, tables(pieces)


def run_meta(run: Any) -> dict[str, str]:
    """What every figure of a run carries in its layout's meta: which model and ablation it shows."""
    return {"ablation": run.ablation.describe(), "model": run.model_name}


def run_figures(pieces: Mapping[str, Piece], *, stacked: bool, stacked_name: str, tokens: list[str],
                n_prompt: int | None, meta: Mapping[str, Any], layered: bool = False) -> dict[str, go.Figure | PerLayer]:
    """The figures of drawn pieces, in the pieces' order: choice grids one figure each, or with
    `stacked` (and more than one) the rows of one figure `stacked_name`, first; per-layer figures
    whole, or kept as they are with `layered`; tables left out. `meta` (which run a figure shows) is
    kept in every figure's layout."""
    grids = {n: p for n, p in pieces.items() if isinstance(p, RH.ChoiceGrid)}
    figs: dict[str, go.Figure | PerLayer] = {}
    if stacked and len(grids) > 1:
        figs[stacked_name] = RH.stacked_choice_heatmaps(list(grids.values()), tokens, n_prompt)
    else:
        figs.update({n: RH.choice_heatmap(g, tokens, n_prompt) for n, g in grids.items()})
    for n, p in pieces.items():
        if isinstance(p, go.Figure) or (isinstance(p, PerLayer) and layered):
            figs[n] = p
        elif isinstance(p, PerLayer):
            figs[n] = p.whole()
    drawn = [f for f in figs.values() if isinstance(f, go.Figure)]
    ST.align_token_charts(drawn)
    for fig in drawn:
        fig.update_layout(meta=dict(meta))
    return figs


def layer_figure(piece: PerLayer, layer: str, others: Iterable[go.Figure], meta: Mapping[str, Any]) -> go.Figure:
    """One layer of a per-layer figure, its token axis aligned with the run's other token charts
    (`others`, already aligned) and carrying the run's `meta`."""
    fig = piece.one(layer)
    ST.align_token_charts([fig, *others], only=fig)
    fig.update_layout(meta=dict(meta))
    return fig


def tables(pieces: Mapping[str, Piece]) -> dict[str, pd.DataFrame]:
    return {n: p for n, p in pieces.items() if isinstance(p, pd.DataFrame)}
