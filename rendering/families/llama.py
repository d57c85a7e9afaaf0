"""PAGMLP's drawers (llama with ffn='pagmlp'): alpha and beta per layer, the SwiGLU pathway's share."""
from __future__ import annotations

from routescope.analysis.export import columns as C
from routescope.analysis.runs.views import View

from routescope.rendering import bar_figures as BF
from routescope.rendering import route_heatmaps as RH
from routescope.rendering.draw_context import DrawContext, Drawer, Piece


def pagmlp_pathways(name: str, view: View, ctx: DrawContext) -> dict[str, Piece]:
    p = view.frame
    s = p.drop_duplicates([C.LAYER, C.OPTION])
    return {
        "pagmlp_scales": BF.grouped_bars(s, C.LAYER, C.SCALE, C.LABEL, "PAGMLP alpha (SwiGLU) and beta (GEGLU)"),
        "pagmlp_share": RH.share_figure(p, ctx.tokens, C.SHARE, 0, "SwiGLU pathway's share of the FFN output norm per token",
                                       lambda r: f"{r.label}: share {r.share:.1%}, |out| {r.out_norm:.3f}", ctx.n_prompt)}


DRAWERS: dict[str, Drawer] = {"pagmlp_pathways": pagmlp_pathways}
