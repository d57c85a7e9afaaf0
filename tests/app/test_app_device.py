"""The app runs models where `routescope app --device/--dtype` says (environment of the Streamlit
process) and shows it in the sidebar."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from charts import heatmap_titles

APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


def run_app(monkeypatch, device: str | None, dtype: str | None) -> AppTest:
    for name, value in (("ROUTESCOPE_DEVICE", device), ("ROUTESCOPE_DTYPE", dtype)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    return at


def sidebar_device(at: AppTest) -> str:
    return next(c.value for c in at.sidebar.caption if c.value.startswith("Device:"))


def test_the_sidebar_shows_the_resolved_default_device(monkeypatch):
    import torch

    at = run_app(monkeypatch, None, None)
    assert not at.exception, [e.value for e in at.exception]
    want = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert sidebar_device(at) == f"Device: {want} · dtype as stored (auto)"  # --dtype auto: the checkpoint's own


def test_a_bfloat16_app_runs_the_prompt_and_its_views(monkeypatch):
    at = run_app(monkeypatch, "cpu", "bfloat16")
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert sidebar_device(at) == "Device: cpu · bfloat16"
    assert len(at.get("plotly_chart")) >= 1  # the default run's candidates chart, from a bfloat16 model
    at.segmented_control(key="view").set_value("Routing").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert len(heatmap_titles(at)) == 2  # Gumbel routes and cosine dominance, from a bfloat16 model


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_a_missing_device_is_named_in_the_sidebar(monkeypatch):
    at = run_app(monkeypatch, "cuda", "float32")
    assert "not available" in sidebar_device(at)
