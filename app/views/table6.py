"""Table 6 view: which path each probe prompt takes per parallel layer, beside the paper's routes.

A routing experiment like the rest of the explorer: the probes run under the ablation switched on
at the left (a dropped path is never a route), which the view's header names and every row of its
CSV carries (column `ablation`); the paper's routes beside them are the paper's, unablated."""
from __future__ import annotations

import io

import streamlit as st

from routescope.analysis.export import columns as C
from routescope.analysis.runs.domain import (DEFAULT_PROBES, paper_routes, probe_routes, read_probes, require_table6,
                                        table6, table6_summary)
from routescope.core_models.ablation import Ablation
from routescope.core_models.base import RouteScopeLM

from routescope.app import resources
from routescope.app import state as K
from routescope.app.messages import show_error

MAJORITY = "table6_majority"  # widget key
SHOWN = "table6_shown"  # {(path, mtime): (probe file name, bytes, majority)} the view last showed (for Export)


def default_probes() -> tuple[str, bytes]:
    """The paper's Table 6 probes, shipped as package data (analysis/data), named by file name."""
    return DEFAULT_PROBES.name, DEFAULT_PROBES.read_bytes()


def _applies(model: RouteScopeLM) -> bool:
    try:
        require_table6(model)
        return True
    except ValueError:
        return False


@st.cache_resource(max_entries=32, show_spinner="Routing the probe prompts…")
def probe_table_routes(path: str, mtime: float, probes_name: str, probes_tsv: bytes, majority: bool,
                       ablation: Ablation = Ablation()):
    """(probes, our routes under `ablation`, the paper's routes or None) of a probe file's bytes.
    Every ValueError starts with `probes_name` (the file name the user knows, not a stream or a
    server path)."""
    model, tok = resources.load(path, mtime)
    source = io.BytesIO(probes_tsv)
    source.name = probes_name  # how read_probes names the file in its messages
    probes = read_probes(source)
    try:  # the ablation was checked by the run the view belongs to
        return (probes, probe_routes(model, tok, probes, majority=majority, ablation=ablation),
                paper_routes(probes, model.config.combiner))
    except ValueError as e:
        raise ValueError(f"{probes_name}: {e}") from None


def _report(model: RouteScopeLM, path: str, mtime: float, name: str, data: bytes, majority: bool,
            ablation: Ablation) -> dict:
    """{"report": one row per probe, "summary": route shares and accuracy (ours under `ablation`, and
    the paper's)}; both carry the ablation of our routes (column `ablation`)."""
    probes, routes, paper = probe_table_routes(path, mtime, name, data, majority, ablation)
    summary = table6_summary(model.config, ours=routes, paper=paper)
    summary[C.ABLATION] = [ablation.describe() if s == "ours" else "none (the paper's routes)"
                           for s in summary[C.SOURCE]]
    return {"report": table6(routes, probes, paper, ablation=ablation), "summary": summary}


def heading(ablation: Ablation, described: str) -> str:
    """What the view's header says about the ablation the probes ran under."""
    return ("Table 6 routes, no ablation" if ablation.is_empty
            else f"Table 6 routes under the ablation {described}")


def default_report(model: RouteScopeLM, path: str, mtime: float, ablation: Ablation = Ablation()) -> dict | None:
    """The Table 6 report for the Export view: of the probes and mode the Table 6 view last showed
    for this checkpoint, else of the shipped probes at the last prompt token (computed here, so the
    Table 6 view need not be opened first; the routes are cached)."""
    if not _applies(model):
        return None
    shown = st.session_state.get(SHOWN, {}).get((path, mtime))
    try:
        return _report(model, path, mtime, *(shown or (*default_probes(), False)), ablation)
    except ValueError:  # a bad uploaded file: the Table 6 view shows why; the export offers no report
        return None


def show(model: RouteScopeLM, path: str, mtime: float, ablation: Ablation = Ablation(),
         described: str = "") -> dict | None:
    """`ablation`: the one switched on at the left (`described`: it in words, for the header)."""
    c = model.config
    if not _applies(model):
        st.info("Table 6 routes prompts through PaPaformer parallel paths; pick a PaPaformer checkpoint.")
        return None
    upload = st.file_uploader("Probe file (TSV: prompt_id, domain, expected_path, prompt, optional paper_*)",
                              type=["tsv", "txt"], key=K.PROBES_UPLOAD)
    name, data = (upload.name, upload.getvalue()) if upload is not None else default_probes()
    majority = st.checkbox("Majority route over all prompt tokens (default: the last prompt token)",
                           key=MAJORITY)
    st.markdown(f"**{heading(ablation, described or ablation.describe())}**")
    try:
        result = _report(model, path, mtime, name, data, majority, ablation)
    except ValueError as e:  # the message starts with the file's name
        show_error(e, "Probe file ")
        return None
    st.session_state.setdefault(SHOWN, {})[(path, mtime)] = (name, data, majority)  # for Export
    shipped = "" if upload is not None else " (the paper's probes, shipped with RouteScope)"
    combined = c.has_combined_route
    st.caption(f"Probes: {name}{shipped}. Routes are numbered as the paper's Table 6 numbers them, from 1: "
               "route 1 = path 0 (stories), route 2 = path 1 (math)"
               + (f", route {c.n_paths + 1} = combined" if combined else "")
               + "; one route per parallel layer. "
               + ("The probes run under the ablation at the left (a dropped path is never a route); "
                  "the paper's routes are unablated." if not ablation.is_empty else
                  "Switch a path off at the left and the probes run without it."))
    st.dataframe(result["report"], key="table6_report", width="stretch")
    pivot = result["summary"].pivot_table(index=C.METRIC, columns=C.SOURCE, values=C.VALUE, sort=False)
    st.dataframe(pivot, key="table6_summary")
    return result
