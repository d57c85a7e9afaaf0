"""The stacked choice heatmaps are built as one plain dict (plotly's property updates were most of a
seed toggle's server-side drawing); here they are checked against the same figure composed the
plotly way, from validated traces and `style`'s own helpers, as the Routing view drew it before."""
from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from routescope.rendering.route_heatmaps import STACK_GAP, ChoiceGrid, stacked_choice_heatmaps, stacked_rows
from routescope.rendering.style import (PALETTE, fixed_margins, heatmap_height, rows_top_down, token_axis,
                                        total_height)


def composed(grids: list[ChoiceGrid], tokens: list[str], n_prompt: int | None) -> go.Figure:
    """The figure through plotly's validated objects and the style helpers, one update at a time."""
    widest = max(grids, key=lambda g: len(g.labels))
    n = max(1, len(widest.labels))
    scale = [stop for j in range(n) for stop in ([j / n, PALETTE[j % len(PALETTE)]],
                                                 [(j + 1) / n, PALETTE[j % len(PALETTE)]])]
    heights = [heatmap_height(len(g.layers)) for g in grids]
    plot_px = sum(heights) + STACK_GAP * (len(grids) - 1)
    traces = [go.Heatmap(z=g.z, x=list(range(len(tokens))), y=g.layers, customdata=g.hover,
                         hovertemplate="%{customdata}<extra></extra>", colorscale=scale, zmin=-0.5, zmax=n - 0.5,
                         xgap=1, ygap=1, showscale=g is widest, xaxis=f"x{row + 1 if row else ''}",
                         yaxis=f"y{row + 1 if row else ''}",
                         colorbar=dict(tickmode="array", tickvals=list(range(len(widest.labels))),
                                       ticktext=widest.labels, title=""))
              for row, g in enumerate(grids)]
    fig = go.Figure(traces, layout=stacked_rows(heights, STACK_GAP / plot_px, [g.title for g in grids]))
    token_axis(fig, tokens, n_prompt, rows=len(grids))
    fig.update_layout(plot_bgcolor="white")
    rows_top_down(fig)
    fixed_margins(fig, [l for g in grids for l in g.layers])
    total_height(fig, plot_px)
    return fig


def _grid(rng, layers: int, T: int, options: int, title: str) -> ChoiceGrid:
    z = rng.integers(0, options, (layers, T)).astype(float)
    z[0, -1] = np.nan  # a position with no choice
    hover = np.array([[f"<b>t{t}</b><br>layer {i}" for t in range(T)] for i in range(layers)], dtype=object)
    return ChoiceGrid(z, hover, [f"block.{i}" for i in range(layers)], [f"option {j}" for j in range(options)], title)


@pytest.mark.parametrize("shape,n_prompt", [((3, 2), 5), ((2, 4, 1), None), ((1, 3), 11), ((6, 6), 0)])
def test_the_dict_built_figure_is_the_composed_one(shape, n_prompt):
    rng = np.random.default_rng(len(shape))
    T = 12
    tokens = [" a very long token indeed", "\n", " "] + [f"w{i}" for i in range(T - 3)]
    grids = [_grid(rng, layers, T, 2 + row, f"row {row}") for row, layers in enumerate(shape)]
    got = json.loads(pio.to_json(stacked_choice_heatmaps(grids, tokens, n_prompt), validate=False))
    want = json.loads(pio.to_json(composed(grids, tokens, n_prompt), validate=False))
    assert got == want


def test_the_figure_takes_later_updates_like_a_validated_one():
    """drawers.run_figures sets the run's meta and the aligned margins on it afterwards."""
    rng = np.random.default_rng(0)
    grids = [_grid(rng, 2, 8, 3, "a"), _grid(rng, 3, 8, 2, "b")]
    fig = stacked_choice_heatmaps(grids, [f"w{i}" for i in range(8)], 4)
    fig.update_layout(meta={"ablation": "drop *:0", "model": "m"}, margin=dict(l=200))
    out = json.loads(fig.to_json())
    assert out["layout"]["meta"] == {"ablation": "drop *:0", "model": "m"} and out["layout"]["margin"]["l"] == 200
    assert fig.layout.xaxis.tickangle == -90 and list(fig.layout.xaxis2.ticktext)[:2] == ["w0", "w1"]
