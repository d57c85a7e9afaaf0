"""In a real browser (Debian's Chromium, Playwright): the shipped Hugging Face examples open in
`routescope app` beside our own families; the Routing view draws the transformers routers' top-k
choices, and switching an expert off re-runs the model and redraws. Screenshots to test-artifacts/."""
from __future__ import annotations

import json

import pytest

from test_browser import ARTIFACTS, PLOTS_SHOW, _caption, _idle, _pick, _ready

pytestmark = pytest.mark.e2e
# every visible plotly figure draws a run of this model (layout.meta.model, set by the app)
MODEL_SHOWN = ("m => { const ps = [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent);"
               " return ps.length > 0 && ps.every(p => p.layout && p.layout.meta && p.layout.meta.model === m); }")


@pytest.mark.parametrize("name, layer, boxes", [("mixtral-tiny", "model.layers.0.mlp.gate", True),
                                                ("olmoe-tiny", "model.layers.3.mlp.gate", False)])
def test_the_shipped_hf_example_routes_and_drops_an_expert(app_url, browser, name, layer, boxes):
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(app_url)
    _ready(page, "updated in")
    _pick(page, name)
    page.get_by_role("radio", name="Routing", exact=True).click()
    _idle(page)
    page.wait_for_function(PLOTS_SHOW, arg="none", timeout=60_000)
    page.wait_for_function(MODEL_SHOWN, arg=name, timeout=60_000)  # the previous checkpoint's charts are gone
    plots = json.loads(page.evaluate(
        "() => JSON.stringify([...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent)"
        ".map(p => ({title: (p.layout.title || {}).text || '', y: p.data.map(d => d.y || []), "
        "model: p.layout.meta.model})))"))
    assert {p["model"] for p in plots} == {name}
    heat = [p for p in plots if any(layer in (y or []) for y in p["y"])]
    assert heat, [p["title"] for p in plots]  # the router's layer is a row of the top-k heatmap
    page.screenshot(path=str(ARTIFACTS / f"hf_{name}_routing.png"), full_page=True)
    if boxes:  # 4 experts: a Drop box each
        page.get_by_text("Drop expert 1", exact=True).click()
    else:  # 16 experts: no box per expert; a spec (or the searchable lists)
        box = page.get_by_role("textbox", name="Specs", exact=True)
        box.fill("*:1")
        box.press("Control+Enter")
    page.wait_for_function(PLOTS_SHOW, arg="drop *:1", timeout=60_000)
    assert "drop *:1" in _caption(page)
    page.screenshot(path=str(ARTIFACTS / f"hf_{name}_drop_expert1.png"), full_page=True)
    page.close()
