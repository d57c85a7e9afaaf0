"""Ablation diff: the unablated and the ablated continuation side by side, and KL per position."""
from __future__ import annotations

import streamlit as st

from routescope.analysis import columns as C
from routescope.analysis.effects import first_divergence, generation_diff
from routescope.analysis.session import Run

from ..components.figures import kl_figure
from ..components.tokens import diff_html


def show(base: Run, ablated: Run, effects, tokenizer) -> None:
    if ablated.ablation.is_empty:
        st.info("Switch a path, block or expert off (left) to compare against the unablated run.")
        return
    diff = generation_diff(base.generation, ablated.generation, tokenizer)
    # generated tokens of the ablated run that the alignment does not match with the unablated run
    # (alignment rows also hold the unablated run's deletions, which are no tokens of this run)
    changed = int((diff[C.CHANGED] & diff[C.ABLATED_INDEX].notna()).sum())
    first = first_divergence(diff)
    e = effects[effects[C.BATCH] == 0]
    cols = st.columns(4)
    cols[0].metric("changed tokens", f"{changed} of {len(ablated.generation.new_ids)}",
                   help="Generated tokens of the ablated run not matched, in order, by the unablated "
                        "continuation (difflib alignment)")
    cols[1].metric("first divergence", "none" if first is None else f"step {first}")
    cols[2].metric("mean KL (nats)", f"{e[C.KL].mean():.4f}")
    cols[3].metric("top-1 flips", int(e[C.FLIPPED].sum()))
    left, right = st.columns(2)
    left.markdown("**Unablated**")
    left.markdown(diff_html(diff, "base"), unsafe_allow_html=True)
    right.markdown(f"**Ablated** (`{ablated.ablation.describe()}`)")
    right.markdown(diff_html(diff, "ablated"), unsafe_allow_html=True)
    st.plotly_chart(kl_figure(effects, base.tokens), key="kl_chart", width="stretch")
