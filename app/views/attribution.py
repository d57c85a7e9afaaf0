"""Attribution view: input-token attribution (integrated gradients) and path attribution."""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from routescope.analysis.export import columns as C
from routescope.analysis.runs.attribution import STEP_CHOICES, by_size, delta_share, judge_convergence
from routescope.analysis.runs.session import Run, decode_tokens

from routescope.app import resources
from routescope.app import state as K
from routescope.rendering.style import TOKEN_WINDOW, show_token
from routescope.rendering.bar_figures import attribution_figure, path_effects_figure, path_effects_table
from routescope.rendering.numbers import convergence_verdict, significant
from routescope.app.views.export import figure_html

METHODS = {"integrated gradients (input tokens)": "ig", "exact ablation (paths)": "ablation",
           "Shapley value sampling (paths)": "shapley"}
DEFAULT_STEPS = 64


def _integrated_gradients(path: str, mtime: float, key: tuple, shown: list[str], target: str) -> None:
    n_steps = st.select_slider("Integration steps", STEP_CHOICES, value=DEFAULT_STEPS, key=K.ATTR_STEPS,
                               help="captum's n_steps: points on the path from the baseline to the input. More "
                                    "steps shrink the integral's error (and take longer).")
    res = resources.token_attribution(path, mtime, *key, n_steps)
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


def _paths(model, path: str, mtime: float, key: tuple, method: str) -> None:
    n = sum(model.routing_layers().values())
    bar, t0 = (st.progress(0.0, text=f"Ablating {n:,} options, one forward each…") if method == "ablation" and n > 64
               else None), time.perf_counter()

    def progress(done: int, total: int) -> None:  # a widget click reruns the page, which stops this run
        if bar is not None and (done == total or done % 8 == 0):
            left = (time.perf_counter() - t0) / done * (total - done)
            bar.progress(done / total, text=f"Ablated {done:,} of {total:,} options · about {left:.0f} s left "
                                            "(any click on the page stops it)")

    df = by_size(resources.path_attribution(path, mtime, *key, method, progress=progress))  # largest |effect| first
    if bar is not None:
        bar.empty()
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
    if st.session_state.get(K.ATTR_RUN) != request:
        st.caption("Attribution runs the model many times; press the button to compute it.")
        return
    key = (tuple(ids[:pos + 1]), pos, int(token))
    if method == "ig":
        _integrated_gradients(path, mtime, key, shown, show_token(decode_tokens(tokenizer, [token])[0]))
    else:
        _paths(model, path, mtime, key, method)
