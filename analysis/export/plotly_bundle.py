"""The plotly.js that offline pages (corpus.html, report.html, exported figures) carry inline.

Every RouteScope figure is cartesian (heatmaps, bars, scatter), so pages embed plotly.js's own
cartesian bundle (1.5 MB; npm `plotly.js-cartesian-dist-min`, MIT, its LICENSE beside it in
`analysis/data/`) instead of the full 4.8 MB bundle plotly.py ships: a 128-expert corpus page stays
within its 5 MB goal. The bundle is the same plotly.js version plotly.py draws for; where plotly.py
is upgraded to another version (or the file does not hash as shipped) pages fall back to the full
bundle, so a page never meets a plotly.js older than its figures."""
from __future__ import annotations

import hashlib
import html
import re
from functools import lru_cache
from pathlib import Path

from plotly.offline import get_plotlyjs, get_plotlyjs_version

VERSION = "4.1.1"
CARTESIAN = Path(__file__).parents[1] / "data" / f"plotly-cartesian-{VERSION}.min.js"
SHA256 = "79542150855a52c567260e3137095dbe2b744e6d702a5cabe67da246942fba7a"


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """The plotly.js source to inline once per page."""
    try:
        data = CARTESIAN.read_bytes()
    except OSError:
        data = b""
    if get_plotlyjs_version() == VERSION and hashlib.sha256(data).hexdigest() == SHA256:
        return data.decode()
    return get_plotlyjs()


def script_tag() -> str:
    return f'<script type="text/javascript">{plotly_js()}</script>'


def plain_text(markup: str) -> str:
    """Plotly's text markup (a figure's title: <br>, <span style=...>, <b>, entities) as plain text,
    for a page's <title>: line breaks become " · ", tags go, entities are read."""
    text = re.sub(r"<br\s*/?>", " · ", markup, flags=re.IGNORECASE)
    return html.unescape(re.sub(r"<[^>]*>", "", text)).strip()


def figure_page(fig, title: str = "") -> str:
    """A standalone offline page of one plotly figure; `title`: plotly markup (the figure's own title),
    shown as plain text in the page's <title>."""
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(plain_text(title))}</title>{script_tag()}'
            f'</head><body>{fig.to_html(full_html=False, include_plotlyjs=False)}</body></html>')
