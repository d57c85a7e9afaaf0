"""What a drawer is: (view name, view, drawing context) -> its pieces by name, each a route grid, a
plotly figure or a table. Shared by the drawer table and the families' drawing modules."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

import pandas as pd
import plotly.graph_objects as go

from routescope.analysis.runs.views import View

from routescope.rendering import route_heatmaps as RH


@dataclass(frozen=True)
class PerLayer:
    """A figure with one panel per routing layer, drawn whole (every layer behind a dropdown: an
    offline page has no server to ask) or one layer at a time (the app sends only the layer its picker
    shows: at 128 experts x 24 layers the whole figure is about a megabyte of JSON, which the browser
    parsed and laid out again on every toggle). `draw(layers)`: the figure of those layers."""

    layers: tuple[str, ...]
    draw: Callable[[Sequence[str]], go.Figure]

    def whole(self) -> go.Figure:
        return self.draw(self.layers)

    def one(self, layer: str) -> go.Figure:
        return self.draw((layer,))


Piece = Union[RH.ChoiceGrid, go.Figure, pd.DataFrame, PerLayer]


@dataclass(frozen=True)
class DrawContext:
    """What every drawer may use besides its view: the tokens shown on the axis (prompt, then
    generated), where the prompt ends, and each routing layer's option labels."""

    tokens: list[str]
    n_prompt: int | None
    labels: Mapping[str, list[str]]


Drawer = Callable[[str, View, DrawContext], dict[str, Piece]]  # (view name, view, context) -> pieces
