"""Attribution view: input-token attribution (integrated gradients) and path attribution."""
from __future__ import annotations

import streamlit as st

from routescope.analysis import columns as C
from routescope.analysis.session import Run, decode_tokens

from .. import resources
from .. import state as K
from ..components.figures import attribution_figure, bar_figure, show_token

METHODS = {"integrated gradients (input tokens)": "ig", "exact ablation (paths)": "ablation",
           "Shapley value sampling (paths)": "shapley"}


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
        res = resources.token_attribution(path, mtime, *key)
        toks = shown[:len(res.input_ids)]  # the attributed ids are the run's first ones
        st.plotly_chart(attribution_figure(toks, res.attributions.tolist(),
                                           f"Integrated gradients to log p({show_token(decode_tokens(tokenizer, [token])[0])})"),
                        key="ig_chart", width="stretch")
        st.caption(f"log p = {res.target_log_prob:.4f}; baseline ({res.baseline} embeddings) {res.baseline_log_prob:.4f}; "
                   f"convergence delta {res.convergence_delta:+.5f} ({res.n_steps} steps)")
    else:
        df = resources.path_attribution(path, mtime, *key, method)
        labels = model.option_labels()
        names = [f"{l} · {labels[l][o]}" if l in labels else f"{l}:{o}" for l, o in zip(df[C.LAYER], df[C.OPTION])]
        st.plotly_chart(bar_figure(names, list(df[C.CONTRIBUTION]), f"Contribution to log p ({method})", "nats"),
                        key="path_attr_chart", width="stretch")
        st.dataframe(df, key="path_attr_table", width="stretch")
