"""The documentation's screenshots, taken from the running app (never by hand): each view of the
explorer in Chromium at 1600 x 1000, which docs/views.md and the README show. Each shot waits until its
view has drawn what it is for, so a view that stops drawing fails here instead of leaving a stale
picture in the docs. The suite saves them in a temporary folder (a test run leaves the checkout as it
was); with ROUTESCOPE_DOCS_SHOTS=1 they replace docs/images/<view>.png:

    ROUTESCOPE_DOCS_SHOTS=1 OMP_NUM_THREADS=1 .venv/bin/python -m pytest --full -q tests/e2e/test_docs_screenshots.py
"""
from __future__ import annotations

import os

import pytest

from test_browser import ROOT, _caption_shows, _idle, _pick, _ready
from test_browser_experts import experts_on_file
from test_browser_hf import MODEL_SHOWN

pytestmark = pytest.mark.e2e

DOCS_IMAGES = ROOT / "docs" / "images"
VIEWPORT = {"width": 1600, "height": 1000}
PROMPT = "Once upon a time, there was a little girl named Lily. Solve for x: 3x + 5 = 20."
PAINTED = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
# n visible plotly charts with data, drawn
CHARTS_DRAWN = ("n => [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent && "
                "(p.data || []).length && p.querySelector('.main-svg')).length >= n")
EXPERTS_TEXT = "\n".join(["Once upon a time, there was a little girl named Lily. She loved her toys and her dog.",
                          "Solve this problem: 3x + 5 = 20. Express your answer as a fraction.",
                          "One day a little boy went to the park with his dog and a ball.",
                          "Find the largest prime below fifty, then evaluate the sum and simplify."]) + "\n"


def _view(page, name: str) -> None:
    page.get_by_role("radio", name=name, exact=True).click()
    _idle(page)


def _shot(page, name: str, scroll_to=None) -> None:
    """docs/images/<name>.png of the viewport, after the page has painted (optionally with `scroll_to`,
    a locator, in view)."""
    _idle(page)
    if scroll_to is not None:
        scroll_to.scroll_into_view_if_needed()
    page.evaluate(PAINTED)
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / f"{name}.png"))
    assert (IMAGES / f"{name}.png").stat().st_size > 10_000  # a picture of something, not a blank page


IMAGES = DOCS_IMAGES


@pytest.fixture(autouse=True, scope="module")
def _images_folder(tmp_path_factory):
    """Where the shots go: the docs' folder only when asked (ROUTESCOPE_DOCS_SHOTS=1), else a temporary one."""
    global IMAGES
    IMAGES = DOCS_IMAGES if os.environ.get("ROUTESCOPE_DOCS_SHOTS") == "1" else tmp_path_factory.mktemp("docs-shots")
    yield
    IMAGES = DOCS_IMAGES


def test_every_view_is_photographed_for_the_docs(app_url, browser, tmp_path):
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.goto(app_url)
    _ready(page, "updated in")  # the default checkpoint, papaformer-gumbel-v2, on the Routing view
    box = page.get_by_role("textbox", name="Prompt")
    box.fill(PROMPT)
    box.press("Control+Enter")
    page.wait_for_function("e => [...document.querySelectorAll('.rs-text')].some(x => x.innerText.includes(e))",
                           arg="3x + 5", timeout=60_000)
    page.locator("table.rs-grid").first.wait_for(timeout=60_000)
    page.wait_for_function(CHARTS_DRAWN, arg=1, timeout=60_000)
    _shot(page, "routing")

    _view(page, "Generation")
    page.get_by_text("Every step as a table").first.wait_for(timeout=60_000)
    _shot(page, "generation")

    _view(page, "Attribution")
    page.get_by_role("button", name="Attribute").click()
    page.get_by_text("Convergence delta").first.wait_for(timeout=120_000)
    page.wait_for_function(CHARTS_DRAWN, arg=1, timeout=60_000)
    _shot(page, "attribution", page.locator(".js-plotly-plot").first)

    # one path switched off: the Ablation diff compares the ablated run with the unablated one
    page.get_by_text("Specs (ranges, all but, most used)").click()
    specs = page.get_by_role("textbox", name="Specs")
    specs.fill("*:1")
    specs.press("Control+Enter")
    _caption_shows(page, "drop *:1")
    _view(page, "Ablation diff")
    page.get_by_text("mean KL (nats)").first.wait_for(timeout=60_000)
    page.wait_for_function(CHARTS_DRAWN, arg=1, timeout=60_000)
    _shot(page, "ablation_diff")
    specs.fill("")  # and back to the unablated model for the views below
    specs.press("Control+Enter")
    _caption_shows(page, "Ablation: none")

    _view(page, "Table 6")
    page.locator("[data-testid='stDataFrame']").first.wait_for(timeout=120_000)
    _shot(page, "table6")

    _view(page, "Corpus")  # the first shipped dataset, routed as soon as the view opens
    page.get_by_text("Utilisation, dead and overloaded options").first.wait_for(timeout=300_000)
    page.wait_for_function(CHARTS_DRAWN, arg=1, timeout=60_000)
    _shot(page, "corpus", page.locator(".js-plotly-plot").first)

    _view(page, "Export")
    page.get_by_role("button", name="Routing table (CSV)").wait_for(timeout=60_000)
    _shot(page, "export")

    context.close()

    # the Experts view on a transformers MoE (olmoe-tiny): a small file on the server, measured
    data = tmp_path / "texts.txt"
    data.write_text(EXPERTS_TEXT, encoding="utf-8")
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    experts_on_file(page, app_url, "olmoe-tiny", data, "500", "4")
    page.get_by_role("button", name="Measure expert importance").click()
    page.wait_for_function(CHARTS_DRAWN, arg=3, timeout=600_000, polling=500)
    _shot(page, "experts", page.locator(".js-plotly-plot").first)
    context.close()


def test_the_routing_view_at_128_experts_is_photographed_for_the_docs(extra_checkpoint, app_url, browser):
    """docs/images/routing_128x24.png: the Routing view of a random Qwen3-MoE with 128 experts x 24
    layers, top-8 (tests/scale_models.py, as test_browser_scale builds it): a token x expert matrix
    per layer instead of the categorical grid."""
    pytest.importorskip("transformers")
    from scale_models import scale_moe

    name = "qwen3-moe-128x24"
    extra_checkpoint(name, lambda p: scale_moe(p, experts=128, layers=24))
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.goto(app_url)
    _ready(page, "updated in")
    _pick(page, name)
    page.wait_for_function(MODEL_SHOWN, arg=name, timeout=300_000)
    page.wait_for_function(CHARTS_DRAWN, arg=1, timeout=60_000)
    _shot(page, "routing_128x24", page.locator(".js-plotly-plot").first)
    context.close()
