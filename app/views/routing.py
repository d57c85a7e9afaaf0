"""Routing view: the run's views (`analysis.runs.views`: name -> tidy frame + drawer), drawn by the
drawer table (`components.drawers`) in a loop that never asks which family it is looking at;
`drawn(run, model)` also feeds the Export view. Option labels come from the model's routing layers."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from routescope.analysis.runs.session import Run
from routescope.core_models.base import RouteScopeLM

from routescope.rendering import drawers as D
from routescope.rendering import style as ST
from routescope.rendering import route_heatmaps as RH

STACKED = D.STACKED
CHARTS_LEGEND = ("Interactive charts: drag to pan along the tokens, double-click for all of them, hover for the "
                 "values, the camera icon saves a PNG (the Export view has each as an offline HTML page).")  # the name of the stacked choice heatmaps (drawn(..., stacked=True))


@dataclass(frozen=True)
class Drawn:
    """A run's views as the app shows them: figures (or per-layer figures, a layer at a time), tables
    and the frames' notes (read-only)."""

    figures: dict[str, go.Figure | D.PerLayer]
    tables: dict[str, pd.DataFrame]
    notes: list[str]
    grids: list[RH.ChoiceGrid]  # the choice heatmaps' data (the route grid paints them before plotly)
    meta: dict[str, str]  # which run the figures show (every figure's layout.meta)

    def whole(self) -> dict[str, go.Figure]:
        """Every figure drawn whole (per-layer figures with their layer dropdown)."""
        return {n: f.whole() if isinstance(f, D.PerLayer) else f for n, f in self.figures.items()}


def drawn(run: Run, model: RouteScopeLM, *, stacked: bool = False, layered: bool = False) -> Drawn:
    """Every view of the run drawn. The choice heatmaps (the option picked per layer and token) are
    one figure each, or with `stacked` the rows of one figure `STACKED` when there are several (the
    view draws that; the export tab offers each alone). `layered`: per-layer figures stay `PerLayer`
    (`show` draws the picked layer alone)."""
    pieces = D.run_pieces(run, model)  # drawn once: the figures and the route grid share them
    figs, tables = D.draw_run(run, model, stacked=stacked, pieces=pieces, layered=layered)
    return Drawn(figs, tables, D.notes(run.views), [p for p in pieces.values() if isinstance(p, RH.ChoiceGrid)],
                 D.run_meta(run))


def show(run: Run, d: Drawn, layer_key: str | None = None, on_layer: Callable[..., None] | None = None,
         on_layer_args: tuple = ()) -> Drawn:
    """Draw `d` (`drawn(run, model, stacked=True, layered=True)`, cached with the run by app.resources).
    A per-layer figure gets a layer picker above it (state under `layer_key`, `on_layer(*on_layer_args)`
    called when it changes) and only the picked layer's panel goes to the browser."""
    if not d.figures and not d.tables:
        st.info(f"{run.family} has no routing to show: it is a dense model, or its routing layers record "
                f"nothing this view can draw.")
    elif any(isinstance(fig, go.Figure) and ST.has_divider(fig) for fig in d.figures.values()):
        st.caption(CHARTS_LEGEND + " " + ST.DIVIDER_LEGEND)
    drawn_figs = [f for f in d.figures.values() if isinstance(f, go.Figure)]
    layered = [n for n, f in d.figures.items() if isinstance(f, D.PerLayer)]
    for name, fig in d.figures.items():
        if isinstance(fig, D.PerLayer):  # the first follows `layer_key`; any other has a picker of its own
            key = layer_key if layer_key and name == layered[0] else f"layer_{name}"
            if st.session_state.get(key) not in fig.layers:
                st.session_state[key] = fig.layers[0]
            order = {l: i for i, l in enumerate(fig.layers)}
            follows = key == layer_key
            layer = st.selectbox("Layer", fig.layers, key=key, on_change=on_layer if follows else None,
                                 args=on_layer_args if follows else None,
                                 format_func=lambda l: f"{order[l]} · {l}",
                                 help="The layer this figure shows (the Export view's page has every layer)")
            fig = D.layer_figure(fig, layer, drawn_figs, d.meta)
        st.plotly_chart(fig, key=f"fig_{name}", width="stretch")
    for name, table in d.tables.items():
        st.caption(name.replace("_", " "))
        st.dataframe(table, key=f"table_{name}", width="stretch")
    for note in d.notes:
        st.caption(note)
    return d
