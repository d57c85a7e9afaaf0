"""What an AppTest page draws, read from its plotly chart elements' specs."""
from __future__ import annotations

import json


def heatmap_titles(at) -> list[str]:
    """Titles of the heatmaps on the page: a stacked chart's subplot titles, else each chart's title."""
    titles = []
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        if any(t["type"] == "heatmap" for t in spec["data"]):
            sub = [a["text"] for a in spec["layout"].get("annotations", []) if a.get("xref") == "paper"]
            titles += sub or [spec["layout"]["title"]["text"]]
    return titles
