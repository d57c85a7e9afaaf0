"""Generation view: hoverable continuation, per-step candidates and the next-token chart."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from routescope.analysis.runs.session import Run, candidates_table, decode_tokens

from routescope.app import state as K
from routescope.rendering.style import format_prob, show_token
from routescope.rendering.bar_figures import candidates_figure
from routescope.rendering.tokens import LEGEND, generation_html


def text(run: Run, tokenizer) -> None:
    """The prompt and its continuation, hoverable, with the run's notes (e.g. a truncated prompt);
    the Routing view shows it above the heatmap."""
    for note in run.notes:
        st.warning(note)
    decode = lambda i: decode_tokens(tokenizer, [i])[0]  # noqa: E731
    st.markdown(generation_html(run.spans, run.n_prompt, run.generation.steps, decode), unsafe_allow_html=True)
    st.caption(LEGEND)


def show(run: Run, tokenizer) -> None:
    text(run, tokenizer)
    steps = run.generation.steps
    if not steps:
        st.info("No tokens generated (max new tokens is 0).")
        return
    options = list(range(len(steps)))
    shown = run.display_tokens()  # a byte token of a multi-byte character as "😀 (1/2)", not U+FFFD
    pick = st.select_slider("Generated token", options, key=K.STEP,
                            format_func=lambda i: f"{i}: {show_token(shown[steps[i].position])}")
    s = steps[pick]
    texts = decode_tokens(tokenizer, s.top_ids)
    st.plotly_chart(candidates_figure(texts, s.top_probs, s.token_id, s.position, ids=s.top_ids),
                    key="candidates_chart", width="stretch")
    with st.expander("Every step as a table"):
        st.dataframe(steps_table(run, tokenizer, shown), width="stretch", key="steps_table", hide_index=True)


def steps_table(run: Run, tokenizer, shown: list[str]) -> pd.DataFrame:
    """One row per generated token: the token, its probability, then each candidate in a column of
    its own ("#1", "#2", ...; text and probability, `format_prob`), so none is cut off."""
    table = candidates_table(run, tokenizer)
    ranked = (table.assign(cell=[f"{show_token(c)}  {format_prob(p)}" for c, p in zip(table.candidate, table.prob)])
              .pivot(index="step", columns="rank", values="cell").rename(columns=lambda r: f"#{r + 1}"))
    steps = run.generation.steps
    front = pd.DataFrame({"token": [show_token(shown[s.position]) for s in steps],
                          "p": [format_prob(s.prob) for s in steps]}, index=range(len(steps)))
    return front.join(ranked).fillna("")
