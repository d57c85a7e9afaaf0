"""Attribution view: input-token attribution (integrated gradients) and path attribution. Each runs as
this session's background job (`app.attribution_jobs`): progress with the time left, and a Cancel
button that stops it before its next forward; a stopped run shows one line and nothing of its rows."""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from routescope.analysis.export import columns as C
from routescope.analysis.runs.attribution import (STEP_CHOICES, PathAttribution, TokenAttribution, by_size,
                                                  delta_share, judge_convergence)
from routescope.analysis.runs.session import Run, decode_tokens

from routescope.app import state as K
from routescope.app.attribution_jobs import Job, Work, finished, session_alive
from routescope.app.messages import show_error
from routescope.rendering.style import TOKEN_WINDOW, show_token
from routescope.rendering.bar_figures import attribution_figure, path_effects_figure, path_effects_table
from routescope.rendering.numbers import convergence_verdict, significant
from routescope.app.views.export import figure_html

METHODS = {"integrated gradients (input tokens)": "ig", "exact ablation (paths)": "ablation",
           "Shapley value sampling (paths)": "shapley"}
DEFAULT_STEPS = 64
# session keys of this view's job (app/state.py holds the widget keys)
JOB = "attr_job"  # this session's Job, running or last finished
NOTE = "attr_note"  # (request, line): how the last run of that request ended when it left no result
CANCEL = "attr_cancel"
POLL_SECONDS = 0.5
QUICK_SECONDS = 1.0  # a run done within this shows its result at once (no progress bar flashes by)
STOP_WAIT = 3.0  # Cancel waits this long at most for the loop to stop (it checks before every forward)
IG_BATCH = 16  # integration steps per forward: IG is cancelled between batches (a single batch of 512 could not)
COUNTED = {"ablation": ("Ablating options one at a time", "options"),
           "shapley": ("Sampling Shapley values", "coalitions evaluated"),
           "ig": ("Integrating gradients", "integration steps")}


def _stop(job: Job | None) -> None:
    if job is not None and job.running:
        job.cancel.set()


@st.fragment(run_every=POLL_SECONDS)
def _progress(job: Job) -> None:
    if not job.running:
        st.rerun()  # the whole page: the result, or the line saying it stopped
    what, unit = COUNTED[job.spec[0]]
    left = job.left()
    spent = time.perf_counter() - job.started
    text = (f"{what}: {job.done:,} of {job.total:,} {unit} · {spent:.0f} s" if job.total else f"{what}…") + \
        (f", about {left:.0f} s left" if left is not None else "")
    st.progress(min(1.0, job.done / job.total) if job.total else 0.0, text=text)
    if st.button("Cancel", key=CANCEL):
        job.cancel.set()
        job.finished.wait(STOP_WAIT)  # the loop stops before its next forward
        st.rerun()
    st.caption("Cancel stops it within about a second, and so does changing the position, the target token or the "
               "method; other clicks, and other views, leave it running.")


def _attribute(request: tuple, spec: tuple, work: Work):
    """The result of `spec` (its first item the method): a finished one at once (any session's),
    else this session's job for it, started here if it has none (stopping another it ran). Shows the
    progress and returns None while it runs; None and one line when it stopped or failed (the
    Attribute button drops that job, to run it again)."""
    store = finished()
    done = store.get(spec)
    if done is not None:
        return done
    job = st.session_state.get(JOB)
    if job is None or job.spec != spec:
        _stop(job)
        job = st.session_state[JOB] = Job(spec, work, store, session_alive())
        job.finished.wait(QUICK_SECONDS)
    if job.running:
        _progress(job)
        return None
    if job.result is not None:
        return job.result
    st.session_state.pop(K.ATTR_RUN, None)  # the button starts it again
    unit = COUNTED[spec[0]][1]
    if job.stopped:
        line = (f"Cancelled after {job.done:,} of {job.total:,} {unit} ({job.seconds:.1f} s): nothing of it is shown; "
                "press Attribute to run it again.")
        st.session_state[NOTE] = (request, line)
        st.info(line)
    else:
        show_error(job.error, "Attribution failed: ")
    return None


def _integrated_gradients(model, request: tuple, path: str, mtime: float, key: tuple, shown: list[str],
                          target: str) -> None:
    n_steps = st.select_slider("Integration steps", STEP_CHOICES, value=DEFAULT_STEPS, key=K.ATTR_STEPS,
                               help="captum's n_steps: points on the path from the baseline to the input. More "
                                    "steps shrink the integral's error (and take longer).")
    ids, position, token = key

    def work(progress, stop):
        return TokenAttribution(model).attribute(list(ids), position, token, n_steps=n_steps,
                                                 internal_batch_size=IG_BATCH, progress=progress, stop=stop)

    res = _attribute(request, ("ig", path, mtime, key, n_steps), work)
    if res is None:
        return
    deltas = st.session_state.setdefault(K.ATTR_DELTAS, {}).setdefault(key, {})
    deltas[res.n_steps] = res.convergence_delta  # this session's record: the delta at each setting tried
    toks = shown[:len(res.input_ids)]  # the attributed ids are the run's first ones: the whole prompt, every one
    fig = attribution_figure(toks, res.attributions.tolist(), f"Integrated gradients to log p({target})")
    st.plotly_chart(fig, key="ig_chart", width="stretch")
    st.caption(f"Every input token, {len(toks)} in rows of {TOKEN_WINDOW} (green raises log p, red lowers it). log p = "
               f"{res.target_log_prob:.4f}; baseline ({res.baseline} embeddings) {res.baseline_log_prob:.4f}; the "
               f"attributions should add up to the difference, {res.total:+.4f} nats. Convergence delta "
               f"{significant(res.convergence_delta, 3)} nats at {res.n_steps} steps; "
               f"{convergence_verdict(res.convergence_delta, res.total)}.")
    said = judge_convergence(deltas, res.total)
    if said:
        st.warning(said)
    if len(deltas) > 1 or said:  # each delta in significant digits, with its verdict ("0.0%" said nothing)
        d = list(deltas.values())
        st.dataframe(pd.DataFrame({"steps": list(deltas), "convergence delta (nats)": d,
                                   "share of the total": [significant(delta_share(x, res.total)) for x in d],
                                   "verdict": [convergence_verdict(x, res.total).split(":")[0] for x in d]})
                     .sort_values("steps"), key="ig_deltas", hide_index=True,
                     column_config={"steps": st.column_config.NumberColumn(help="captum's n_steps"),
                                    "convergence delta (nats)": st.column_config.NumberColumn(format="%.3g")})
    st.download_button("This chart (HTML, works offline)", lambda: figure_html(fig), "integrated_gradients.html",
                       "text/html", key="dl_ig_chart", on_click="ignore")


TOP_PATHS = 40  # bars on the path-attribution chart; the table has every option


def _paths(model, request: tuple, path: str, mtime: float, key: tuple, method: str) -> None:
    ids, position, token = key

    def work(progress, stop):
        return PathAttribution(model).attribute(list(ids), position, token, method=method, progress=progress,
                                                stop=stop)

    df = _attribute(request, (method, path, mtime, key), work)
    if df is None:
        return
    df = by_size(df)  # largest |effect| first
    labels = model.option_labels()
    names = [f"{l} · {labels[l][o]}" if l in labels else f"{l}:{o}" for l, o in zip(df[C.LAYER], df[C.OPTION])]
    shown = min(len(df), TOP_PATHS)
    title = (f"Contribution to log p ({method}), largest |effect| on top"
             + (f": the top {shown} of {len(df):,} options (the table has every one)" if len(df) > shown else ""))
    table, column, unit = path_effects_table(df, names)  # one unit, the chart's and the table's
    st.plotly_chart(path_effects_figure(names[:shown], list(df[C.CONTRIBUTION])[:shown], title, unit=unit),
                    key="path_attr_chart", width="stretch")
    st.dataframe(table, key="path_attr_table", width="stretch", hide_index=True,  # 3 significant digits
                 column_config={column: st.column_config.NumberColumn(format="%.3g")})


def show(run: Run, model, tokenizer, path: str, mtime: float) -> None:
    ids = run.ids
    if len(ids) < 2:
        st.info("Attribution needs at least two tokens.")
        return
    positions = list(range(len(ids) - 1))
    shown = run.display_tokens()  # byte tokens of a multi-byte character as "😀 (1/2)"
    default = min(run.n_prompt - 1, len(positions) - 1)
    pos = st.selectbox("Predict the token after position", positions, index=default, key=K.ATTR_POSITION,
                       format_func=lambda p: f"{p}: …{show_token(shown[p])} → {show_token(shown[p + 1])}")
    step = next((s for s in run.generation.steps if s.position == pos + 1), None)
    cands = [ids[pos + 1]] + ([i for i in step.top_ids if i != ids[pos + 1]] if step else [])
    token = st.selectbox("Target token", cands, key=K.ATTR_TOKEN,
                         format_func=lambda i: show_token(decode_tokens(tokenizer, [i])[0]))
    has_paths = bool(model.routing_layers())
    methods = [m for m, v in METHODS.items() if v == "ig" or has_paths]
    method = METHODS[st.radio("Method", methods, key=K.ATTR_METHOD, horizontal=True)]
    if not run.ablation.is_empty:
        st.info(f"Attribution runs the model without the ablation on the left (`{run.ablation.describe()}`): "
                f"it explains the unablated model's prediction at this position of the ablated run's text.")
    request = (tuple(ids), pos, int(token), method)
    if st.button("Attribute", key="attr_go"):
        st.session_state[K.ATTR_RUN] = request
        st.session_state.pop(NOTE, None)
        if not getattr(st.session_state.get(JOB), "running", True):
            del st.session_state[JOB]  # a stopped or failed run of this request runs again
    if st.session_state.get(K.ATTR_RUN) != request:
        _stop(st.session_state.get(JOB))  # its position, target or method changed: nobody waits for it
        note = st.session_state.get(NOTE)
        if note is not None and note[0] == request:
            st.info(note[1])
        else:
            st.caption("Attribution runs the model many times; press the button to compute it (a long run shows "
                       "its progress and a Cancel button).")
        return
    key = (tuple(ids[:pos + 1]), pos, int(token))
    if method == "ig":
        _integrated_gradients(model, request, path, mtime, key, shown,
                              show_token(decode_tokens(tokenizer, [token])[0]))
    else:
        _paths(model, request, path, mtime, key, method)
