"""Experts view: which experts matter on a dataset (`analysis.reports.importance`). Layout only: the sweep
runs as a background job (progress with the time left, cancel) shared by every session and cached by
(checkpoint weights' digest, dataset digest, settings); a cancelled sweep keeps its measured rows on
disk, so starting it again resumes. The view's inputs and an uploaded dataset are kept in the session
while another view is shown. The figures and their captions are the CLI page's
(`rendering.importance_report`)."""
from __future__ import annotations

import dataclasses
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
from routescope.analysis.reports.importance import PHASES, ImportanceSettings, importance

from routescope.app import corpus_resources as CR
from routescope.app import state as K
from routescope.rendering.importance_figures import flagged, low_agreement
from routescope.rendering.importance_report import SECTIONS, captions, figures, page, unplaced
from routescope.app.messages import show_error
from routescope.core_models.ablation import NO_ABLATION, Ablation

SHIPPED, UPLOAD, SERVER = "Shipped dataset", "Upload a file", "File on the server"
POLL_SECONDS = 0.5
STEPS = 100_000  # a job's progress in hundred-thousandths: one forward of a 128 x 24 sweep is ~3e-5 of it
CACHE = Path(tempfile.gettempdir()) / "routescope-importance"  # measured rows of cancelled sweeps
SETTING_FIELDS = {f.name for f in dataclasses.fields(ImportanceSettings)}
METHODS = {"both": "estimate all, measure the top exactly", "estimate": "first-order estimate only",
           "exact": "drop every expert exactly"}


@st.cache_resource(show_spinner=False)
def jobs() -> CorpusJobs:
    return CorpusJobs(keep=8)


@st.cache_resource(show_spinner=False)
def stops() -> dict:
    return {}  # job key -> threading.Event (cancel)


@st.cache_resource(show_spinner=False)
def phases() -> dict:
    """Run key -> what its progress counts now (`importance`'s `phase`), shared by the sessions."""
    return {}


@st.cache_resource(show_spinner=False)
def paces() -> dict:
    return {}  # job key -> Pace of its latest run


@st.cache_resource(max_entries=8, show_spinner="Drawing…")
def _figures(_tables, job: str, sort: bool, in_sample: bool) -> dict:
    """A finished sweep's figures, made once per (sweep, sort, in-sample) for every session: at 128 x 24 they
    take about 2 s to make, and a click elsewhere on the page reruns the view. Read-only once made
    (st.plotly_chart reads a figure into its own dict)."""
    return figures(_tables, sort=sort, in_sample=in_sample)


@st.cache_resource(max_entries=16, show_spinner="Hashing the weights…")
def _digest(path: str, mtime: float) -> str:
    return weights_sha256(path)


class Pace:
    """A sweep's pace from its progress reports (fraction of the work done, at a time): the time left is
    the rate since the first report times the work left. The first report, not the start, is the
    origin: rows resumed from the cache count as done at once and would make the rate look fast."""

    def __init__(self) -> None:
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None

    def add(self, t: float, fraction: float) -> None:
        if self.first is None:
            self.first = (t, fraction)
        self.last = (t, fraction)

    def left(self) -> float | None:
        """Seconds left (None before two reports with work between them)."""
        if self.first is None or self.last is None or self.last[1] <= self.first[1]:
            return None
        (t0, f0), (t1, f1) = self.first, self.last
        return (t1 - t0) / (f1 - f0) * max(0.0, 1.0 - f1)


def duration(s: float) -> str:
    """Seconds as the progress line writes them: 42 s, 3 min 05 s, 1 h 02 min."""
    s = max(0, int(round(s)))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def eta(job, pace: Pace | None) -> str:
    spent = time.perf_counter() - job.started
    left = pace.left() if pace is not None else None
    if left is None:
        return f"{duration(spent)} · time left after the first forward"
    return f"{duration(spent)}, about {duration(left)} left"


# --- inputs, kept across view switches --------------------------------------------------------------------

def _keep(key: str) -> None:
    """An input changed in the browser: its kept value follows (before `_restore` seeds it)."""
    st.session_state[K.kept_key(key)] = st.session_state[key]


def _restore(model) -> None:
    """Seed every input's widget from its kept value (an undrawn widget's value is dropped by Streamlit:
    the corpus view's `_restore` says why on every run); layers only where this model has them."""
    ss = st.session_state
    for key in K.EXPERTS_KEPT:
        if K.kept_key(key) in ss:
            ss[key] = ss[K.kept_key(key)]
    if K.EXPERTS_LAYERS in ss:  # another checkpoint's layers: those this one has, else all of them
        ss[K.EXPERTS_LAYERS] = [l for l in ss[K.EXPERTS_LAYERS] if l in model.routing_layers()]
        if not ss[K.EXPERTS_LAYERS]:
            del ss[K.EXPERTS_LAYERS]
            ss.pop(K.kept_key(K.EXPERTS_LAYERS), None)
    if ss.get(K.EXPERTS_SHIPPED) not in (None, *SH.shipped_datasets()):
        del ss[K.EXPERTS_SHIPPED]


def _default(key: str, value) -> dict:
    """A widget's default, given only when the session holds no value for it (else Streamlit warns)."""
    return {} if key in st.session_state else {"value": value}


def _uploaded() -> D.CorpusData | None:
    """The uploaded dataset, kept (name, id, bytes) while another view is shown; forgotten when the
    user removes the file from the uploader."""
    ss, seen = st.session_state, K.kept_key(K.EXPERTS_UPLOAD)
    drawn_before = K.EXPERTS_UPLOAD in ss  # False right after another view: the uploader starts empty again
    f = st.file_uploader("Dataset file", key=K.EXPERTS_UPLOAD)
    if f is not None:
        ss[K.EXPERTS_UPLOADED] = (f.name, f.file_id, f.getvalue())
    elif drawn_before and ss.get(seen) is not None:  # the file was removed from the uploader
        ss.pop(K.EXPERTS_UPLOADED, None)
    ss[seen] = f.file_id if f is not None else None
    kept = ss.get(K.EXPERTS_UPLOADED)
    if kept is None:
        return None
    if f is None:
        st.caption(f"Measuring on **{kept[0]}**, uploaded earlier in this session (upload another file to replace it).")
    return CR.uploaded(*kept)


def _dataset() -> D.CorpusData | None:
    source = st.radio("Dataset", [SHIPPED, UPLOAD, SERVER], horizontal=True, key=K.EXPERTS_SOURCE,
                      on_change=_keep, args=(K.EXPERTS_SOURCE,))
    try:
        if source == SHIPPED:
            return CR.shipped(st.selectbox("Shipped dataset", list(SH.shipped_datasets()), key=K.EXPERTS_SHIPPED,
                                           on_change=_keep, args=(K.EXPERTS_SHIPPED,)))
        if source == UPLOAD:
            return _uploaded()
        where = st.text_input("Path on the server", key=K.EXPERTS_PATH, placeholder="/data/texts.txt",
                              on_change=_keep, args=(K.EXPERTS_PATH,)).strip()
        return CR.server_file(where) if where else None
    except ValueError as e:
        show_error(e, "Dataset refused: ")
        return None


def _settings(model) -> ImportanceSettings:
    """The sweep's settings from the widgets; the method, merge and in-sample choices only where this
    version of the sweep has them (`SETTING_FIELDS`)."""
    layers = list(model.routing_layers())
    cols = st.columns([3, 1, 1])
    chosen = cols[0].multiselect("Layers", layers, key=K.EXPERTS_LAYERS, on_change=_keep, args=(K.EXPERTS_LAYERS,),
                                 help="Routing layers whose options are dropped one at a time (the pruning curve "
                                      "needs every layer's options).",
                                 **({} if K.EXPERTS_LAYERS in st.session_state else {"default": layers}))
    max_tokens = cols[1].number_input("Tokens", 2, 1_000_000, step=1000, key=K.EXPERTS_MAX_TOKENS, on_change=_keep,
                                      args=(K.EXPERTS_MAX_TOKENS,), help="Tokens taken from the dataset in row order.",
                                      **_default(K.EXPERTS_MAX_TOKENS, 4000))
    draws = cols[2].number_input("Control draws", 1, 64, key=K.EXPERTS_DRAWS, on_change=_keep, args=(K.EXPERTS_DRAWS,),
                                 help="Random experts dropped per layer as the control (and random pruning rankings).",
                                 **_default(K.EXPERTS_DRAWS, 8))
    extra = {}
    cols = st.columns([2, 1, 1, 2])
    if "confirm" in SETTING_FIELDS:
        extra["method"] = cols[0].selectbox("Method", list(METHODS), format_func=METHODS.get, key=K.EXPERTS_METHOD,
                                            on_change=_keep, args=(K.EXPERTS_METHOD,),
                                            help="The first-order estimate costs one forward and one backward per "
                                                 "batch for every expert; exact drops each expert over the dataset.")
        extra["confirm"] = int(cols[1].number_input(
            "Confirm", 1, 4096, key=K.EXPERTS_CONFIRM, on_change=_keep, args=(K.EXPERTS_CONFIRM,),
            help="Experts per layer measured exactly after the estimate (largest |estimate| first).",
            **_default(K.EXPERTS_CONFIRM, 8)))
    if "merge_max" in SETTING_FIELDS:
        extra["merge_max"] = int(cols[2].number_input(
            "Merge up to", 0, 64, key=K.EXPERTS_MERGE, on_change=_keep, args=(K.EXPERTS_MERGE,),
            help="Largest N of the merge curve beside the pruning curve (0: none).", **_default(K.EXPERTS_MERGE, 2)))
    if "in_sample_curve" in SETTING_FIELDS:
        extra["in_sample_curve"] = cols[3].checkbox("In-sample pruning curve too", key=K.EXPERTS_IN_SAMPLE,
                                                    on_change=_keep, args=(K.EXPERTS_IN_SAMPLE,),
                                                    help="Judged on the rows that ranked the experts: optimistic.")
    return ImportanceSettings(layers=tuple(chosen) if chosen != layers else None, max_tokens=int(max_tokens),
                              control_draws=int(draws), prune_draws=int(draws), **extra)


def _remember() -> None:
    ss = st.session_state
    for key in K.EXPERTS_KEPT:
        if key in ss:
            ss[K.kept_key(key)] = ss[key]


# --- the sweep ----------------------------------------------------------------------------------------------

def job_key(path: str, mtime: float, data: D.CorpusData, settings: ImportanceSettings) -> tuple:
    return (_digest(path, mtime), data.digest, settings)


def start(model, tok, path: str, mtime: float, data: D.CorpusData, settings: ImportanceSettings):
    key = job_key(path, mtime, data, settings)
    stop = stops().setdefault(key, threading.Event())
    stop.clear()
    pace = paces()[key] = Pace()
    phases().pop(key, None)

    def report(progress, done: float, total: int) -> None:
        pace.add(time.perf_counter(), done / max(1, total))
        progress(int(STEPS * done / max(1, total)))

    def work(progress):
        return importance(model, tok, data, settings, name=Path(path).name, weights_sha256=key[0], cache_dir=CACHE,
                          progress=lambda done, total: report(progress, done, total), stop=stop.is_set,
                          phase=lambda what: phases().__setitem__(key, what))

    return jobs().submit(key, STEPS, work)


@st.fragment(run_every=POLL_SECONDS)
def _progress(job, key) -> None:
    if not job.running:
        st.rerun()
    share = min(1.0, job.done / job.total)
    what = phases().get(key, PHASES["exact"])
    st.progress(share, text=f"{what}: {100 * share:.1f}% · {eta(job, paces().get(key))}")
    if st.button("Cancel", key=K.EXPERTS_CANCEL):
        stops()[key].set()


def show(model, tok, path: str, mtime: float, ablation: Ablation = NO_ABLATION) -> None:
    """`ablation`: the one at the left, which the sweep does not run under (each expert is dropped alone
    from the model as it is): the view says so rather than leave it to be guessed."""
    st.caption("Which experts matter on a dataset: each expert dropped alone, teacher-forced, with the change in "
               "next-token loss (95% bootstrap interval over rows), KL, top-1 flips and usage; a random-expert control; "
               "cheap proxies against the causal effect; and what pruning or merging the least important would cost.")
    if not ablation.is_empty:
        st.info(f"The ablation at the left (`{ablation.summary()}`) does not apply here: each expert is dropped alone "
                "from the model as it is, against the model as it is.")
    if not model.routing_layers():
        st.info(f"{model.config.label} has no routing layers: no expert to measure.")
        return
    _restore(model)
    data = _dataset()
    if data is None:
        _remember()
        return
    st.caption(data.describe())
    settings = _settings(model)
    _remember()
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
    _result(job, key, path, settings)


def _result(job, key: tuple, path: str, settings: ImportanceSettings) -> None:
    result = job.result
    prov = result.provenance
    st.caption(f"{prov['rows']:,} rows, {prov['predicted_positions']:,} predicted positions, "
               f"effects in {prov['effects_dtype']} ({prov['method']}) in {job.seconds:.1f} s; "
               "cached per checkpoint digest, dataset digest and settings.")
    tables = result.tables
    in_sample = bool(getattr(settings, "in_sample_curve", False))
    lines = captions(tables, in_sample, result.notes)  # a note on a section goes under its figure
    for note in unplaced(lines, result.notes):
        st.caption(note)
    imp = flagged(tables)
    st.caption(f"{int(imp['outside_control'].sum())} of {len(imp)} options lie outside their layer's control interval (★).")
    sort = st.toggle("Sort each layer by effect", key=K.EXPERTS_SORT, on_change=_keep, args=(K.EXPERTS_SORT,))
    figs = _figures(tables, repr((key, job.started)), sort, in_sample)  # this run of the sweep
    for name, (heading, text) in SECTIONS.items():
        fig = figs.get(name)
        if fig is None and not lines.get(name):
            continue
        st.subheader(heading, anchor=f"experts-{name}")
        if fig is not None:  # else its caption says why there is none
            st.caption(text)
            st.plotly_chart(fig, key=f"experts_fig_{name}", width="stretch")
        for line in lines.get(name, ()):
            st.caption(line)
        if name == "estimate" and low_agreement(tables):
            st.caption("Here: choose the method *drop every expert exactly* with those layers.")
    st.subheader("Tables", anchor="experts-tables")
    order = "delta_nll" if imp["delta_nll"].notna().any() else "effect"
    st.dataframe(imp.sort_values(order, ascending=False), key="experts_importance", hide_index=True, width="stretch")
    for name in ("estimate_agreement", "proxy_agreement"):
        if name in tables:
            st.dataframe(tables[name], key=f"experts_{name}", hide_index=True)
    _downloads(tables, result, path)


def _downloads(tables, result, path: str) -> None:
    with st.expander("Download the tables (CSV, Parquet) and the page (HTML, works offline)"):
        stem = f"{Path(path).name}_importance"
        st.download_button("importance.html", lambda: page(tables, result.provenance, result.notes),
                           f"{stem}.html", "text/html", key="dl_experts_html", on_click="ignore")
        cols = st.columns(4)
        for i, (name, df) in enumerate(tables.items()):
            for j, fmt in enumerate(("csv", "parquet")):
                cols[(2 * i + j) % 4].download_button(f"{name}.{fmt}", frame_bytes(df, fmt), f"{stem}_{name}.{fmt}",
                                                      key=f"dl_experts_{name}_{fmt}", on_click="ignore")
