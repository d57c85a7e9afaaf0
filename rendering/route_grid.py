"""A run's choice heatmaps (`figures.ChoiceGrid`: the option picked per layer and token) as one HTML
grid, no plotly.js needed: it paints with the page's first data, while the interactive chart below
it waits for the browser to load and start plotly.js (about 4.7 MB; 1-2 s of a page opening on this
machine). Colours are the options' (`figures.PALETTE`), every cell's details on hover. `CSS` is
shown once at the top of the page (app/main.py), so the grid's markup carries none."""
from __future__ import annotations

import html
import math
import re

from routescope.analysis.export.html_safe import text

from routescope.rendering.style import PALETTE, show_token
from routescope.rendering.route_heatmaps import ChoiceGrid

# Streamlit's Markdown styles tables: these rules override them (!important) inside .rs-grid only
CSS = """<style>
.rs-grid-wrap {overflow-x: auto; margin: 0.2rem 0 0.6rem 0;}
table.rs-grid {border-collapse: separate !important; border-spacing: 1px; font-size: 11px; width: auto !important;
  margin: 0 !important; border: none !important;}
.rs-grid tr, .rs-grid th, .rs-grid td {border: none !important; background: transparent;}
.rs-grid th.rs-layer {text-align: right; padding: 0 6px 0 0 !important; white-space: nowrap; font-weight: 500;
  color: #1F2D3D;}
.rs-grid th.rs-col {writing-mode: vertical-rl; transform: rotate(180deg); font-weight: 400; color: #444;
  max-height: 7.5em; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; padding: 2px 0 !important;
  line-height: 12px;}
.rs-grid th.rs-gen-col {color: #1F5AA6;}
.rs-grid td {width: 12px; min-width: 12px; height: 15px; padding: 0 !important; border-radius: 2px; cursor: help;}
.rs-grid .rs-first-gen {border-left: 2px dotted #444 !important;}
.rs-grid tr.rs-title th {text-align: left; font-weight: 600; padding: 6px 0 0 0 !important; color: #1F2D3D;}
.rs-legend {font-size: 12px; color: #444;}
.rs-swatch {display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin: 0 4px 0 10px;
  vertical-align: -1px;}
</style>"""
_TAG = re.compile(r"<[^>]+>")


def _attr(text: str) -> str:
    """Text as an attribute value: escaped, line breaks as character references (a raw newline
    inside an attribute would end the block when Streamlit reads the page as Markdown)."""
    return html.escape(text, quote=True).replace("\r", "").replace("\n", "&#10;")


def _plain(hover: str) -> str:
    """Plotly hover text (<b>, <br>) as a tooltip's plain text."""
    return html.unescape(_TAG.sub("", hover.replace("<br>", "\n")))


def route_grid_html(grids: list[ChoiceGrid], tokens: list[str], n_prompt: int | None = None) -> str:
    """One table: a header row of the tokens, then per grid its title and a row per layer whose cells
    are coloured by the option picked there (white: none); empty when there is no grid."""
    if not grids:
        return ""
    widest = max(grids, key=lambda g: len(g.labels))
    first_gen = n_prompt if n_prompt is not None and 0 < n_prompt < len(tokens) else None
    edge = lambda t: " rs-first-gen" if t == first_gen else ""  # noqa: E731  (the dotted prompt | generated line)
    head = "".join(f'<th class="rs-col{" rs-gen-col" if n_prompt is not None and t >= n_prompt else ""}{edge(t)}" '
                   f'title="{_attr(f"position {t}: {show_token(tok)}")}">'
                   f"{text(show_token(tok)[:12])}</th>" for t, tok in enumerate(tokens))
    rows = [f'<tr><th></th>{head}</tr>']
    for g in grids:
        rows.append(f'<tr class="rs-title"><th colspan="{len(tokens) + 1}">{text(g.title)}</th></tr>')
        for i, layer in enumerate(g.layers):
            cells = []
            for t in range(len(tokens)):
                z = g.z[i, t] if t < g.z.shape[1] else math.nan
                colour = "#FFFFFF" if z != z else PALETTE[int(z) % len(PALETTE)]
                tip = _attr(_plain(str(g.hover[i, t])) if t < g.hover.shape[1] else "")
                cls = ' class="rs-first-gen"' if t == first_gen else ""
                cells.append(f'<td{cls} style="background:{colour}" title="{tip}"></td>')
            rows.append(f'<tr><th class="rs-layer">{text(layer)}</th>{"".join(cells)}</tr>')
    legend = "".join(f'<span class="rs-swatch" style="background:{PALETTE[j % len(PALETTE)]}"></span>'
                     f"{text(label)}" for j, label in enumerate(widest.labels))
    return (f'<div class="rs-grid-wrap"><table class="rs-grid">{"".join(rows)}</table></div>'
            f'<div class="rs-legend">{GRID_LEGEND} {legend}</div>')


GRID_LEGEND = ("Routes at a glance: every token in one table, painted as soon as the page opens (hover a cell for "
               "its details; blue column heads and the dotted line: the generated tokens start there). The "
               "interactive chart below has the same routes, to zoom, pan and save as a picture.")
