"""The Experts view with Streamlit's AppTest on olmoe-tiny: a sweep started from the view equals the
analysis run directly, its figures and tables are shown, cancelling leaves the view usable and a
restart resumes; a family without routing layers says so in one line."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from routescope.analysis.inputs import datasets as D
from routescope.analysis.reports.importance import ImportanceSettings, importance
from routescope.app import state as K
from routescope.core_models.checkpoint import load_checkpoint

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app" / "main.py")
CK = ROOT / "checkpoints"
TEXT = "\n".join(["Once upon a time, there was a little girl named Lily. She loved her toys.",
                  "Solve this problem: 3x + 5 = 20. Express your answer as a fraction.",
                  "One day a little boy went to the park with his dog and a ball."]) + "\n"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Cancelled sweeps keep their rows in a cache the next run resumes from: each test gets its own
    (the system temporary directory would carry rows from earlier runs and finish a sweep at once)."""
    import streamlit as st

    from routescope.app.views import experts

    monkeypatch.setattr(experts, "CACHE", tmp_path / "importance-cache")
    st.cache_resource.clear()  # the jobs every session shares, finished ones included


def experts_view(name: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    box = at.selectbox(key=K.CHECKPOINT)
    box.set_value(next(p for p in box.options if Path(p).name == name)).run()
    at.segmented_control(key=K.VIEW).set_value("Experts").run()
    return at


def until_done(at: AppTest, timeout: float = 240) -> AppTest:
    deadline = time.time() + timeout
    while at.get("progress") and time.time() < deadline:
        time.sleep(0.5)
        at.run()
    assert not at.get("progress"), "the sweep did not finish"
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_sweep_from_the_view_equals_the_analysis(tmp_path):
    data = tmp_path / "texts.txt"
    data.write_text(TEXT, encoding="utf-8")
    at = experts_view("olmoe-tiny")
    assert not at.exception, [e.value for e in at.exception]
    at.radio(key=K.EXPERTS_SOURCE).set_value("File on the server").run()
    at.text_input(key=K.EXPERTS_PATH).set_value(str(data)).run()
    at.multiselect(key=K.EXPERTS_LAYERS).set_value(["model.layers.1.mlp.gate", "model.layers.2.mlp.gate"]).run()
    at.number_input(key=K.EXPERTS_DRAWS).set_value(3).run()
    if at.get("selectbox") and any(b.key == K.EXPERTS_METHOD for b in at.selectbox):
        at.selectbox(key=K.EXPERTS_METHOD).set_value("exact").run()  # every expert dropped, as the analysis' default
    at.button(key=K.EXPERTS_RUN).click().run()
    until_done(at)
    shown = next(d.value for d in at.dataframe if isinstance(d.value, pd.DataFrame) and "delta_nll_low" in d.value)
    model, tok = load_checkpoint(CK / "olmoe-tiny")
    want = importance(model, tok, D.load_corpus(data), ImportanceSettings(
        layers=("model.layers.1.mlp.gate", "model.layers.2.mlp.gate"), max_tokens=4000, control_draws=3,
        prune_draws=3))["importance"]
    got = shown.sort_values(["layer", "option"]).reset_index(drop=True)
    assert np.array_equal(got["delta_nll"].to_numpy(), want["delta_nll"].to_numpy())
    assert "outside_control" in got and len(got) == 32
    # heatmap, effects with intervals, proxies; pruning where the rows split into ranking and held-out ones,
    # the estimate scatter where experts were measured both ways
    assert len(at.get("plotly_chart")) >= 3
    at.toggle(key=K.EXPERTS_SORT).set_value(True).run()
    assert not at.exception and len(at.get("plotly_chart")) >= 3


def test_cancel_then_resume(tmp_path, monkeypatch):
    from routescope.app.views import experts

    real, calls = experts.importance, []

    def held_until_cancelled(*args, stop, **kwargs):
        """The first sweep waits for the Cancel click, however fast this machine is (else it could end
        before the click); then the real sweep sees the stop at once. Later sweeps run as they are."""
        calls.append(1)
        deadline = time.time() + 120
        while len(calls) == 1 and not stop() and time.time() < deadline:
            time.sleep(0.05)
        return real(*args, stop=stop, **kwargs)

    monkeypatch.setattr(experts, "importance", held_until_cancelled)
    data = tmp_path / "texts.txt"
    data.write_text(TEXT * 4, encoding="utf-8")
    at = experts_view("olmoe-tiny")
    at.radio(key=K.EXPERTS_SOURCE).set_value("File on the server").run()
    at.text_input(key=K.EXPERTS_PATH).set_value(str(data)).run()
    at.number_input(key=K.EXPERTS_DRAWS).set_value(2).run()
    at.button(key=K.EXPERTS_RUN).click().run()
    assert at.get("progress")
    at.button(key=K.EXPERTS_CANCEL).click().run()
    deadline = time.time() + 120
    while at.get("progress") and time.time() < deadline:
        time.sleep(0.3)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("cancelled" in w.value for w in at.warning)
    at.button(key=K.EXPERTS_RUN).click().run()
    until_done(at)
    assert len(at.get("plotly_chart")) >= 3


def test_a_model_without_routing_layers_says_so():
    at = experts_view("llama-dense")
    assert not at.exception
    assert any("no routing layers" in i.value for i in at.info)


def test_the_ablation_at_the_left_is_said_not_to_apply():
    """The sweep drops each expert alone from the model as it is; with options switched off at the
    left the view says that ablation is not the one measured (and says nothing without one)."""
    at = experts_view("olmoe-tiny")
    assert not any("does not apply here" in i.value for i in at.info)
    path = at.selectbox(key=K.CHECKPOINT).value
    at.text_area(key=K.specs_key(path)).input("*:0").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("does not apply here" in i.value and "drop *:0" in i.value for i in at.info), [i.value for i in at.info]
