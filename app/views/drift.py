"""Drift view: routing drift over one training run's checkpoints (`analysis.drift`). Layout only: the
run routes the dataset through every checkpoint as a background job (progress per checkpoint) shared
by every session and cached by (checkpoints and their weights' times, dataset digest, settings). The
figures are the CLI page's (`rendering.drift_figures`). It reads no prompt and no model of the sidebar:
it opens on the shipped run checkpoints/olmoe-tiny-steps where that is present."""
from __future__ import annotations

import threading
from pathlib import Path

import streamlit as st

from routescope.analysis import drift as DR
from routescope.analysis.corpus import shipped as SH
from routescope.analysis.corpus.page import frame_bytes
from routescope.analysis.corpus.run import CorpusJobs
from routescope.analysis.inputs import datasets as D
from routescope.analysis.runs.catalog import DEFAULT_ROOT
from routescope.app import corpus_resources as CR
from routescope.app.messages import show_error
from routescope.rendering.drift_figures import SECTIONS, changed_most, page, saturation, specialisation, utilisation

SHIPPED_RUN = DEFAULT_ROOT / "olmoe-tiny-steps"
DEFAULT_DATASET = "validation split: story + math"
POLL_SECONDS = 0.5
# widget keys (this view's own: no other view reads them)
RUN, SOURCE, SHIPPED, PATH, MAX_TOKENS, GO, LAYER, CANCEL = ("drift_run", "drift_source", "drift_shipped",
                                                             "drift_path", "drift_max_tokens", "drift_go",
                                                             "drift_layer", "drift_cancel")
SHIPPED_SOURCE, SERVER = "Shipped dataset", "File on the server"


@st.cache_resource(show_spinner=False)
def jobs() -> CorpusJobs:
    return CorpusJobs(keep=4)


@st.cache_resource(show_spinner=False)
def stops() -> dict:
    return {}  # job key -> threading.Event (cancel), shared by the sessions


def _stamp(path: Path) -> float:
    return max((f.stat().st_mtime for f in path.iterdir() if f.is_file()), default=0.0) if path.is_dir() else 0.0


def _checkpoints() -> list[Path] | None:
    default = str(SHIPPED_RUN) if SHIPPED_RUN.is_dir() else ""
    text = st.text_area("Checkpoints of one run", value=default, key=RUN, height=80,
                        help="One checkpoint directory a line, in the run's order, or a run directory (its "
                             "checkpoints in step order, as `routescope train --snapshots` writes them).")
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    if not lines:
        st.info("Give two or more checkpoints of one run (or a run directory).")
        return None
    return DR.run_checkpoints(lines)


def _dataset() -> D.CorpusData | None:
    source = st.radio("Dataset", [SHIPPED_SOURCE, SERVER], horizontal=True, key=SOURCE)
    try:
        if source == SHIPPED_SOURCE:
            names = list(SH.shipped_datasets())
            return CR.shipped(st.selectbox("Shipped dataset", names, index=names.index(DEFAULT_DATASET)
                                           if DEFAULT_DATASET in names else 0, key=SHIPPED))
        where = st.text_input("Path on the server", key=PATH, placeholder="/data/texts.txt").strip()
        return CR.server_file(where) if where else None
    except ValueError as e:
        show_error(e, "Dataset refused: ")
        return None


def job_key(paths: list[Path], data: D.CorpusData, settings: DR.DriftSettings) -> tuple:
    return tuple((str(p), _stamp(p)) for p in paths), data.digest, settings


def start(paths: list[Path], data: D.CorpusData, settings: DR.DriftSettings):
    """The run's job: the one running or finished for these inputs, else a new one (also after a
    failed or cancelled one: only `show`'s "Run again" comes here then)."""
    key = job_key(paths, data, settings)
    job = jobs().get(key)
    if job is not None and not (job.finished.is_set() and job.error is not None):
        return job
    stop = stops()[key] = threading.Event()  # a new run's own: a Cancel of the last one does not carry over

    def work(progress):
        return DR.drift(paths, data, settings, progress=lambda done, total, name: progress(done), stop=stop.is_set)

    return jobs().submit(key, len(paths), work)


@st.fragment(run_every=POLL_SECONDS)
def _progress(job, key) -> None:
    if not job.running:
        st.rerun()
    st.progress(min(1.0, job.done / job.total), text=f"Routing the dataset through checkpoint {job.done + 1} of "
                                                     f"{job.total}")
    if st.button("Cancel", key=CANCEL):
        stops()[key].set()


def show() -> None:
    st.caption("How routing settles over a training run: per layer, the top-k overlap with the last checkpoint "
               "(OLMoE's router saturation) and with the previous one, each expert's utilisation over the "
               "checkpoints, the experts that die or come back, and the experts that changed most.")
    paths = _checkpoints()
    data = _dataset() if paths is not None else None
    if paths is None or data is None:
        return
    tokens = st.number_input("Tokens per row", 1, 100_000, 64, key=MAX_TOKENS,
                             help="The first tokens of each row (at most the model's context).")
    settings = DR.DriftSettings(max_tokens=int(tokens))
    try:
        DR.order_checkpoints(paths, settings.sort)  # one line for bad input, before any model runs
    except ValueError as e:
        show_error(e, "Checkpoints refused: ")
        return
    st.caption(f"{len(paths)} checkpoints: {', '.join(p.name for p in paths)} · {data.describe()}")
    key = job_key(paths, data, settings)
    job = jobs().get(key)
    if job is not None and job.finished.is_set() and job.error is not None:
        # a failed or cancelled run is shown, not started again on every rerun
        if job.error.startswith("Stopped"):
            st.warning("Drift cancelled.")
        else:
            st.error(f"Drift: {job.error}")
        if not st.button("Run again", key=GO):
            return
    job = start(paths, data, settings)
    if job.running:
        _progress(job, key)
        return
    result = job.result
    tables, prov = result.tables, result.provenance
    st.caption(f"{prov['rows']:,} rows, {prov['tokens']:,} tokens, top-{prov['top_k']}, in {job.seconds:.1f} s; "
               "cached per checkpoints, dataset and settings.")
    heading, about = SECTIONS["saturation"]
    st.subheader(heading, anchor="drift-saturation")
    st.caption(about)
    st.plotly_chart(saturation(tables), key="drift_fig_saturation", width="stretch")
    heading, about = SECTIONS["utilisation"]
    st.subheader(heading, anchor="drift-utilisation")
    st.caption(about)
    layers = list(dict.fromkeys(tables["utilisation"]["layer"]))
    layer = st.selectbox("Layer", layers, key=LAYER)
    st.plotly_chart(utilisation(tables, layer or layers[0]), key="drift_fig_utilisation", width="stretch")
    st.subheader("Experts that changed most", anchor="drift-changed")
    st.caption("Ranked by the total variation of their slot share over the run (sum of |change| between "
               "consecutive checkpoints), with the step where each first died or came back.")
    st.dataframe(changed_most(tables), key="drift_changed", hide_index=True, width="stretch")
    events = tables["events"]
    st.caption(f"{(events['event'] == 'dies').sum()} deaths, {(events['event'] == 'revives').sum()} revivals, "
               f"{(events['event'] == 'dead at start').sum()} experts dead at the first checkpoint.")
    st.dataframe(events, key="drift_events", hide_index=True, width="stretch")
    if (fig := specialisation(tables)) is not None:
        heading, about = SECTIONS["specialisation"]
        st.subheader(heading, anchor="drift-specialisation")
        st.caption(about)
        st.plotly_chart(fig, key="drift_fig_specialisation", width="stretch")
    with st.expander("Download the tables (CSV, Parquet) and the page (HTML, works offline)"):
        st.download_button("drift.html", lambda: page(tables, prov), "drift.html", "text/html",
                           key="dl_drift_html", on_click="ignore")
        cols = st.columns(4)
        for i, (name, df) in enumerate(tables.items()):
            for j, fmt in enumerate(("csv", "parquet")):
                cols[(2 * i + j) % 4].download_button(f"{name}.{fmt}", frame_bytes(df, fmt, prov), f"{name}.{fmt}",
                                                      key=f"dl_drift_{name}_{fmt}", on_click="ignore")
