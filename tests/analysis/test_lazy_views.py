"""A run's views are computed when a page first asks for one, once, whichever sessions ask: a toggle
on a page that shows no routing view runs no routing analysis (the app caches one run for every
browser session)."""
from __future__ import annotations

import threading

import pandas as pd

from routescope.analysis.runs import routing as R
from routescope.analysis.runs.session import RunSettings, run_prompt

from tiny_models import tiny_model


class Tok:
    """A tokenizer stand-in for the tiny models' 97-id vocabulary: one id per character."""

    def encode(self, text):
        return type("E", (), {"ids": [ord(c) % 90 for c in text]})()

    def decode(self, ids):
        return "".join(chr(32 + i) for i in ids)


def counted(monkeypatch, name: str):
    """Counts the calls of routing analysis `name`; (the counter, the function itself)."""
    calls = [0]
    real = getattr(R, name)

    def wrapper(*a, **k):
        calls[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(R, name, wrapper)
    return calls, real


def test_a_view_is_computed_when_asked_for_and_once(monkeypatch):
    calls, coselection = counted(monkeypatch, "topk_coselection")
    model = tiny_model("moep")
    run = run_prompt(model, Tok(), "Once upon", settings=RunSettings(max_new_tokens=2), table=False)
    assert calls[0] == 0  # nothing shown yet: not computed
    frame = run.views["topk_coselection"].frame
    assert calls[0] == 1 and isinstance(frame, pd.DataFrame)
    assert run.views["topk_coselection"].frame is frame and calls[0] == 1  # kept
    names = list(run.views)  # a page showing every view computes the rest, not this one again
    assert "topk_coselection" in names and calls[0] == 1
    # the frame computing it directly from the run's trace gives
    pd.testing.assert_frame_equal(frame, coselection(run.generation.trace, model))


def test_sessions_asking_at_once_share_one_computation(monkeypatch):
    calls, _ = counted(monkeypatch, "topk_utilisation")  # read by two views: utilisation and balance
    model = tiny_model("moep")
    run = run_prompt(model, Tok(), "Once upon", settings=RunSettings(max_new_tokens=2), table=False)
    barrier = threading.Barrier(8)
    got = []

    def ask():
        barrier.wait()
        got.append((run.views["topk_utilisation"].frame, run.views["topk_balance"].frame))
    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls[0] == 1 and len({id(u) for u, _ in got}) == 1 and len({id(b) for _, b in got}) == 1


def test_a_view_with_nothing_to_show_is_left_out():
    model = tiny_model("moep")  # 4 options a layer: not "many", so no token x option matrix
    run = run_prompt(model, Tok(), "Once upon", settings=RunSettings(max_new_tokens=2), table=False)
    assert "topk_probs" not in run.views and "topk_probs" not in list(run.views)
    assert len(run.views) == len(list(run.views)) and "topk_routes" in run.views


def test_wiolas_merge_pass_runs_only_when_a_merge_view_is_asked_for():
    """run_prompt leaves Wiola's second pass (token merging on) until a merge view is first read, runs
    it once for both merge views, and gives the frames the eager pass gives."""
    from routescope.analysis.families import wiola as A
    from routescope.core_models.ablation import Ablation

    model = tiny_model("wiola")
    options = {"atm_tau": -1.0}  # every adjacent pair merges: the merge views have rows
    calls = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(bool(kwargs.get("atm"))),
                                           with_kwargs=True)
    try:
        r = run_prompt(model, Tok(), "a b c d e f g", settings=RunSettings(max_new_tokens=2, options=tuple(options.items())),
                       table=False)
        assert not any(calls)  # generation's forwards only
        merges, summary = r.views["atm_merges"].frame, r.views["atm_summary"].frame
        assert sum(calls) == 1
        list(r.views)
        assert sum(calls) == 1
    finally:
        hook.remove()
    eager = A.wiola_views(r.generation.trace, model, options=options,
                          second=A.wiola_merge_pass(model, r.generation.ids, Ablation(), options))
    pd.testing.assert_frame_equal(merges, eager["atm_merges"].frame)
    pd.testing.assert_frame_equal(summary, eager["atm_summary"].frame)
