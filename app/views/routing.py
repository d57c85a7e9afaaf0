"""Routing view: the run's views (`analysis.runs.views`: name -> tidy frame + drawer), drawn by the
drawer table (`components.drawers`) in a loop that never asks which family it is looking at;
`drawn(run, model)` also feeds the Export view. Option labels come from the model's routing layers."""
from __future__ import annotations

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
    """A run's views as the app shows them: figures, tables and the frames' notes (read-only)."""

    figures: dict[str, go.Figure]
    tables: dict[str, pd.DataFrame]
    notes: list[str]
    grids: list[RH.ChoiceGrid]  # the choice heatmaps' data (the route grid paints them before plotly)


def drawn(run: Run, model: RouteScopeLM, *, stacked: bool = False) -> Drawn:
    """Every view of the run drawn. The choice heatmaps (the option picked per layer and token) are
    one figure each, or with `stacked` the rows of one figure `STACKED` when there are several (the
    view draws that; the export tab offers each alone)."""
    pieces = D.run_pieces(run, model)  # drawn once: the figures and the route grid share them
    figs, tables = D.draw_run(run, model, stacked=stacked, pieces=pieces)
    return Drawn(figs, tables, D.notes(run.views), [p for p in pieces.values() if isinstance(p, RH.ChoiceGrid)])


def show(run: Run, d: Drawn) -> Drawn:
    """Draw `d` (`drawn(run, model, stacked=True)`, cached with the run by app.resources)."""
    if not d.figures and not d.tables:
        st.info(f"{run.family} has no routing to show: it is a dense model, or its routing layers record "
                f"nothing this view can draw.")
    elif any(ST.has_divider(fig) for fig in d.figures.values()):
        st.caption(CHARTS_LEGEND + " " + ST.DIVIDER_LEGEND)
    for name, fig in d.figures.items():
        st.plotly_chart(fig, key=f"fig_{name}", width="stretch")
    for name, table in d.tables.items():
        st.caption(name.replace("_", " "))
        st.dataframe(table, key=f"table_{name}", width="stretch")
    for note in d.notes:
        st.caption(note)
    return d
