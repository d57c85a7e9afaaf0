"""Wiola's drawers: DSFF gates per token, GCLA beta per layer, ATM merges per token."""
from __future__ import annotations

from routescope.analysis.export import columns as C
from routescope.analysis.runs.views import View

from routescope.rendering import bar_figures as BF
from routescope.rendering import route_heatmaps as RH
from routescope.rendering.draw_context import DrawContext, Drawer, Piece


def dsff_gate(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: RH.gate_figure(view.frame, ctx.tokens, ctx.n_prompt)}


def gcla_beta(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    g = view.frame
    return {name: BF.bar_figure(list(g[C.LAYER]), list(g[C.BETA]), "GCLA beta = sigmoid(phi) per layer")}


def atm_merges(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: RH.atm_figure(view.frame, ctx.tokens, view.params["tau"], ctx.n_prompt)}


DRAWERS: dict[str, Drawer] = {"dsff_gate": dsff_gate, "gcla_beta": gcla_beta, "atm_merges": atm_merges}
