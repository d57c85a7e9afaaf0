"""Table 6 view: which path each probe prompt takes per parallel layer, beside the paper's routes."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis import columns as C
from analysis.domain import DEFAULT_PROBES, route_summary, table6

from .. import resources
from .. import state as K
from ..components.messages import show_error


def default_probes() -> tuple[str, bytes]:
    """The paper's Table 6 probes, shipped as package data (analysis/data), named by file name."""
    return DEFAULT_PROBES.name, DEFAULT_PROBES.read_bytes()


def cached_report(model, path: str, mtime: float) -> dict | None:
    """The Table 6 report of the default probes if this session has already computed it."""
    return st.session_state.get(K.TABLE6_RUN, {}).get((path, mtime))


def show(model, path: str, mtime: float) -> dict | None:
    c = model.config
    if c.family != "papaformer":
        st.info("Table 6 routes prompts through PaPaformer parallel paths; pick a PaPaformer checkpoint.")
        return None
    upload = st.file_uploader("Probe file (TSV: prompt_id, domain, expected_path, prompt, optional paper_*)",
                              type=["tsv", "txt"], key=K.PROBES_UPLOAD)
    name, data = (upload.name, upload.getvalue()) if upload is not None else default_probes()
    majority = st.checkbox("Majority route over all prompt tokens (default: the last prompt token)",
                           key=K.TABLE6_MAJORITY)
    try:
        probes, routes, paper = resources.table6_routes(path, mtime, name, data, majority)
    except ValueError as e:  # the message starts with the file's name
        show_error(e, "Probe file ")
        return None
    report = table6(routes, probes, paper)
    combined = c.combiner != "share_linear"
    summary = route_summary(routes, c.n_paths, combined=combined)
    if paper is not None:
        summary = pd.concat([summary, route_summary(paper, 2, combined=combined, source="paper")], ignore_index=True)
    shipped = "" if upload is not None else " (the paper's probes, shipped with RouteScope)"
    st.caption(f"Probes: {name}{shipped}. Routes: 1 = path 1 (stories), 2 = path 2 (math)"
               + (f", {c.n_paths + 1} = combined" if combined else "") + ", one per parallel layer.")
    st.dataframe(report, key="table6_report", width="stretch")
    pivot = summary.pivot_table(index=C.METRIC, columns=C.SOURCE, values=C.VALUE, sort=False)
    st.dataframe(pivot, key="table6_summary")
    result = {"report": report, "summary": summary}
    st.session_state.setdefault(K.TABLE6_RUN, {})[(path, mtime)] = result  # offered again under Export
    return result
