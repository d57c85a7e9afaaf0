"""Ablation diff: the unablated and the ablated continuation side by side, and KL per position.

The counts above them share one basis, the generated tokens: "changed tokens" compares the two
continuations (each generated freely), and "top-1 flips" and "mean KL" are measured at the steps
that generated the unablated continuation (it is fed to both models, so the steps line up). The
KL chart below shows every position, prompt included, in rows of TOKEN_WINDOW, with the prompt |
generated line."""
from __future__ import annotations

import streamlit as st

from routescope.analysis.export import columns as C
from routescope.analysis.runs.effects import first_divergence, generation_diff
from routescope.analysis.runs.session import Run

from routescope.rendering.style import DIVIDER_LEGEND, TOKEN_WINDOW
from routescope.rendering.bar_figures import kl_figure
from routescope.rendering.tokens import DIFF_LEGEND, diff_html


def generation_steps(effects, n_prompt: int, n_generated: int):
    """The rows of `effects` (batch 0) whose next-token distribution produced a generated token: the
    distribution at position p predicts token p + 1, so positions n_prompt - 1 .. n_prompt + n - 2."""
    e = effects[effects[C.BATCH] == 0]
    return e[(e[C.POSITION] >= n_prompt - 1) & (e[C.POSITION] < n_prompt - 1 + n_generated)]


def show(base: Run, ablated: Run, effects, tokenizer) -> None:
    if ablated.ablation.is_empty:
        st.info("Switch a path, block or expert off (left) to compare against the unablated run.")
        return
    diff = generation_diff(base.generation, ablated.generation, tokenizer)
    # generated tokens of the ablated run that the alignment does not match with the unablated run
    # (alignment rows also hold the unablated run's deletions, which are no tokens of this run)
    changed = int((diff[C.CHANGED] & diff[C.ABLATED_INDEX].notna()).sum())
    first = first_divergence(diff)
    n_gen = len(base.generation.new_ids)
    steps = generation_steps(effects, base.n_prompt, n_gen)
    cols = st.columns(4)
    cols[0].metric("changed tokens", f"{changed} of {len(ablated.generation.new_ids)}",
                   help="Generated tokens of the ablated run not matched, in order, by the unablated "
                        "continuation (difflib alignment)")
    cols[1].metric("first divergence", "none" if first is None else f"step {first}")
    cols[2].metric("mean KL (nats)", f"{steps[C.KL].mean():.4f}" if len(steps) else "n/a",
                   help="Mean KL(base ‖ ablated) of the next-token distributions at the steps that generated "
                        "the unablated continuation")
    cols[3].metric("top-1 flips", f"{int(steps[C.FLIPPED].sum())} of {len(steps)}",
                   help="Steps of the unablated continuation at which the ablated model's most likely next "
                        "token (argmax id) differs (both models read the same unablated tokens); two tokens tied "
                        "within rounding in either model are no flip")
    st.caption(f"Changed tokens, mean KL and top-1 flips all count the {n_gen} generated tokens (the chart below "
               f"has every position, the prompt's too, in rows of {TOKEN_WINDOW}). Changed tokens compares the two continuations as each "
               f"model generated them; KL and flips are measured with both models reading the unablated "
               f"continuation, so its steps line up.")
    left, right = st.columns(2)
    left.markdown("**Unablated**")
    left.markdown(diff_html(diff, "base"), unsafe_allow_html=True)
    right.markdown(f"**Ablated** (`{ablated.ablation.describe()}`)")
    right.markdown(diff_html(diff, "ablated"), unsafe_allow_html=True)
    st.caption(DIFF_LEGEND)
    st.plotly_chart(kl_figure(effects, base.tokens, base.n_prompt), key="kl_chart", width="stretch")
    st.caption(f"{kl_note(effects)} {DIVIDER_LEGEND}")


def kl_note(effects) -> str:
    """What the KL chart's numbers are: float64 sums clamped at 0 (said with how many were), and what a flip is."""
    clamped, lowest = effects.attrs.get("kl_clamped", 0), effects.attrs.get("kl_lowest", 0.0)
    note = ("KL is summed in float64 and never drawn below zero: "
            + (f"{clamped} position{'s' if clamped != 1 else ''} summed to a rounding-level negative value "
               f"(lowest {lowest:.1e} nats), shown as 0." if clamped else "no position summed below zero."))
    return note + (" A top-1 flip (red) is a change of the most likely token's id; two tokens tied within "
                   "rounding in either model are no flip.")
