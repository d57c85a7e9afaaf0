"""ParallelGPT's drawers: the learned path weights and each path's per-token contribution."""
from __future__ import annotations

from routescope.analysis.export import columns as C
from routescope.analysis.runs.views import View

from routescope.rendering import bar_figures as BF
from routescope.rendering import route_heatmaps as RH
from routescope.rendering.draw_context import DrawContext, Drawer, Piece


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


DRAWERS: dict[str, Drawer] = {"pgpt_paths": pgpt_paths}
