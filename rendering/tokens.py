"""HTML for the generated text: every token hoverable with its top-k candidates, and the diff."""
from __future__ import annotations

import html

import pandas as pd

from routescope.analysis.export import columns as C

from routescope.rendering.style import format_prob, show_token

CSS = """
<style>
.rs-text {font-family: ui-monospace, Menlo, monospace; line-height: 2.0; white-space: pre-wrap;}
.rs-tok {padding: 1px 1px; border-radius: 3px; cursor: help;}
.rs-prompt {color: #555;}
.rs-gen {background: #e8f0fb;}
.rs-low {background: #e8f0fb; text-decoration: underline dashed #1F2D3D; text-underline-offset: 3px;}
.rs-changed {background: #f9c0c0; font-weight: 600;}
.rs-added {background: #c8eac8; font-weight: 600;}
</style>
"""


def _span(text: str, cls: str, title: str = "") -> str:
    t = f' title="{html.escape(title, quote=True)}"' if title else ""
    shown = html.escape(text).replace("\n", "⏎\n")  # line breaks stay, and stay visible
    return f'<span class="rs-tok {cls}"{t}>{shown}</span>'


LEGEND = ("Grey: the prompt. Blue: generated, p ≥ 50%; dashed underline: generated while the model was "
          "unsure (p < 50%). Hover a generated token for its top candidates.")


def generation_html(spans, n_prompt: int, steps, decode) -> str:
    """The prompt, then each generated token with a tooltip "girl 99.5% / boy 0.5% / ...".
    `spans`: analysis.runs.session.TokenSpan per group of positions; tokens that decode only together
    (a multi-byte character split over byte tokens) are shown once, as their joint text, with
    every step of the group in the tooltip."""
    by_pos = {s.position: s for s in steps}
    parts = []
    for sp in spans:
        if sp.end <= n_prompt:
            parts.append(_span(sp.text, "rs-prompt"))
            continue
        lines, low = [], False
        for pos in range(max(sp.start, n_prompt), sp.end):
            s = by_pos.get(pos)
            if s is None:
                continue
            cands = "\n".join(f"{show_token(decode(i))}  {format_prob(p)}" for i, p in zip(s.top_ids, s.top_probs))
            lines.append(f"position {s.position}: p = {format_prob(s.prob)}\n{cands}")
            low = low or s.prob < 0.5
        parts.append(_span(sp.text, "rs-low" if low else "rs-gen", "\n\n".join(lines)))
    return CSS + f'<div class="rs-text">{"".join(parts)}</div>'


DIFF_LEGEND = ("Red: a token the other continuation has another token in place of (replaced). Green: a token "
               "only this continuation has (the other has nothing there). Unmarked: the same in both.")


def diff_html(diff: pd.DataFrame, side: str) -> str:
    """One side ("base" or "ablated") of the continuation diff, changed tokens highlighted."""
    token_col = C.BASE_TOKEN if side == "base" else C.ABLATED_TOKEN
    parts = []
    for r in diff.itertuples(index=False):
        tok = getattr(r, token_col)
        if tok is pd.NA or tok is None:
            continue
        cls = "" if r.op == "equal" else ("rs-changed" if r.op == "replace" else "rs-added")
        parts.append(_span(tok, cls, r.op))
    return CSS + f'<div class="rs-text">{"".join(parts) or "<i>(nothing generated)</i>"}</div>'
