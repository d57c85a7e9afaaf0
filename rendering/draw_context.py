"""What a drawer is: (view name, view, drawing context) -> its pieces by name, each a route grid, a
plotly figure or a table. Shared by the drawer table and the families' drawing modules."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Union

import pandas as pd
import plotly.graph_objects as go

from routescope.analysis.runs.views import View

from routescope.rendering import route_heatmaps as RH

Piece = Union[RH.ChoiceGrid, go.Figure, pd.DataFrame]


@dataclass(frozen=True)
class DrawContext:
    """What every drawer may use besides its view: the tokens shown on the axis (prompt, then
    generated), where the prompt ends, and each routing layer's option labels."""

    tokens: list[str]
    n_prompt: int | None
    labels: Mapping[str, list[str]]


Drawer = Callable[[str, View, DrawContext], dict[str, Piece]]  # (view name, view, context) -> pieces
