"""The Drift view with Streamlit's AppTest: a run given as a run directory is routed in the background
and shows the saturation curves, the utilisation heatmap and the experts that changed most, with the
numbers `analysis.drift` gives run directly; bad checkpoints are one line; the view opens on the
shipped run checkpoints/olmoe-tiny-steps where it is present."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest

from routescope.analysis import drift as DR
from routescope.analysis.inputs import datasets as D
from routescope.app.views import drift as V
from routescope.core_models.checkpoint import load_tokenizer_file
from hf_models import hf_model, save_hf

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app" / "main.py")
TEXT = "\n".join(["Once upon a time, there was a little girl named Lily. She loved her toys.",
                  "Solve this problem: 3x + 5 = 20. Express your answer as a fraction.",
                  "One day a little boy went to the park with his dog and a ball."]) + "\n"


@pytest.fixture(autouse=True)
def _fresh_jobs():
    """No drift job of an earlier test, and none left running after this one: the view starts one as it
    opens (on the shipped run), which would go on loading checkpoints beside the next tests."""
    import streamlit as st

    st.cache_resource.clear()  # the jobs every session shares, finished ones included
    yield
    for job in list(V.jobs()._jobs.values()):
        job.finished.wait(600)
    st.cache_resource.clear()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Three tiny OLMoE snapshots (routers moving) under one run directory with one tokenizer."""
    tok = load_tokenizer_file(ROOT / "checkpoints" / "tokenizer.json")
    d = tmp_path_factory.mktemp("app-drift") / "run"
    model = hf_model("olmoe", tok.get_vocab_size())
    g = torch.Generator().manual_seed(1)
    for i, step in enumerate((5, 10, 20)):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if i and name.endswith("mlp.gate.weight"):
                    p.add_(0.3 * torch.randn(p.shape, generator=g))
        save_hf(model, d / f"step-{step:04d}")
    tok.save(str(d / "tokenizer.json"))
    return d


def drift_view() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.segmented_control(key="view").set_value("Drift").run()
    return at


def until_done(at: AppTest, timeout: float = 180) -> AppTest:
    deadline = time.time() + timeout
    while at.get("progress") and time.time() < deadline:
        time.sleep(0.5)
        at.run()
    assert not at.get("progress"), "the drift run did not finish"
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_a_run_directory_shows_the_analysis_numbers(tiny_run, tmp_path):
    data = tmp_path / "texts.txt"
    data.write_text(TEXT, encoding="utf-8")
    at = drift_view()
    at.text_area(key=V.RUN).set_value(str(tiny_run)).run()
    at.radio(key=V.SOURCE).set_value(V.SERVER).run()
    at.text_input(key=V.PATH).set_value(str(data)).run()
    until_done(at)
    charts = at.get("plotly_chart")
    assert len(charts) == 2  # saturation; one layer's utilisation heatmap (no labels: no specialisation)
    want = DR.drift(DR.run_checkpoints([tiny_run]), D.load_corpus(data), DR.DriftSettings(max_tokens=64)).tables
    shown = next(d.value for d in at.dataframe if "total_variation" in d.value)
    assert np.allclose(shown["total_variation"].to_numpy(), want["experts"]["total_variation"].head(len(shown)))
    sat = charts[0].proto.spec
    for layer, g in want["saturation"].groupby("layer", sort=False):
        assert f'"name":"{layer}"' in sat  # one curve per layer
    assert at.selectbox(key=V.LAYER).options == list(dict.fromkeys(want["utilisation"]["layer"]))
    at.selectbox(key=V.LAYER).set_value(at.selectbox(key=V.LAYER).options[-1]).run()
    assert not at.exception and len(at.get("plotly_chart")) == 2


def test_bad_checkpoints_are_one_line(tiny_run):
    at = drift_view()
    at.text_area(key=V.RUN).set_value(str(tiny_run / "step-0005")).run()
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "give at least two" in errors[0] and not at.exception
    at.text_area(key=V.RUN).set_value(f"{tiny_run / 'step-0005'}\n{ROOT / 'checkpoints' / 'moep'}").run()
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "another shape" in errors[0] and not at.exception


@pytest.mark.skipif(not (V.SHIPPED_RUN / "run.json").is_file(), reason="no shipped olmoe-tiny-steps run")
def test_the_view_opens_on_the_shipped_run():
    at = drift_view()
    assert at.text_area(key=V.RUN).value == str(V.SHIPPED_RUN)
    until_done(at, timeout=300)
    changed = next(d.value for d in at.dataframe if "total_variation" in d.value)
    assert isinstance(changed, pd.DataFrame) and len(changed) == 20
    assert len(at.get("plotly_chart")) == 3  # saturation, utilisation, label specialisation (story / math)


def _server_file(at: AppTest, tiny_run, tmp_path) -> AppTest:
    data = tmp_path / "texts.txt"
    data.write_text(TEXT, encoding="utf-8")
    at.text_area(key=V.RUN).set_value(str(tiny_run)).run()
    at.radio(key=V.SOURCE).set_value(V.SERVER).run()
    return at.text_input(key=V.PATH).set_value(str(data)).run()


def test_a_cancelled_run_stays_cancelled_until_run_again(tiny_run, tmp_path, monkeypatch):
    routes = DR.checkpoint_routes

    def slowly(*args, **kwargs):  # a checkpoint takes a second: time to click Cancel
        time.sleep(1.0)
        return routes(*args, **kwargs)

    monkeypatch.setattr(DR, "checkpoint_routes", slowly)
    at = _server_file(drift_view(), tiny_run, tmp_path)
    assert at.get("progress")
    at.button(key=V.CANCEL).click().run()
    deadline = time.time() + 60
    while at.get("progress") and time.time() < deadline:
        time.sleep(0.5)
        at.run()
    assert [w.value for w in at.warning] == ["Drift cancelled."] and not at.exception, (
        [w.value for w in at.warning], [e.value for e in at.error], bool(at.get("progress")),
        [(j.running, j.error) for j in V.jobs()._jobs.values()])
    jobs = list(V.jobs()._jobs.values())
    for _ in range(3):  # reruns show the cancelled run; none starts it again
        time.sleep(0.3)
        at.run()
        assert not at.get("progress") and [w.value for w in at.warning] == ["Drift cancelled."]
    assert list(V.jobs()._jobs.values()) == jobs
    at.button(key=V.GO).click().run()
    until_done(at)
    assert len(at.get("plotly_chart")) == 2


def test_a_failed_run_is_shown_once_not_started_again_on_every_rerun(tiny_run, tmp_path, monkeypatch):
    calls = []

    def fails(*args, **kwargs):
        calls.append(1)
        raise ValueError("the checkpoint cannot route this dataset")

    monkeypatch.setattr(DR, "checkpoint_routes", fails)
    at = until_done(_server_file(drift_view(), tiny_run, tmp_path))
    tried = len(calls)  # each run the inputs made on the way (the shipped run the view opened on, ...) once
    for _ in range(3):
        time.sleep(0.3)
        at.run()
    assert [e.value for e in at.error] == ["Drift: the checkpoint cannot route this dataset"]
    assert len(calls) == tried and not at.get("progress")
