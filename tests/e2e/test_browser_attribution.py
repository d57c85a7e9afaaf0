"""In Chromium (Playwright) against the shared `routescope app`: an exact-ablation attribution over the
3,072 options of a random Qwen3-MoE with 128 experts x 24 layers (top-8; saved into the server's extra
checkpoint root, as test_browser_scale's) runs with its progress and a Cancel button, and Cancel stops
it: the page says so in one line and shows no table or chart of it. Prints the time from the click to
that line (read it with `pytest -s`). Screenshots: test-artifacts/attribution_cancel_*.png."""
from __future__ import annotations

import re
import time

import pytest

from test_browser import ARTIFACTS, _idle, _pick, _pick_radio, _ready

pytestmark = pytest.mark.e2e
pytest.importorskip("transformers")
from scale_models import scale_moe  # noqa: E402

NAME = "qwen3-moe-128x24"
OPTIONS = 128 * 24


@pytest.fixture(scope="module")
def wide_root(extra_checkpoint):
    """The shared app's extra checkpoint root, holding qwen3-moe-128x24 (test_browser_scale's model)."""
    return extra_checkpoint(NAME, lambda p: scale_moe(p, experts=128, layers=24)).parent


def test_cancel_stops_an_exact_ablation_attribution(wide_root, app_url, browser):
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(app_url)
    _ready(page, "updated in")
    _pick(page, NAME)
    page.get_by_role("radio", name="Attribution", exact=True).click()
    _ready(page, "Predict the token after position", timeout=300_000)
    _idle(page)
    _pick_radio(page, "Method", "exact ablation (paths)")
    page.get_by_role("button", name="Attribute").click()
    cancel = page.get_by_role("button", name="Cancel", exact=True)
    cancel.wait_for(timeout=120_000)
    page.get_by_text(re.compile(rf"Ablating options one at a time: [1-9][\d,]* of {OPTIONS:,} options")).first \
        .wait_for(timeout=120_000)  # under way: some options ablated
    assert page.get_by_text("Cancel stops it within about a second", exact=False).count()
    page.screenshot(path=str(ARTIFACTS / "attribution_cancel_progress.png"), full_page=False)
    t0 = time.perf_counter()
    cancel.click()
    said = page.get_by_text(re.compile(r"^Cancelled after [\d,]+ of [\d,]+ options")).first
    said.wait_for(timeout=120_000)
    seconds = time.perf_counter() - t0
    text = said.inner_text()
    done, total = (int(x.replace(",", "")) for x in re.match(r"Cancelled after ([\d,]+) of ([\d,]+)", text).groups())
    print(f"\n{NAME}: Cancel to the page saying it stopped: {seconds:.2f} s ({done:,} of {total:,} options ablated)")
    page.screenshot(path=str(ARTIFACTS / "attribution_cancel_stopped.png"), full_page=False)
    assert total == OPTIONS and 0 < done < total  # stopped, not run to its end
    assert seconds < 30  # generous (the whole run: 8 s alone, about 16 s in the busy app): done < total is the proof
    _idle(page)
    assert cancel.count() == 0
    assert page.evaluate("() => ![...document.querySelectorAll('.js-plotly-plot')].some(p => "
                         "((p.layout && p.layout.title && p.layout.title.text) || '').includes('Contribution to log p'))")
    assert page.locator("[data-testid='stDataFrame']").count() == 0  # no partial table
    page.close()
