"""Table 6 view: which path each probe prompt takes per parallel layer, beside the paper's routes."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from analysis import columns as C
from analysis.domain import DEFAULT_PROBES, paper_routes, route_summary, table6

from .. import resources
from .. import state as K

SHARED_PROBES = Path(__file__).resolve().parents[3] / "shared" / "probes" / "table6_probes.tsv"


def default_probes() -> tuple[str, str]:
    path = SHARED_PROBES if SHARED_PROBES.is_file() else DEFAULT_PROBES
    return str(path), path.read_text(encoding="utf-8")


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
    name, text = default_probes()
    if upload is not None:
        try:
            name, text = upload.name, upload.getvalue().decode("utf-8")
        except UnicodeDecodeError:
            st.error(f"{upload.name}: not UTF-8 text")
            return None
    majority = st.checkbox("Majority route over all prompt tokens (default: the last prompt token)",
                           key=K.TABLE6_MAJORITY)
    try:
        probes, routes = resources.table6_routes(path, mtime, text, majority)
        paper = paper_routes(probes, c.combiner)
    except ValueError as e:
        st.error(f"Probe file {name}: {e}")
        return None
    report = table6(routes, probes, paper)
    combined = c.combiner != "share_linear"
    summary = route_summary(routes, c.n_paths, combined=combined)
    if paper is not None:
        summary = pd.concat([summary, route_summary(paper, 2, combined=combined, source="paper")], ignore_index=True)
    st.caption(f"Probes: {name}. Routes: 1 = path 1 (stories), 2 = path 2 (math)"
               + (f", {c.n_paths + 1} = combined" if combined else "") + ", one per parallel layer.")
    st.dataframe(report, key="table6_report", width="stretch")
    pivot = summary.pivot_table(index=C.METRIC, columns=C.SOURCE, values=C.VALUE, sort=False)
    st.dataframe(pivot, key="table6_summary")
    result = {"report": report, "summary": summary}
    st.session_state.setdefault(K.TABLE6_RUN, {})[(path, mtime)] = result  # offered again under Export
    return result
