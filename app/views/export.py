"""Export: routing table (CSV, Parquet), generation with candidates, the family pages' tables, figures,
provenance.

Every download button has on_click="ignore": a download does not rerun the app. A rerun would give
each deferred (figure) download a new id and revoke the old one, so a second click while the rerun
of the first was still in flight asked for a file Streamlit had already dropped
(`MediaFileStorageError: Deferred file ... not found`) and the browser got nothing.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

import plotly.graph_objects as go
import streamlit as st

from routescope.analysis.export.csv_format import frame_csv_bytes
from routescope.analysis.export.plotly_bundle import figure_page
from routescope.analysis.runs.session import Run, candidates_table, provenance

from routescope.rendering.style import titled_for_export


def _stem(run: Run) -> str:
    ab = re.sub(r"[^A-Za-z0-9_.-]+", "_", run.ablation.describe())
    return f"{run.model_name}_{'base' if run.ablation.is_empty else ab}"


def figure_html(fig: go.Figure) -> str:
    """A standalone HTML page of the figure with plotly.js inline (the 1.5 MB cartesian bundle:
    `analysis.export.plotly_bundle`), so it opens offline."""
    return figure_page(fig, str(fig.layout.title.text or ""))


def _offer(col: Any, label: str, data: bytes | str | Callable[[], str], file_name: str, mime: str, key: str) -> None:
    col.download_button(label, data, file_name, mime, key=key, on_click="ignore")


def show(run: Run, tokenizer, drawn: Any, extra: dict[str, Any], table: dict[str, bytes]) -> None:
    """`drawn`: the run's views drawn (`routing.drawn`); `extra`: the tables of the family's own
    pages (`app.pages.Page.tables`), label -> (file
    name part, frame)."""
    stem = _stem(run)
    st.caption("Every export carries the model, prompt, settings and ablation (columns, or the run JSON).")
    cols = st.columns(3)
    _offer(cols[0], "Routing table (CSV)", table["csv"], f"{stem}_routing.csv", "text/csv", "dl_routing_csv")
    _offer(cols[1], "Routing table (Parquet)", table["parquet"], f"{stem}_routing.parquet",
           "application/octet-stream", "dl_routing_parquet")
    _offer(cols[2], "Run settings (JSON)", json.dumps(provenance(run), indent=1, ensure_ascii=False),
           f"{stem}_run.json", "application/json", "dl_run_json")
    cand = candidates_table(run, tokenizer)
    for k, v in provenance(run).items():
        cand[k] = v if not isinstance(v, dict) else json.dumps(v)
    cols = st.columns(3)
    _offer(cols[0], "Generation with top-k (CSV)", frame_csv_bytes(cand), f"{stem}_generation.csv", "text/csv",
           "dl_generation_csv")
    for i, (label, (name, frame)) in enumerate(extra.items(), start=1):
        _offer(cols[i % 3], f"{label} (CSV)", frame_csv_bytes(frame.assign(model=run.model_name)),
               f"{stem}_{name}.csv", "text/csv", f"dl_{name}_csv")
    views = {name: v.frame for name, v in run.views.items()}
    if views:  # every view's own table, as the drawers read it
        st.markdown("**View tables** (CSV, one per routing view of this run)")
        cols = st.columns(3)
        for i, (name, frame) in enumerate(views.items()):
            frame = frame.assign(model=run.model_name, ablation=run.ablation.describe())
            _offer(cols[i % 3], f"{name}.csv", lambda f=frame: frame_csv_bytes(f), f"{stem}_{name}.csv", "text/csv",
                   f"dl_view_{name}")
    if drawn.figures:
        st.markdown("**Figures** (HTML with plotly.js inside, works offline; PNG from the camera icon on each chart)")
        cols = st.columns(3)
        for i, (name, fig) in enumerate(drawn.figures.items()):
            # the page names the model and ablation in its visible title, and carries the run in its meta
            fig = titled_for_export(fig, run.model_name, run.ablation.describe()).update_layout(meta=provenance(run))
            # deferred: the ~1.6 MB page is only rendered when the button is pressed
            _offer(cols[i % 3], f"{name}.html", lambda f=fig: figure_html(f), f"{stem}_{name}.html", "text/html",
                   f"dl_fig_{name}")
