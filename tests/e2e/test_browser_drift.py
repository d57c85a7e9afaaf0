"""The Drift view in Chromium (issue 39's screenshots): it opens on the shipped run
checkpoints/olmoe-tiny-steps (16 experts) and draws a run of 4-expert and of 128-expert x 24-layer
checkpoints given by their run directory. Each shot waits until the view has drawn its curves and its
heatmap. The shots go to a temporary folder; with ROUTESCOPE_DOCS_SHOTS=1 they replace
docs/images/drift*.png:

    ROUTESCOPE_DOCS_SHOTS=1 OMP_NUM_THREADS=1 .venv/bin/python -m pytest --full -q tests/e2e/test_browser_drift.py
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from test_browser import ROOT, _idle, _pick_radio, _ready

pytestmark = pytest.mark.e2e

VIEWPORT = {"width": 1600, "height": 1000}
PAINTED = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
CHARTS_DRAWN = ("n => [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent && "
                "(p.data || []).length && p.querySelector('.main-svg')).length >= n")
SHIPPED_RUN = ROOT / "checkpoints" / "olmoe-tiny-steps"
TEXT = "\n".join(["Once upon a time, there was a little girl named Lily. She loved her toys and her dog.",
                  "Solve this problem: 3x + 5 = 20. Express your answer as a fraction.",
                  "One day a little boy went to the park with his dog and a ball.",
                  "Find the largest prime below fifty, then evaluate the sum and simplify."]) + "\n"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return ROOT / "docs" / "images" if os.environ.get("ROUTESCOPE_DOCS_SHOTS") == "1" else \
        tmp_path_factory.mktemp("drift-shots")


def _run(root, build, steps=(100, 200, 400)):
    """A run directory: `build(path)` writes the first checkpoint; each later one moves every router."""
    from transformers import AutoModelForCausalLM

    build(root / f"step-{steps[0]:04d}")
    shutil.move(root / f"step-{steps[0]:04d}" / "tokenizer.json", root / "tokenizer.json")
    model = AutoModelForCausalLM.from_pretrained(root / f"step-{steps[0]:04d}")
    g = torch.Generator().manual_seed(0)
    for step in steps[1:]:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    p.add_(0.3 * torch.randn(p.shape, generator=g))
        model.save_pretrained(root / f"step-{step:04d}")
    return root


def _shot(page, images, name: str, chart: int = 0) -> None:
    """The viewport with the view's `chart`-th figure (0: the saturation curves, 1: the heatmap) in view."""
    _idle(page)
    page.locator(".js-plotly-plot").nth(chart).scroll_into_view_if_needed()
    page.evaluate(PAINTED)
    page.screenshot(path=str(images / f"{name}.png"))
    assert (images / f"{name}.png").stat().st_size > 10_000


def _drift_on(page, run_dir, data) -> None:
    """The dataset first (a file on the server), then the run: no run starts on the shipped dataset."""
    _pick_radio(page, "Dataset", "File on the server")
    field = page.get_by_label("Path on the server")
    field.fill(str(data))
    field.press("Enter")
    _idle(page)
    box = page.locator("[data-testid='stTextArea']").filter(has_text="Checkpoints of one run").locator("textarea")
    box.fill(str(run_dir))
    box.press("Control+Enter")
    _idle(page)


def test_the_drift_view_is_photographed_at_16_4_and_128_experts(app_url, browser, images, tmp_path):
    pytest.importorskip("transformers")
    from hf_models import hf_model, save_hf
    from scale_models import TOKENIZER, scale_moe
    from routescope.core_models.checkpoint import load_tokenizer_file

    page = browser.new_page(viewport=VIEWPORT)
    page.goto(app_url)
    _ready(page, "updated in")
    page.get_by_role("radio", name="Drift", exact=True).click()
    _idle(page)
    if (SHIPPED_RUN / "run.json").is_file():  # the view opens on the shipped run
        page.wait_for_function(CHARTS_DRAWN, arg=2, timeout=600_000, polling=500)
        _shot(page, images, "drift")
    data = tmp_path / "texts.txt"
    data.write_text(TEXT, encoding="utf-8")
    tok = load_tokenizer_file(TOKENIZER)
    four = _run(tmp_path / "olmoe-4", lambda p: save_hf(hf_model("olmoe", tok.get_vocab_size()), p, tok))
    _drift_on(page, four, data)
    page.get_by_text("3 checkpoints: step-0100, step-0200, step-0400").first.wait_for(timeout=60_000)
    page.wait_for_function(CHARTS_DRAWN, arg=2, timeout=600_000, polling=500)
    _shot(page, images, "drift_4", chart=1)
    wide = _run(tmp_path / "qwen3-128x24", lambda p: scale_moe(p, experts=128, layers=24))
    _drift_on(page, wide, data)
    page.get_by_text("top-8").first.wait_for(timeout=600_000)
    page.wait_for_function(CHARTS_DRAWN, arg=2, timeout=600_000, polling=500)
    _shot(page, images, "drift_128x24", chart=1)
    page.close()
