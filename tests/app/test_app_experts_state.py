"""The Experts view with Streamlit's AppTest: an uploaded dataset and the settings are kept across a
view switch and the sweep then runs on that upload; a sweep's tables without the estimate, the
held-out curve or the merge curve leave one caption each, no exception; the time left shows from
the first forward on a random Qwen3-MoE of 128 experts x 24 layers (and the pace it is computed
from is checked on its own)."""
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
UPLOAD = ("Once upon a time, there was a little girl named Lily.\nSolve this problem: 3x + 5 = 20.\n"
          "One day a little boy went to the park with his dog.\n").encode()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test its own cache of measured rows and fresh shared jobs (test_experts_view says why)."""
    import streamlit as st

    from routescope.app.views import experts

    monkeypatch.setattr(experts, "CACHE", tmp_path / "importance-cache")
    st.cache_resource.clear()


def experts_view(name: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240)
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


def captions(at: AppTest) -> list[str]:
    return [c.value for c in at.caption]


def test_the_upload_and_settings_survive_a_view_switch_and_are_used():
    at = experts_view("mixtral-tiny")
    at.radio(key=K.EXPERTS_SOURCE).set_value("Upload a file").run()
    at.file_uploader(key=K.EXPERTS_UPLOAD).set_value(("mine.txt", UPLOAD, "text/plain")).run()
    at.number_input(key=K.EXPERTS_DRAWS).set_value(2).run()
    at.number_input(key=K.EXPERTS_MAX_TOKENS).set_value(300).run()
    assert not at.exception, [e.value for e in at.exception]
    at.segmented_control(key=K.VIEW).set_value("Routing").run()
    at.segmented_control(key=K.VIEW).set_value("Experts").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key=K.EXPERTS_SOURCE).value == "Upload a file"
    assert any("mine.txt" in c and "uploaded earlier" in c for c in captions(at)), captions(at)
    assert at.number_input(key=K.EXPERTS_DRAWS).value == 2 and at.number_input(key=K.EXPERTS_MAX_TOKENS).value == 300
    at.button(key=K.EXPERTS_RUN).click().run()
    until_done(at)
    shown = next(d.value for d in at.dataframe if isinstance(d.value, pd.DataFrame) and "delta_nll_low" in d.value)
    model, tok = load_checkpoint(CK / "mixtral-tiny")
    want = importance(model, tok, D.load_corpus(UPLOAD, "mine.txt"),
                      ImportanceSettings(max_tokens=300, control_draws=2, prune_draws=2))["importance"]
    got = shown.sort_values(["layer", "option"]).reset_index(drop=True)
    assert np.array_equal(got["delta_nll"].to_numpy(), want["delta_nll"].to_numpy(), equal_nan=True)
    assert len(at.get("plotly_chart")) >= 3


def test_older_tables_leave_a_caption_each_never_an_exception(tmp_path, monkeypatch):
    """A sweep whose tables lack the estimate, the held-out columns and the merge curve: the view draws
    what there is and says in one caption each what is missing."""
    from routescope.app.views import experts

    real = experts.importance

    def older(*args, **kwargs):
        res = real(*args, **kwargs)
        t = res.tables
        t["importance"] = t["importance"].drop(columns=["delta_nll_estimate", "method"], errors="ignore")
        t.pop("estimate_agreement", None)
        t.pop("merge_curve", None)
        if "pruning_curve" in t:
            t["pruning_curve"] = t["pruning_curve"].drop(columns=["evaluated_on", "rows"], errors="ignore")
        return res

    monkeypatch.setattr(experts, "importance", older)
    data = tmp_path / "texts.txt"
    data.write_bytes(UPLOAD * 8)  # 24 rows: enough to hold some out
    at = experts_view("mixtral-tiny")
    at.radio(key=K.EXPERTS_SOURCE).set_value("File on the server").run()
    at.text_input(key=K.EXPERTS_PATH).set_value(str(data)).run()
    at.number_input(key=K.EXPERTS_DRAWS).set_value(2).run()
    at.button(key=K.EXPERTS_RUN).click().run()
    until_done(at)
    lines = captions(at)
    assert "This sweep made no first-order estimate (no delta_nll_estimate column)." in lines
    assert any(c.startswith("Pruning judged on the rows that ranked the experts: in-sample (optimistic)") and
               "no merge curve" in c for c in lines), lines
    at.toggle(key=K.EXPERTS_SORT).set_value(True).run()
    assert not at.exception and len(at.get("plotly_chart")) == 4  # heatmap, effects, proxies, pruning


def test_pace_is_the_rate_since_the_first_report():
    from routescope.app.views.experts import Pace, duration

    p = Pace()
    assert p.left() is None
    p.add(10.0, 0.25)  # rows resumed from the cache: a quarter done at the first report
    assert p.left() is None
    p.add(14.0, 0.35)  # 0.1 of the work in 4 s: 0.65 left takes 26 s
    assert p.left() == pytest.approx(4.0 / 0.1 * 0.65)
    assert [duration(s) for s in (0.4, 42, 185, 3720)] == ["0 s", "42 s", "3 min 05 s", "1 h 02 min"]


@pytest.mark.parametrize("method", [None, "exact"])  # the view's default, and every expert dropped exactly
def test_time_left_shows_from_the_first_forward_at_128_experts_by_24_layers(tmp_path, monkeypatch, method):
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from scale_models import scale_moe

    root = tmp_path / "extra"
    scale_moe(root / "qwen3-moe-128x24")
    monkeypatch.setenv("ROUTESCOPE_CHECKPOINTS", str(root))
    at = experts_view("qwen3-moe-128x24")
    at.number_input(key=K.EXPERTS_DRAWS).set_value(1).run()
    if method is not None:
        if not any(b.key == K.EXPERTS_METHOD for b in at.selectbox):
            pytest.skip("this sweep has no method to choose")
        at.selectbox(key=K.EXPERTS_METHOD).set_value(method).run()
    at.button(key=K.EXPERTS_RUN).click().run()
    started, text = time.time(), ""
    while time.time() - started < 60:
        bars = at.get("progress")
        assert bars, "the sweep ended before the time left was seen"
        text = bars[0].proto.text
        if "left" in text and "after the first forward" not in text:
            break
        time.sleep(0.5)
        at.run()
    waited = time.time() - started
    print(f"128 x 24 ({method or 'default'}): '{text}' after {waited:.1f} s")
    assert "left" in text and "after the first forward" not in text, text
    at.button(key=K.EXPERTS_CANCEL).click().run()
    deadline = time.time() + 120
    while at.get("progress") and time.time() < deadline:
        time.sleep(0.5)
        at.run()
    assert not at.exception, [e.value for e in at.exception]


def test_layers_kept_for_one_checkpoint_fall_back_to_all_on_another():
    at = experts_view("mixtral-tiny")
    layers = at.multiselect(key=K.EXPERTS_LAYERS)
    chosen = layers.options[:1]
    layers.set_value(chosen).run()
    box = at.selectbox(key=K.CHECKPOINT)
    box.set_value(next(p for p in box.options if Path(p).name == "papaformer-gumbel-v2")).run()
    assert not at.exception, [e.value for e in at.exception]
    other = at.multiselect(key=K.EXPERTS_LAYERS)
    assert other.value == other.options and other.options  # none of mixtral's layers: every layer of this one
    box = at.selectbox(key=K.CHECKPOINT)
    box.set_value(next(p for p in box.options if Path(p).name == "mixtral-tiny")).run()
    assert not at.exception and at.multiselect(key=K.EXPERTS_LAYERS).value == at.multiselect(
        key=K.EXPERTS_LAYERS).options
