"""Corpus view: how the checkpoint routes over a whole dataset (`analysis.corpus.stats`), optionally
beside a second checkpoint on the same rows. Layout only: the dataset is checked by
`analysis.inputs.datasets`, the statistics run as a background job (`app.corpus_resources`) while this
view shows a progress bar and the rest of the page stays usable, and the tables come back as views
drawn by the drawer table, in a loop that never asks which family it is looking at.

Every forward runs under the ablation at the left (the header, the summary table, the downloads and
the page say which). The view's inputs (dataset, options, comparison) are kept in the session while
another view is shown: Streamlit forgets the value of a widget it does not draw."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import streamlit as st

from routescope.analysis.corpus import compare as CMP
from routescope.analysis.corpus import reductions as RD
from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus import shipped as SH
from routescope.analysis.runs.catalog import checkpoint_roots, list_checkpoints
from routescope.analysis.corpus.columns import column_help, named_compared
from routescope.analysis.corpus.page import SECTIONS, frame_bytes
from routescope.analysis.corpus.run import CorpusSettings, corpus_views, layout_of, provenance
from routescope.core_models.ablation import NO_ABLATION, Ablation

from routescope.app import corpus_resources as CR
from routescope.app import resources
from routescope.app import state as K
from routescope.rendering.corpus_report import draw_views, page
from routescope.app.messages import show_error

SHIPPED, UPLOAD, SERVER = "Shipped dataset", "Upload a file", "File on the server"
NONE = "(none)"
COMPARED = ("Both checkpoints side by side, each column named by its checkpoint, and the difference (the second "
            "minus the first); hover a column's name for what it holds. The downloaded files name the columns the "
            "same way, so a file read on its own says which checkpoint is which.")
POLL_SECONDS = 0.5
LIMITS = (f"Formats: .txt (one prompt per line), or .tsv / .csv / .jsonl / .parquet with a `text` (or `prompt`) "
          f"column and label columns. Limits here: {D.APP_MAX_ROWS:,} rows and {D.APP_MAX_CHARS:,} characters "
          "(`routescope corpus` streams files of any size).")


def _dataset() -> D.CorpusData | None:
    """The chosen dataset, checked; None (with the one line saying why) when there is none yet or
    it is refused."""
    source = st.radio("Dataset", [SHIPPED, UPLOAD, SERVER], horizontal=True, key=K.CORPUS_SOURCE,
                      on_change=_keep, args=(K.CORPUS_SOURCE,))
    try:
        if source == SHIPPED:
            return CR.shipped(st.selectbox("Shipped dataset", list(SH.shipped_datasets()), key=K.CORPUS_SHIPPED,
                                             on_change=_keep, args=(K.CORPUS_SHIPPED,)))
        if source == UPLOAD:
            # no `type=`: Streamlit's own refusal names a MIME type and leaves a stale chip; the reader's names the
            # formats (corpus_data's one line), and a refused file still replaces the previous one
            return _uploaded()
        where = st.text_input("Path on the server", key=K.CORPUS_PATH, placeholder="/data/prompts.tsv",
                              on_change=_keep, args=(K.CORPUS_PATH,)).strip()
        if not where:
            st.info("Give the path of a dataset file on the server. " + LIMITS)
            return None
        return CR.server_file(where)
    except ValueError as e:  # names the file and the row: one line, nothing else changes
        show_error(e, "Dataset refused: ")
        return None


def _uploaded() -> D.CorpusData | None:
    """The uploaded dataset, kept (name, id, bytes) while another view is shown; forgotten when the
    user removes the file from the uploader."""
    ss, seen = st.session_state, K.kept_key(K.CORPUS_UPLOAD)
    drawn_before = K.CORPUS_UPLOAD in ss  # False right after another view: the uploader starts empty again
    f = st.file_uploader("Dataset file", key=K.CORPUS_UPLOAD, help=LIMITS)
    if f is not None:
        ss[seen] = f.file_id
        try:
            data = CR.uploaded(f.name, f.file_id, f.getvalue())
        except ValueError:  # refused (said by the caller): it replaces the previous file, and is never kept
            ss.pop(K.CORPUS_UPLOADED, None)  # to be offered as "uploaded earlier" after a view switch
            raise
        ss[K.CORPUS_UPLOADED] = (f.name, f.file_id, f.getvalue())
        return data
    if drawn_before and ss.get(seen) is not None:  # the file was removed from the uploader
        ss.pop(K.CORPUS_UPLOADED, None)
    ss[seen] = None
    kept = ss.get(K.CORPUS_UPLOADED)
    if kept is None:
        st.info("Upload a dataset file to route it. " + LIMITS)
        return None
    st.caption(f"Routing **{kept[0]}**, uploaded earlier in this session (upload another file to replace it).")
    return CR.uploaded(*kept)


def _restore(model, compare_options: list[str]) -> None:
    """Seed every input's widget from its kept value, on every run (within what this model allows).

    The kept value (`K.kept_key`) is the input's one record: a widget's change writes it (`_keep`, run
    before the script) and `_remember` keeps a first default. Seeding only widgets missing from the
    session is not enough: a widget not drawn in one run (another view, a refused dataset) is forgotten
    by the browser, which draws it again from what the script sends, and Streamlit sends a value only
    for a key the script set in that run (else the widget's default: 1 for "Tokens per row")."""
    ss = st.session_state
    for key in K.CORPUS_KEPT:
        if K.kept_key(key) in ss:
            ss[key] = ss[K.kept_key(key)]
    if K.CORPUS_MAX_TOKENS in ss and not 1 <= ss[K.CORPUS_MAX_TOKENS] <= model.context:
        ss[K.CORPUS_MAX_TOKENS] = min(max(1, int(ss[K.CORPUS_MAX_TOKENS])), model.context)
    if ss.get(K.CORPUS_COMPARE, NONE) not in compare_options:  # a checkpoint that is gone
        ss[K.CORPUS_COMPARE] = NONE


def _keep(key: str) -> None:
    """A corpus input changed in the browser: its kept value follows (before `_restore` seeds it)."""
    st.session_state[K.kept_key(key)] = st.session_state[key]


def _remember() -> None:
    ss = st.session_state
    for key in K.CORPUS_KEPT:
        if key in ss:
            ss[K.kept_key(key)] = ss[key]


def _default(key: str, value):
    """A widget's default, given only when the session holds no value for it (else Streamlit warns)."""
    return {} if key in st.session_state else {"value": value}


def _controls(model) -> tuple[CorpusSettings, str, int, int, str | None]:
    """Settings, the intended-options text, top tokens, minimum count, and the checkpoint to compare with."""
    cols = st.columns([1, 2, 2])
    max_tokens = cols[0].number_input("Tokens per row", 1, model.context, key=K.CORPUS_MAX_TOKENS,
                                      on_change=_keep, args=(K.CORPUS_MAX_TOKENS,),
                                      help="Each row's first tokens that are routed (at most the model's context).",
                                      **_default(K.CORPUS_MAX_TOKENS, model.context))
    intended = cols[1].text_input("Intended options", key=K.CORPUS_INTENDED, placeholder="domain:story=0,math=1",
                                  on_change=_keep, args=(K.CORPUS_INTENDED,),
                                  help="Label values and the 0-based option each should take, for accuracy; several "
                                       "columns separated by ';'. expected_path (1-based) and expected_option "
                                       "columns need none.")
    names = _others()
    compare = cols[2].selectbox("Compare with", [NONE, *names], key=K.CORPUS_COMPARE,
                                on_change=_keep, args=(K.CORPUS_COMPARE,),
                                format_func=lambda p: names.get(p, p))
    with st.expander("Specialisation settings"):
        c = st.columns(2)
        top = c[0].number_input("Tokens per option", 1, 100, key=K.CORPUS_TOP, on_change=_keep,
                                args=(K.CORPUS_TOP,), **_default(K.CORPUS_TOP, 10))
        min_count = c[1].number_input("Minimum count of a token", 1, 1000, key=K.CORPUS_MIN_COUNT,
                                      on_change=_keep, args=(K.CORPUS_MIN_COUNT,),
                                      **_default(K.CORPUS_MIN_COUNT, 5))
    return CorpusSettings(max_tokens=int(max_tokens)), intended, int(top), int(min_count), \
        (None if compare == NONE else compare)


def _others() -> dict[str, str]:
    """Checkpoints to compare with: path -> name."""
    return {c.path: c.name for c in list_checkpoints(checkpoint_roots()) if c.problem is None}


@st.fragment(run_every=POLL_SECONDS)
def _progress(jobs: list, names: list[str]) -> None:
    """Progress of the running jobs, redrawn every POLL_SECONDS alone; the whole page reruns once
    they are done (the rest of the page stays usable meanwhile)."""
    if not any(j.running for j in jobs):
        st.rerun()
    for job, name in zip(jobs, names):
        st.progress(min(1.0, job.done / max(1, job.total)),
                    text=f"{name}: routing {job.done:,} of {job.total:,} rows" + (" (done)" if not job.running else "…"))


def _show_pieces(pieces: dict[str, dict]) -> None:
    for view, drawn in pieces.items():
        base = view.removeprefix("compare_")
        heading, text = SECTIONS.get(base, (base.replace("_", " ").capitalize(), ""))
        if view.startswith("compare_"):
            heading, text = f"Compared: {heading.lower()}", COMPARED
        st.subheader(heading, anchor=f"corpus-{view}")
        st.caption(text)
        for name, piece in drawn.items():
            if isinstance(piece, pd.DataFrame):  # flags first, columns named by checkpoint, each one's help
                st.dataframe(piece, key=f"corpus_table_{name}", width="stretch", hide_index=True,
                             column_config={c: st.column_config.Column(help=h) for c, h in column_help(piece).items()})
            else:
                st.plotly_chart(piece, key=f"corpus_fig_{name}", width="stretch")


def file_stem(result, other=None) -> str:
    """What a download's name starts with: the checkpoint(s), the dataset, and "ablated" under an ablation."""
    parts = [result.model, *(["vs", other.model] if other is not None else []), Path(result.dataset).stem]
    parts += [] if result.ablation.is_empty else ["ablated"]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "_".join(parts))


def both_summaries(a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str]) -> pd.DataFrame:
    """Two checkpoints' summaries (metric, value) side by side: metric, then a value column named by each
    checkpoint ("value (A)" / "(B)" for two of one name, as the compared tables); the rows of either, the
    first's order first."""
    if names[0] == names[1]:
        names = (f"{names[0]} (A)", f"{names[1]} (B)")
    both = a.merge(b, on="metric", how="outer", sort=False, suffixes=tuple(f" ({n})" for n in names))
    return both.fillna("")


def _downloads(result, tables: dict, compared: dict | None, other, why: str | None, labels) -> None:
    """Every file named by the dataset (and the checkpoints) it holds; Parquet files and corpus.json
    carry the provenance (checkpoints, weights digests, dataset digest, ablation, settings). In a
    comparison the summary, corpus.html and corpus.json hold (and are named by) both checkpoints."""
    meta = {"a": provenance(result), **({"b": provenance(other)} if other is not None else {})}
    files = {name: (file_stem(result, other if name == "summary" else None), df)
             for name, df in tables.items()}
    if compared:  # columns named by checkpoint, as the view shows them
        named = named_compared(compared, (result.model, other.model))
        files |= {f"compare_{name}": (file_stem(result, other), df) for name, df in named.items()}
    both = file_stem(result, other)
    under = "" if result.ablation.is_empty else f" under `{result.ablation.summary(2)}`"
    through = result.model + (f" and {other.model}" if other is not None else "")
    with st.expander(f"Download the tables of {result.dataset} through {through}{under} (CSV, Parquet), the "
                     "whole view (HTML, works offline) and its provenance (JSON)"):
        top = st.columns(2)
        top[0].download_button("corpus.html (this view as one page)",
                               lambda: page(result, tables, labels, other=other, compared=compared, why_not=why),
                               f"{both}_corpus.html", "text/html", key="dl_corpus_html", on_click="ignore")
        top[1].download_button("corpus.json (provenance)", json.dumps(meta, indent=1, ensure_ascii=False).encode(),
                               f"{both}_corpus.json", "application/json", key="dl_corpus_json", on_click="ignore")
        cols = st.columns(4)
        for i, (name, (stem, df)) in enumerate(files.items()):
            for j, fmt in enumerate(("csv", "parquet")):
                cols[(2 * i + j) % 4].download_button(  # bytes now (small tables): the page's one deferred file is HTML
                    f"{name}.{fmt}", frame_bytes(df, fmt, meta), f"{stem}_{name}.{fmt}",
                    "text/csv" if fmt == "csv" else "application/octet-stream", key=f"dl_corpus_{name}_{fmt}",
                    on_click="ignore")


def show(model, tok, path: str, mtime: float, ablation: Ablation = NO_ABLATION) -> None:
    """`ablation`: the one at the left, which every forward of the corpus runs under."""
    st.caption("How this checkpoint routes over a dataset: utilisation with dead and overloaded options, routes by "
               "label, accuracy against intended options, token specialisation and co-routing across layers. "
               + LIMITS)
    if ablation.is_empty:
        st.caption("Routed without an ablation (switch options off at the left to route the dataset under it).")
    else:
        st.info(f"Routed under the ablation at the left: `{ablation.summary()}`. Every row runs with it; the "
                "summary table, the downloads and the page record it.")
    try:
        ablation.validate(model.routing_layers(), model.ablation_modes(), model.routing_top_k())
    except ValueError as e:  # the statistics would not be of the ablation the page shows: none are made
        st.error(f"Not routed: {e}. Change the ablation at the left.")
        return
    _restore(model, [NONE, *_others()])
    try:
        data = _dataset()
        if data is None:
            return
        st.caption(data.describe())
        for note in data.notes:
            st.caption(note)
        settings, intended_text, top, min_count, other_path = _controls(model)
    finally:
        _remember()
    _results(model, path, mtime, ablation, data, settings, intended_text, top, min_count, other_path)


def _results(model, path: str, mtime: float, ablation: Ablation, data, settings, intended_text: str, top: int,
             min_count: int, other_path: str | None) -> None:
    try:
        intended = RD.parse_intended([s for s in intended_text.split(";") if s.strip()])
    except ValueError as e:
        show_error(e)
        intended = {}
    jobs, names = [CR.job(path, mtime, data, settings, ablation)], [Path(path).name]
    keys = [CR.job_key(path, mtime, data, settings, ablation)]
    why = None
    if other_path is not None:
        other_mtime = resources.stamp(other_path)
        other_model, _ = resources.load(other_path, other_mtime)
        why = CMP.comparable(layout_of(model, data.label_columns), layout_of(other_model, data.label_columns),
                           (names[0], Path(other_path).name))
        if why is None and not ablation.is_empty:  # both run under the same options switched off
            try:
                ablation.validate(other_model.routing_layers(), other_model.ablation_modes(),
                                  other_model.routing_top_k())
            except ValueError as e:
                why = f"the ablation at the left does not apply to it ({e})"
        if why is None:
            jobs.append(CR.job(other_path, other_mtime, data, settings, ablation))
            names.append(Path(other_path).name)
            keys.append(CR.job_key(other_path, other_mtime, data, settings, ablation))
        else:
            st.warning(f"Not compared with {Path(other_path).name}: {why}.")
    if any(j.running for j in jobs):
        _progress(jobs, names)
        return
    failed = [(n, j.error, k) for n, j, k in zip(names, jobs, keys) if j.error]
    if failed:
        for n, err, _ in failed:
            st.error(f"{n}: {err}")
        if st.button("Run again", key=K.CORPUS_AGAIN):
            for _, _, k in failed:
                CR.jobs().forget(k)
            st.rerun()
        return
    result = CR.result(keys[0])
    if ablation.is_empty:  # what "top N@corpus" specs rank by
        st.session_state.setdefault(K.CORPUS_LAST, {})[path] = keys[0]
    try:
        if result.layout.routes:
            RD.check_intended(intended, result.layout)
    except ValueError as e:
        show_error(e)
        intended = {}
    frozen = CR.frozen(intended)
    tables = CR.tables(keys[0], top, min_count, frozen)
    compared = CR.compared(keys[0], keys[1], top, min_count, frozen) if len(keys) == 2 else None
    other = CR.result(keys[1]) if len(keys) == 2 else None
    if other is not None:  # the summary names both checkpoints (on the page, in summary.csv and corpus.html)
        tables = {**tables, "summary": both_summaries(tables["summary"], other.summary(), (result.model, other.model))}
    st.caption(f"{result.stats.n_rows:,} rows, {result.stats.n_tokens:,} tokens routed in "
               + " and ".join(f"{j.seconds:.2f} s ({n})" for n, j in zip(names, jobs))
               + "; cached per checkpoint, dataset, settings and ablation.")
    if not result.layout.routes:
        st.info(result.description)
    for note in result.notes:
        st.caption(note)
    labels = model.option_labels()
    _downloads(result, tables, compared, other, why, labels)
    _show_pieces(draw_views(corpus_views(tables, compared, tuple(names) if other else (names[0], "")), labels))
