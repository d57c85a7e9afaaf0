"""Cancelling an attribution: the analysis loop stops before its next forward once its cancel event is
set (exact ablation one option a forward and several a forward, Shapley sampling, integrated
gradients between batches), and a background `Job` (app/attribution_jobs.py) stops within a forward,
keeping nothing. Forwards are counted by a pre-hook on the test's own model instance, against what a
full run does, counted from the model's config and the method (not from the code under test)."""
from __future__ import annotations

import json
import re
import math
import threading
import time
from pathlib import Path

import pytest

from routescope.analysis.runs.attribution import PathAttribution, Stopped, TokenAttribution
from routescope.app.attribution_jobs import Finished, Job
from routescope.core_models.checkpoint import load_checkpoint
from tiny_models import tiny_model

OLMOE = Path(__file__).resolve().parents[2] / "checkpoints" / "olmoe-tiny"
IDS = [5, 17, 3, 88, 41, 9, 23]
TOKEN = 11


def counted(model):
    """(model, stamps): the perf_counter time of every forward of `model` (the test's own instance)."""
    stamps: list[float] = []
    model.register_forward_pre_hook(lambda module, args: stamps.append(time.perf_counter()))
    return model, stamps


def olmoe():
    model, _ = load_checkpoint(OLMOE, dtype="float32")
    return model


def options_and_rows(name: str) -> tuple[int, int]:
    """Options to ablate and ablations per forward, from the checkpoint's config: moep's layers have 3
    options each and run one ablation a forward; olmoe-tiny (transformers) carries 16 rows a forward."""
    if name == "moep":
        return 4 * 3, 1  # moe_shrink, parallel.0, parallel.1, moe_grow: 3 options each
    cfg = json.loads((OLMOE / "config.json").read_text())
    return cfg["num_experts"] * cfg["num_hidden_layers"], 16


def model_for(name: str):
    return tiny_model("moep") if name == "moep" else olmoe()


@pytest.mark.parametrize("name", ["moep", "olmoe-tiny"])
def test_exact_ablation_stops_before_its_next_forward(name):
    n, rows = options_and_rows(name)
    model, stamps = counted(model_for(name))
    PathAttribution(model).attribute(IDS, 5, TOKEN, method="ablation")
    assert len(stamps) == 1 + math.ceil(n / rows)  # the full model, then the ablations
    stamps.clear()
    cancel, at = threading.Event(), []

    def progress(done: int, total: int) -> None:
        if done >= 2 * rows and not cancel.is_set():  # a Cancel click after the second forward of ablations
            cancel.set()
            at.append(len(stamps))

    with pytest.raises(Stopped, match=f"stopped after {2 * rows} of {n} ablations"):
        PathAttribution(model).attribute(IDS, 5, TOKEN, method="ablation", progress=progress, stop=cancel.is_set)
    assert at == [3] and len(stamps) == 3  # the full model and two of ablations; none after the event


def test_shapley_sampling_stops_before_its_next_forward():
    n, _ = options_and_rows("moep")
    model, stamps = counted(tiny_model("moep"))
    seen: list[tuple[int, int]] = []
    PathAttribution(model).attribute(IDS, 5, TOKEN, method="shapley", n_samples=2,
                                     progress=lambda done, total: seen.append((done, total)))
    total = 1 + 2 * n  # captum: the baseline, then every feature once per sampled permutation
    assert seen == [(i, total) for i in range(1, total + 1)]
    full = len(stamps)
    stamps.clear()
    cancel, at = threading.Event(), []

    def progress(done: int, total: int) -> None:
        if done == 5:
            cancel.set()
            at.append(len(stamps))

    with pytest.raises(Stopped):
        PathAttribution(model).attribute(IDS, 5, TOKEN, method="shapley", n_samples=2, progress=progress,
                                         stop=cancel.is_set)
    assert at and len(stamps) == at[0] < full  # nothing ran after the event


def test_integrated_gradients_stop_between_batches():
    model, stamps = counted(tiny_model("moep"))
    seen: list[tuple[int, int]] = []
    TokenAttribution(model).attribute(IDS, 5, TOKEN, n_steps=16, internal_batch_size=4,
                                      progress=lambda done, total: seen.append((done, total)))
    assert seen == [(4, 16), (8, 16), (12, 16), (16, 16)]  # one call per batch of 4 steps
    stamps.clear()
    cancel, at = threading.Event(), []

    def progress(done: int, total: int) -> None:
        if done == 8:
            cancel.set()
            at.append(len(stamps))

    with pytest.raises(Stopped, match="stopped after 8 of 16 integration steps"):
        TokenAttribution(model).attribute(IDS, 5, TOKEN, n_steps=16, internal_batch_size=4, progress=progress,
                                          stop=cancel.is_set)
    assert at == [len(stamps)]  # no forward after the event


def test_a_cancelled_job_stops_within_a_forward_and_keeps_nothing():
    """A Job on its own thread, cancelled from this one mid-run (as the Cancel button does)."""
    n, rows = options_and_rows("olmoe-tiny")
    model, stamps = counted(olmoe())
    store = Finished()
    spec = ("ablation", "olmoe-tiny", 5, TOKEN)
    slow = threading.Event()

    def work(progress, stop):
        def paced(done: int, total: int) -> None:  # a forward's pace a real model has: the event lands mid-run
            progress(done, total)
            slow.wait(0.05)
        return PathAttribution(model).attribute(IDS, 5, TOKEN, method="ablation", progress=paced, stop=stop,
                                                ablations_per_forward=1)

    job = Job(spec, work, store)
    deadline = time.perf_counter() + 60
    while job.done < 3 and job.running and time.perf_counter() < deadline:
        time.sleep(0.005)
    assert job.running, "the run ended before it could be cancelled"
    t0, before = time.perf_counter(), len(stamps)
    job.cancel.set()
    assert job.finished.wait(10)
    waited = time.perf_counter() - t0
    print(f"job stopped {waited * 1000:.0f} ms after its cancel event, {job.done} of {n} options ablated")
    assert job.stopped and job.result is None and job.error is None and store.get(spec) is None
    assert len(stamps) - before <= 1  # at most the forward already under way
    assert job.done < job.total == n

    again = Job(spec, lambda progress, stop: PathAttribution(model).attribute(IDS, 5, TOKEN, method="ablation",
                                                                             progress=progress, stop=stop), store)
    assert again.finished.wait(60) and not again.stopped and store.get(spec) is again.result
    assert len(again.result) == n and again.done == again.total == n


def test_the_view_shows_progress_and_cancel_stops_it_with_one_line():
    """AppTest: Shapley sampling over olmoe-tiny's 64 experts (1,601 evaluations, seconds) runs as the
    session's job with its progress and a Cancel button; Cancel leaves one "Cancelled" line and no chart
    or table; Attribute runs it again; changing the method stops that run too."""
    from app_driver import fresh, pick, view
    from routescope.app import state as K
    from routescope.app.views import attribution as V

    at = view(pick(fresh(), "olmoe-tiny"), "Attribution")
    at.radio(key=K.ATTR_METHOD).set_value("Shapley value sampling (paths)").run()
    at.button(key="attr_go").click().run()
    assert not at.exception
    job = at.session_state[V.JOB]
    assert job.running, "finished before it could be cancelled"
    assert any("Cancel stops it" in c.value for c in at.caption)
    at.button(key=V.CANCEL).click().run()
    assert not at.exception and not job.running and job.stopped
    (line,) = [i.value for i in at.info if i.value.startswith("Cancelled")]
    done, total = (int(x.replace(",", "")) for x in re.match(r"Cancelled after ([\d,]+) of ([\d,]+) coalitions",
                                                              line).groups())
    assert total == 1 + 25 * 64 and done < total  # captum's evaluations at 25 samples
    assert not at.dataframe and not at.get("plotly_chart")
    at.run()  # the line stays on the next rerun, the table still absent
    assert [i.value for i in at.info if i.value.startswith("Cancelled")] == [line] and not at.dataframe

    at.button(key="attr_go").click().run()  # runs it again: a new job
    again = at.session_state[V.JOB]
    assert again is not job and again.running and not any(i.value.startswith("Cancelled") for i in at.info)
    at.radio(key=K.ATTR_METHOD).set_value("exact ablation (paths)").run()  # another method: nobody waits for it
    assert again.finished.wait(10) and again.stopped


def test_a_job_whose_session_is_gone_stops_within_a_forward_and_keeps_nothing():
    """The browser session that started a job disconnects (a closed tab): `alive()` turns False and the
    job stops before its next forward, as on Cancel, storing nothing."""
    n, _ = options_and_rows("olmoe-tiny")
    model, stamps = counted(olmoe())
    store, spec, gone = Finished(), ("ablation", "olmoe-tiny", 5, TOKEN, "closed"), threading.Event()
    slow = threading.Event()

    def work(progress, stop):
        def paced(done: int, total: int) -> None:
            progress(done, total)
            slow.wait(0.05)
        return PathAttribution(model).attribute(IDS, 5, TOKEN, method="ablation", progress=paced, stop=stop,
                                                ablations_per_forward=1)

    job = Job(spec, work, store, alive=lambda: not gone.is_set())
    deadline = time.perf_counter() + 60
    while job.done < 3 and job.running and time.perf_counter() < deadline:
        time.sleep(0.005)
    assert job.running, "the run ended before its session could go"
    before = len(stamps)
    gone.set()
    assert job.finished.wait(10)
    assert job.stopped and job.cancel.is_set() and job.result is None and store.get(spec) is None
    assert len(stamps) - before <= 1 and job.done < n  # at most the forward already under way


def test_outside_a_streamlit_server_a_session_is_always_alive():
    from routescope.app.attribution_jobs import session_alive

    assert session_alive()() is True  # no runtime here (as under AppTest): jobs stop on Cancel only
