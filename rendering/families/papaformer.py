"""PaPaformer's drawers: the Gumbel router's choice and Share-Linear's cosine-dominant path per token."""
from __future__ import annotations

from routescope.analysis.runs.views import View

from routescope.rendering import route_heatmaps as RH
from routescope.rendering.draw_context import DrawContext, Drawer, Piece


def gumbel_choice(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: RH.gumbel_grid(view.frame, ctx.tokens, dict(ctx.labels))}


def cosine_choice(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    return {name: RH.cosine_grid(view.frame, ctx.tokens, dict(ctx.labels))} if len(view.frame) else {}


DRAWERS: dict[str, Drawer] = {"gumbel_routes": gumbel_choice, "cosine_dominance": cosine_choice}
