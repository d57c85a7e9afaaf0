"""End to end in Chromium (Playwright) against `routescope app`: the first paint shows a routing
heatmap without a click (and prints how long a warm server takes to paint it), and the Corpus view
routes an uploaded labelled TSV: per-label shares, dead/overloaded flags, the specialisation table,
papaformer-gumbel-v2 beside -v1, a download of its tables, and a bad upload's one line.
Screenshots go to test-artifacts/ (corpus_*.png)."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from routescope.analysis.export.csv_format import read_frame_csv

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
OPENS = 5  # page opens timed on a warm server
# the Routing view's HTML route grid, visible (painted with the page's first data)
GRID_SHOWN = "() => { const c = document.querySelector('.rs-grid td'); return !!(c && c.offsetParent); }"
# a plotly heatmap drawn in a visible chart (its image exists once plotly has painted the trace)
HEATMAP_DRAWN = ("() => [...document.querySelectorAll('.js-plotly-plot')].some(p => p.offsetParent && "
                 "(p.data || []).some(t => t.type === 'heatmap') && p.querySelector('.heatmaplayer image'))")
PAINTED = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
TSV = ("text\tdomain\n" + "".join(f"{t}\t{d}\n" for t, d in [
    ("Once upon a time, there was a little girl named Lily.", "story"),
    ("She loved to play in the park with her red ball.", "story"),
    ("The dog looked sad and lonely under the big tree.", "story"),
    ("Solve for x: 3x + 5 = 20.", "math"),
    ("What is 12 divided by 4? Express your answer as a fraction.", "math"),
    ("Find the sum of 7 and 15, then simplify the result.", "math"),
]))


def _idle(page) -> None:
    time.sleep(0.3)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)


def open_until_heatmap(browser, url: str) -> tuple[float, float, object]:
    """Seconds from opening a new page until the route grid is painted, until the first plotly
    heatmap is, and the page."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    t0 = time.perf_counter()
    page.goto(url)
    page.wait_for_function(GRID_SHOWN, timeout=120_000, polling="raf")
    page.evaluate(PAINTED)
    grid = time.perf_counter() - t0
    page.wait_for_function(HEATMAP_DRAWN, timeout=120_000, polling="raf")
    page.evaluate(PAINTED)
    return grid, time.perf_counter() - t0, page


def _ms(xs: list[float]) -> str:
    ms = [x * 1000 for x in xs]
    return f"median {statistics.median(ms):.0f} ms ({', '.join(f'{x:.0f}' for x in ms)})"


def test_first_paint_is_a_routing_heatmap(app_url, app_first, browser):
    # the server computes the default run once (unless an earlier test of this run, on the shared server, did)
    _, cold, page = open_until_heatmap(browser, app_url)
    assert page.get_by_role("radio", name="Routing", exact=True).is_checked()
    cells = page.locator(".rs-grid td").count()
    assert cells > 0 and cells % page.locator(".rs-grid th.rs-col").count() == 0  # a cell per token and layer
    page.screenshot(path=str(ARTIFACTS / "corpus_01_first_paint.png"), full_page=True)
    _idle(page)
    # the first switch back to the Routing view on a computed run (the 2.2 s)
    page.get_by_role("radio", name="Generation", exact=True).click()
    page.get_by_text("Every step as a table").first.wait_for(timeout=60_000)
    _idle(page)
    t0 = time.perf_counter()
    page.get_by_role("radio", name="Routing", exact=True).click()
    page.wait_for_function(HEATMAP_DRAWN, timeout=60_000, polling="raf")
    page.evaluate(PAINTED)
    switch = time.perf_counter() - t0
    page.close()
    grids, charts = [], []
    for _ in range(OPENS):
        grid, chart, page = open_until_heatmap(browser, app_url)
        grids.append(grid)
        charts.append(chart)
        page.close()
    print(f"\nfirst heatmap after opening the page on a warm server: route grid {_ms(grids)}; "
          f"plotly chart {_ms(charts)}; first open ({'cold cache' if app_first else 'earlier tests ran'}) "
          f"{cold * 1000:.0f} ms; "
          f"switch to the Routing view on a computed run {switch * 1000:.0f} ms")


def _corpus(page) -> None:
    page.get_by_role("radio", name="Corpus", exact=True).click()
    page.get_by_text("Shipped dataset", exact=True).first.wait_for(timeout=60_000)
    _idle(page)


def _dataset_input(page):
    """The Corpus view's file input (the sidebar's checkpoint upload has one too)."""
    return page.locator("[data-testid='stFileUploader']").filter(has_text="Dataset file").locator("input[type='file']")


def _upload(page, name: str, data: bytes) -> None:
    page.get_by_text("Upload a file", exact=True).click()
    _dataset_input(page).wait_for(state="attached", timeout=30_000)
    _dataset_input(page).set_input_files(files=[{"name": name, "mimeType": "text/plain", "buffer": data}])
    _idle(page)


def test_corpus_view_routes_an_uploaded_tsv_beside_a_second_checkpoint(app_url, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1500, "height": 1100}, accept_downloads=True)
    page.goto(app_url)
    page.wait_for_function(HEATMAP_DRAWN, timeout=120_000)
    _corpus(page)
    # a bad upload: one line, nothing else
    _upload(page, "bad.tsv", b"text\tdomain\nhello\tstory\textra\n")
    err = page.locator("[data-testid='stAlertContentError']").first
    err.wait_for(timeout=30_000)
    assert err.inner_text().strip() == ("Dataset refused: bad.tsv: line 2 has 3 tab-separated fields, the header "
                                        "has 2")
    assert page.get_by_text("Utilisation, dead and overloaded options").count() == 0
    page.screenshot(path=str(ARTIFACTS / "corpus_02_bad_upload.png"), full_page=True)
    # the labelled TSV, compared with papaformer-gumbel-v1
    _dataset_input(page).set_input_files(files=[{"name": "probes.tsv", "mimeType": "text/plain",
                                                 "buffer": TSV.encode()}])
    _idle(page)
    page.locator("[data-testid='stSelectbox']").filter(has_text="Compare with").locator(
        "div[role='combobox'], input").first.click()
    page.get_by_role("option", name="papaformer-gumbel-v1", exact=True).click()
    page.get_by_text("Compared: utilisation, dead and overloaded options").first.wait_for(timeout=120_000)
    _idle(page)
    for heading in ("Routes by label", "Token specialisation", "Co-routing across layers",
                    "Compared: routes by label"):
        assert page.get_by_text(heading, exact=True).count() >= 1, heading
    text = page.locator("body").inner_text()
    assert "probes.tsv: 6 rows" in text
    # dead / overloaded flags and the per-label panels are drawn in the figures
    svg = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(p => p.innerHTML).join(' ')")
    assert "dead" in svg and "Route shares by domain" in svg and "story" in svg and "math" in svg
    assert "papaformer-gumbel-v1 minus papaformer-gumbel-v2" in svg
    page.screenshot(path=str(ARTIFACTS / "corpus_03_compared.png"), full_page=True)
    # the tables download as the one writer's CSV
    page.get_by_text("Download the tables").first.click()
    with page.expect_download(timeout=30_000) as dl:
        page.get_by_role("button", name="label_shares.csv", exact=True).click()
    path = tmp_path / dl.value.suggested_filename
    dl.value.save_as(path)
    shares = read_frame_csv(path)
    assert set(shares["label_value"]) == {"story", "math"} and set(shares["reading"]) == {"token", "last token"}
    with page.expect_download(timeout=30_000) as dl:
        page.get_by_role("button", name="compare_utilisation.csv", exact=True).click()
    path = tmp_path / dl.value.suggested_filename
    dl.value.save_as(path)
    a, b = "papaformer-gumbel-v2", "papaformer-gumbel-v1"  # the downloaded columns say which checkpoint
    assert {f"slot_share ({a})", f"slot_share ({b})", f"slot_share ({b} − {a})", f"dead ({a})", f"dead ({b})"
            } <= set(read_frame_csv(path).columns)
    page.close()
