"""Replay view: a serving engine's routing trace (vLLM, SGLang, a table) against the checkpoint as
transformers runs it (`analysis.replay.run.replay`). Layout only: the trace is read and compared by
the analysis, the figures are the CLI page's (`rendering.replay_figures`). A replay is cached per
checkpoint, trace digest and settings for every session (one model serves them all; nothing per call
lives on it). Shows the corpus figures and tables, a row's layer x position agreement map with its
text (mismatching tokens marked) and its mismatches (the engine's and the reference's experts with the
margin), and the downloads: every table as CSV and Parquet, and the offline page."""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import streamlit as st

from routescope.analysis.corpus.page import frame_bytes
from routescope.analysis.replay.compare import ReplaySettings, model_shape
from routescope.analysis.replay.run import replay
from routescope.analysis.replay.trace import FORMATS, read_trace
from routescope.app.messages import show_error
from routescope.rendering.replay_figures import SECTIONS, figures, page, row_map, row_text_html, summary_line

UPLOAD, SERVER = "Upload a trace", "File on the server"
AUTO = "from the file"
TRACE_DTYPES = ("model's", "bfloat16", "float16", "float32")
# widget keys (this view's own)
SOURCE, FILE, PATH, FORMAT, FLOAT32, TRACE_DTYPE, ULPS, RUN, ROW = (
    "replay_source", "replay_file", "replay_path", "replay_format", "replay_float32", "replay_trace_dtype",
    "replay_ulps", "replay_run", "replay_row")
UPLOADS = Path(tempfile.gettempdir()) / "routescope-replay"  # uploaded traces by digest (readers take a path)


@st.cache_resource(max_entries=4, show_spinner="Making a float32 copy of the model…")
def _float32(path: str, mtime: float, _model):
    return _model.float32_copy()


@st.cache_resource(max_entries=8, show_spinner=False)
def _replayed(path: str, mtime: float, trace: str, digest: str, fmt: str | None, settings: ReplaySettings,
              float32: bool, _model):
    """The replay of `trace` (its content's digest in the key), shared by every session."""
    shape = model_shape(_model)
    return replay(_model, read_trace(trace, fmt=fmt, n_layers=len(shape.layers), top_k=shape.k), settings=settings,
                  float32_model=_float32(path, mtime, _model) if float32 else None, name=Path(path).name,
                  trace=Path(trace).name)


def _trace() -> tuple[str, str] | None:
    """(path of the trace file, its sha256), or None when none is chosen yet."""
    source = st.radio("Trace", [UPLOAD, SERVER], horizontal=True, key=SOURCE)
    if source == UPLOAD:
        f = st.file_uploader("Trace file", key=FILE, help="vLLM or SGLang JSON lines (.jsonl), an SGLang per_token "
                                                          "dump, or a table (.parquet / .csv: row, position, "
                                                          "token_id, layer, k, expert; or `routescope export`'s)")
        if f is None:
            return None
        data = f.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        UPLOADS.mkdir(exist_ok=True)
        where = UPLOADS / f"{digest[:16]}{Path(f.name).suffix.lower()}"
        if not where.exists():
            where.write_bytes(data)
        return str(where), digest
    where = st.text_input("Path on the server", key=PATH, placeholder="/data/routed.jsonl").strip()
    if not where:
        return None
    p = Path(where)
    if not p.is_file():
        st.error(f"{where}: no such file")
        return None
    stat = p.stat()
    return str(p), f"{stat.st_size}:{stat.st_mtime_ns}"


def show(model, tok, path: str, mtime: float) -> None:
    st.caption("Replay a serving engine's routing (vLLM's routed_experts, SGLang's sgl_ext.routed_experts or a "
               "table) against this checkpoint as transformers runs it, teacher-forced: where the engine's top-k "
               "sets depart from the reference's, and whether each departure is a near-tie (numerics) or not.")
    try:
        shape = model_shape(model)
    except ValueError as e:
        st.info(str(e))
        return
    chosen = _trace()
    if chosen is None:
        return
    cols = st.columns([2, 2, 2, 1])
    fmt = cols[0].selectbox("Format", [AUTO, *FORMATS], key=FORMAT)
    tdt = cols[1].selectbox("Engine's dtype", TRACE_DTYPES, key=TRACE_DTYPE,
                            help="Near-ties are margins within the ulps below of this dtype's resolution.")
    ulps = cols[2].number_input("Near-tie ulps", 0.0, 1e6, 8.0, key=ULPS)
    float32 = cols[3].checkbox("float32 too", key=FLOAT32, help="Also run a float32 copy: which mismatches go away")
    settings = ReplaySettings(tie_ulps=float(ulps), trace_dtype=None if tdt == TRACE_DTYPES[0] else tdt)
    if not st.button("Replay", key=RUN, type="primary") and st.session_state.get("replay_done") != chosen[1]:
        return
    try:
        with st.spinner("Replaying the trace…"):
            result = _replayed(path, mtime, chosen[0], chosen[1], None if fmt == AUTO else fmt, settings, bool(float32),
                               model)
    except ValueError as e:
        show_error(e, "Trace refused: ")
        return
    st.session_state["replay_done"] = chosen[1]
    _results(result, shape, tok, path)


def _results(result, shape, tok, path: str) -> None:
    tables = result.tables
    st.markdown(f"**{summary_line(result.summary)}.**")
    for note in result.notes:
        st.caption(note)
    for name, fig in figures(tables).items():
        heading, about = SECTIONS[name]
        st.subheader(heading)
        st.caption(about)
        st.plotly_chart(fig, key=f"replay_fig_{name}")
    st.dataframe(tables["agreement"], hide_index=True)
    if result.details:
        st.subheader("A row")
        names = [d.row for d in result.details]
        pick = st.selectbox("Row", range(len(names)), format_func=lambda i: names[i], key=ROW,
                            help=f"The first {len(names)} rows compared")
        d = result.details[pick]
        toks = [tok.decode([int(t)]) for t in d.token_ids] if tok is not None else None
        st.markdown(row_text_html(d, shape.layers, toks), unsafe_allow_html=True)
        st.plotly_chart(row_map(d, shape.layers, shape.k, toks), key="replay_row_map")
        st.caption("This row's mismatches: the engine's and the reference's experts, the reference router's margin "
                   "and the swap gap (near_tie: within the engine dtype's resolution).")
        st.dataframe(d.mismatches, hide_index=True)
    for name in ("checks", "mismatches", "rows"):
        heading, about = SECTIONS[name]
        st.subheader(heading)
        st.caption(about)
        st.dataframe(tables[name], hide_index=True)
    with st.expander("Download the tables (CSV, Parquet) and the page (HTML, works offline)"):
        stem = f"{Path(path).name}_replay"
        decode = (lambda i: tok.decode([i])) if tok is not None else None
        st.download_button("replay.html", lambda: page(result, decode), f"{stem}.html", "text/html",
                           key="dl_replay_html", on_click="ignore")
        cols = st.columns(4)
        for i, (name, df) in enumerate(tables.items()):
            for j, fmt in enumerate(("csv", "parquet")):
                cols[(2 * i + j) % 4].download_button(f"{name}.{fmt}", frame_bytes(df, fmt), f"{stem}_{name}.{fmt}",
                                                      key=f"dl_replay_{name}_{fmt}", on_click="ignore")
