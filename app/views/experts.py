"""Experts view: which experts matter on a dataset (`analysis.reports.importance`). Layout only: the sweep
runs as a background job (progress with ETA, cancel) shared by every session and cached by
(checkpoint weights' digest, dataset digest, settings); a cancelled sweep keeps its measured rows on
disk, so starting it again resumes. The figures are the CLI page's (`components.importance_report`)."""
from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import streamlit as st

from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus import shipped as SH
from routescope.analysis.export.batch import weights_sha256
from routescope.analysis.corpus.page import frame_bytes
from routescope.analysis.corpus.run import CorpusJobs
from routescope.analysis.reports.importance import ImportanceSettings, importance

from routescope.app import corpus_resources as CR
from routescope.app import state as K
from routescope.rendering.importance_report import SECTIONS, figures, flagged, page
from routescope.app.messages import show_error
from routescope.core_models.ablation import NO_ABLATION, Ablation

SHIPPED, UPLOAD, SERVER = "Shipped dataset", "Upload a file", "File on the server"
POLL_SECONDS = 0.5
STEPS = 1000  # a job's progress is counted in thousandths of the sweep
CACHE = Path(tempfile.gettempdir()) / "routescope-importance"  # measured rows of cancelled sweeps


@st.cache_resource(show_spinner=False)
def jobs() -> CorpusJobs:
    return CorpusJobs(keep=8)


@st.cache_resource(show_spinner=False)
def stops() -> dict:
    return {}  # job key -> threading.Event (cancel)


@st.cache_resource(max_entries=16, show_spinner="Hashing the weights…")
def _digest(path: str, mtime: float) -> str:
    return weights_sha256(path)


def _dataset() -> D.CorpusData | None:
    source = st.radio("Dataset", [SHIPPED, UPLOAD, SERVER], horizontal=True, key=K.EXPERTS_SOURCE)
    try:
        if source == SHIPPED:
            return CR.shipped(st.selectbox("Shipped dataset", list(SH.shipped_datasets()), key=K.EXPERTS_SHIPPED))
        if source == UPLOAD:
            f = st.file_uploader("Dataset file", key=K.EXPERTS_UPLOAD)
            return None if f is None else CR.uploaded(f.name, f.file_id, f.getvalue())
        where = st.text_input("Path on the server", key=K.EXPERTS_PATH, placeholder="/data/texts.txt").strip()
        return CR.server_file(where) if where else None
    except ValueError as e:
        show_error(e, "Dataset refused: ")
        return None


def _settings(model) -> ImportanceSettings:
    layers = list(model.routing_layers())
    cols = st.columns([3, 1, 1])
    chosen = cols[0].multiselect("Layers", layers, default=layers, key=K.EXPERTS_LAYERS,
                                 help="Routing layers whose options are dropped one at a time (the pruning curve "
                                      "needs every layer's options).")
    max_tokens = cols[1].number_input("Tokens", 2, 1_000_000, 4000, step=1000, key=K.EXPERTS_MAX_TOKENS,
                                      help="Tokens taken from the dataset in row order.")
    draws = cols[2].number_input("Control draws", 1, 64, 8, key=K.EXPERTS_DRAWS,
                                 help="Random experts dropped per layer as the control (and random pruning rankings).")
    return ImportanceSettings(layers=tuple(chosen) if chosen != layers else None, max_tokens=int(max_tokens),
                              control_draws=int(draws), prune_draws=int(draws))


def job_key(path: str, mtime: float, data: D.CorpusData, settings: ImportanceSettings) -> tuple:
    return (_digest(path, mtime), data.digest, settings)


def start(model, tok, path: str, mtime: float, data: D.CorpusData, settings: ImportanceSettings):
    key = job_key(path, mtime, data, settings)
    stop = stops().setdefault(key, threading.Event())
    stop.clear()

    def work(progress):
        return importance(model, tok, data, settings, name=Path(path).name, weights_sha256=key[0], cache_dir=CACHE,
                          progress=lambda done, total: progress(int(STEPS * done / max(1, total))),
                          stop=stop.is_set)

    return jobs().submit(key, STEPS, work)


def eta(job) -> str:
    spent = time.perf_counter() - job.started
    if not job.done:
        return f"{spent:.0f} s"
    return f"{spent:.0f} s, about {spent * (job.total - job.done) / job.done:.0f} s left"


@st.fragment(run_every=POLL_SECONDS)
def _progress(job, key) -> None:
    if not job.running:
        st.rerun()
    st.progress(min(1.0, job.done / job.total), text=f"Dropping experts one at a time: {job.done / 10:.1f}% · {eta(job)}")
    if st.button("Cancel", key=K.EXPERTS_CANCEL):
        stops()[key].set()


def show(model, tok, path: str, mtime: float, ablation: Ablation = NO_ABLATION) -> None:
    """`ablation`: the one at the left, which the sweep does not run under (each expert is dropped alone
    from the model as it is): the view says so rather than leave it to be guessed."""
    st.caption("Which experts matter on a dataset: each expert dropped alone, teacher-forced, with the change in "
               "next-token loss (95% bootstrap interval over rows), KL, top-1 flips and usage; a random-expert control; "
               "cheap proxies against the causal effect; and what pruning the least important would cost.")
    if not ablation.is_empty:
        st.info(f"The ablation at the left (`{ablation.summary()}`) does not apply here: each expert is dropped alone "
                "from the model as it is, against the model as it is.")
    if not model.routing_layers():
        st.info(f"{model.config.label} has no routing layers: no expert to measure.")
        return
    data = _dataset()
    if data is None:
        return
    st.caption(data.describe())
    settings = _settings(model)
    key = job_key(path, mtime, data, settings)
    job = jobs().get(key)
    if job is None or (job.error is not None and not job.running):
        if job is not None:
            st.warning(f"Last sweep: {job.error}" if not job.error.startswith("Stopped") else
                       "Sweep cancelled; starting it again resumes from the rows already measured.")
        if st.button("Measure expert importance", key=K.EXPERTS_RUN, type="primary"):
            job = start(model, tok, path, mtime, data, settings)
        else:
            return
    if job.running:
        _progress(job, key)
        return
    result = job.result
    st.caption(f"{result.provenance['rows']:,} rows, {result.provenance['predicted_positions']:,} predicted positions, "
               f"effects in {result.provenance['effects_dtype']} ({result.provenance['method']}) in {job.seconds:.1f} s; "
               "cached per checkpoint digest, dataset digest and settings.")
    for note in result.notes:
        st.caption(note)
    tables = result.tables
    imp = flagged(tables)
    st.caption(f"{int(imp['outside_control'].sum())} of {len(imp)} options lie outside their layer's control interval (★).")
    sort = st.toggle("Sort each layer by effect", key=K.EXPERTS_SORT)
    for name, fig in figures(tables, sort=sort).items():
        heading, text = SECTIONS[name]
        st.subheader(heading, anchor=f"experts-{name}")
        st.caption(text)
        st.plotly_chart(fig, key=f"experts_fig_{name}", width="stretch")
    st.subheader("Tables", anchor="experts-tables")
    st.dataframe(imp.sort_values("delta_nll", ascending=False), key="experts_importance", hide_index=True,
                 width="stretch")
    st.dataframe(tables["proxy_agreement"], key="experts_agreement", hide_index=True)
    with st.expander("Download the tables (CSV, Parquet) and the page (HTML, works offline)"):
        stem = f"{Path(path).name}_importance"
        st.download_button("importance.html", lambda: page(tables, result.provenance, result.notes),
                           f"{stem}.html", "text/html", key="dl_experts_html", on_click="ignore")
        cols = st.columns(4)
        for i, (name, df) in enumerate(tables.items()):
            for j, fmt in enumerate(("csv", "parquet")):
                cols[(2 * i + j) % 4].download_button(f"{name}.{fmt}", frame_bytes(df, fmt), f"{stem}_{name}.{fmt}",
                                                      key=f"dl_experts_{name}_{fmt}", on_click="ignore")
