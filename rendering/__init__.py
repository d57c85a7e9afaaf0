"""Rendering: plotly figures and HTML (route grids, token charts, corpus and importance pages) that
draw the analysis frames, with no Streamlit in them: the app, the CLI and `rs.figures` use them alike.
Per-token figures: `style` (colours, the token axis), `route_heatmaps`, `bar_figures`."""

from routescope.layout import only_as  # noqa: E402

only_as("routescope.rendering", __name__)
