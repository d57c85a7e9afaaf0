"""The HTML of `routescope report`'s own sections (probe accuracy, dropped options) from the
report's data (`analysis.reports.report.ReportData`); the rest of the page is the corpus view's."""
from __future__ import annotations

import math
from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from routescope.analysis.corpus.page import html_table
from routescope.analysis.export import columns as C
from routescope.analysis.export.html_safe import text
from routescope.analysis.reports.report import DELTA, PROBE_SET, ROUTE_AT_COL, ReportData, accuracy_wide
from routescope.analysis.runs import family_table as FT

PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2"]


def _accuracy_figure(data: ReportData):
    wide = accuracy_wide(data.accuracy)
    fig = go.Figure()
    for src, g in wide.groupby(C.SOURCE, sort=False):
        fig.add_trace(go.Bar(x=[f"{p}, {a}" for p, a in zip(g[PROBE_SET], g[ROUTE_AT_COL])], y=g["accuracy"],
                             name=src))
    fig.update_layout(barmode="group", height=320, yaxis_tickformat=".0%", yaxis_range=[0, 1],
                      title="Routing accuracy (routes equal to the probe's expected path)")
    return fig


def _drops_figure(data: ReportData):
    fig = go.Figure()
    for k, (dom, g) in enumerate(data.drops.groupby(C.DOMAIN, sort=False)):
        fig.add_trace(go.Bar(x=[f"drop {l}" for l in g[C.LABEL]], y=g[DELTA], name=dom,
                             marker_color=PALETTE[k % len(PALETTE)]))
    fig.update_layout(barmode="group", height=320, title="Validation loss change when an option is dropped (nats)")
    return fig


def _pct(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    return df.assign(**{c: [f"{v:.1%}" if isinstance(v, float) and not math.isnan(v) else "" for v in df[c]]
                        for c in cols})


def extra_sections(data: ReportData) -> list[tuple[str, str, str]]:
    """(id, heading, HTML) of the report's own sections: probe accuracy and dropped options. Figures
    carry no plotly.js (the page has it once, with its first figure)."""
    esc = text
    out = []
    if len(data.accuracy):
        wide = accuracy_wide(data.accuracy)
        pct = [c for c in wide.columns if c not in (PROBE_SET, ROUTE_AT_COL, C.SOURCE, "n_routes")]
        body = (f"<p>{esc(data.probe_note)}</p>" + _accuracy_figure(data).to_html(
                    full_html=False, include_plotlyjs=False, div_id="fig-probe-accuracy")
                + html_table(_pct(wide, pct))
                + "".join(f"<h3>{esc(k)}</h3>{html_table(v)}" for k, v in data.probe_tables.items()))
        heading = f"Routing accuracy: {' and '.join(data.probe_sets)} probes"
    else:
        having = ", ".join(FT.probe_tables())
        body = (f"<p>Not applicable: the {esc(str(data.config.get('family')))} paper prints no expected route per "
                f"probe prompt to compare with (families whose papers do: {esc(having)}).</p>")
        heading = "Routing accuracy on probe prompts"
    out.append(("probes", heading, body))
    if len(data.drops):
        n_tok = ", ".join(f"{d} {n:,}" for d, n in data.settings["n_tokens"].items())
        body = (f"<p>Validation loss per domain with the option dropped in every routing layer, the unablated loss, "
                f"the change, and the mean KL(base || dropped) of the next-token distributions (nats), on the "
                f"trainer's validation text: the first {data.settings['n_docs']} documents of each domain in rows of "
                f"{data.settings['seq_len']} tokens ({esc(n_tok)} tokens).</p>"
                + _drops_figure(data).to_html(full_html=False, include_plotlyjs=False, div_id="fig-drops")
                + html_table(data.drops))
    else:
        body = f"<p>{esc(data.corpus.family)} has no routing layers whose options can be dropped.</p>"
    out.append(("drops", "Dropping each option", body))
    return out
