"""Table 6 view: which path each probe prompt takes per parallel layer, beside the paper's routes."""
from __future__ import annotations

import streamlit as st

from routescope.analysis import columns as C
from routescope.analysis.domain import DEFAULT_PROBES, require_table6, table6, table6_summary
from routescope.core_models.base import RouteScopeLM

from .. import resources
from .. import state as K
from ..components.messages import show_error


def default_probes() -> tuple[str, bytes]:
    """The paper's Table 6 probes, shipped as package data (analysis/data), named by file name."""
    return DEFAULT_PROBES.name, DEFAULT_PROBES.read_bytes()


def _applies(model: RouteScopeLM) -> bool:
    try:
        require_table6(model)
        return True
    except ValueError:
        return False


def _report(model: RouteScopeLM, path: str, mtime: float, name: str, data: bytes, majority: bool) -> dict:
    """{"report": one row per probe, "summary": route shares and accuracy (ours, and the paper's)}."""
    probes, routes, paper = resources.table6_routes(path, mtime, name, data, majority)
    return {"report": table6(routes, probes, paper), "summary": table6_summary(model.config, ours=routes, paper=paper)}


def default_report(model: RouteScopeLM, path: str, mtime: float) -> dict | None:
    """The Table 6 report for the Export view: of the probes and mode the Table 6 view last showed
    for this checkpoint, else of the shipped probes at the last prompt token (computed here, so the
    Table 6 view need not be opened first; the routes are cached)."""
    if not _applies(model):
        return None
    shown = st.session_state.get(K.TABLE6_SHOWN, {}).get((path, mtime))
    try:
        return _report(model, path, mtime, *(shown or (*default_probes(), False)))
    except ValueError:  # a bad uploaded file: the Table 6 view shows why; the export offers no report
        return None


def show(model: RouteScopeLM, path: str, mtime: float) -> dict | None:
    c = model.config
    if not _applies(model):
        st.info("Table 6 routes prompts through PaPaformer parallel paths; pick a PaPaformer checkpoint.")
        return None
    upload = st.file_uploader("Probe file (TSV: prompt_id, domain, expected_path, prompt, optional paper_*)",
                              type=["tsv", "txt"], key=K.PROBES_UPLOAD)
    name, data = (upload.name, upload.getvalue()) if upload is not None else default_probes()
    majority = st.checkbox("Majority route over all prompt tokens (default: the last prompt token)",
                           key=K.TABLE6_MAJORITY)
    try:
        result = _report(model, path, mtime, name, data, majority)
    except ValueError as e:  # the message starts with the file's name
        show_error(e, "Probe file ")
        return None
    st.session_state.setdefault(K.TABLE6_SHOWN, {})[(path, mtime)] = (name, data, majority)  # for Export
    shipped = "" if upload is not None else " (the paper's probes, shipped with RouteScope)"
    combined = c.has_combined_route
    st.caption(f"Probes: {name}{shipped}. Routes are numbered as the paper's Table 6 numbers them, from 1: "
               "route 1 = path 0 (stories), route 2 = path 1 (math)"
               + (f", route {c.n_paths + 1} = combined" if combined else "")
               + "; one route per parallel layer.")
    st.dataframe(result["report"], key="table6_report", width="stretch")
    pivot = result["summary"].pivot_table(index=C.METRIC, columns=C.SOURCE, values=C.VALUE, sort=False)
    st.dataframe(pivot, key="table6_summary")
    return result
