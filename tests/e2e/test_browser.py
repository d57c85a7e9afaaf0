"""End to end in a real browser: Debian's Chromium driven by Playwright against `routescope app`.

Starts the app on a free local port, enters a prompt, switches a path off, downloads the routing
CSV and checks it, then walks through what a new user stumbled on (issue 13: Generate button,
ablations per checkpoint, one numbering, legends, multi-byte text, attribution and Table 6 exports);
screenshots go to test-artifacts/ (10-15: issue 23's explorer edges at 1600 x 1000). Also prints the
toggle-to-update times it measured, 5 uncached toggles per checkpoint (read them with `pytest -s`; benchmarks/bench_ablation.py
parses that line).
"""
from __future__ import annotations

import csv
import re
import statistics
import time
from pathlib import Path

import pytest

from routescope.analysis.export.table_files import read_csv

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
TOGGLE_REPEATS = 5  # uncached toggles timed per checkpoint (seeds 0..4)
# every visible plotly figure carries the ablation of the run it draws (layout.meta, set by the app)
PLOTS_SHOW = ("e => { const ps = [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent);"
              " return ps.length > 0 && ps.every(p => p.layout && p.layout.meta && p.layout.meta.ablation === e); }")
PROMPT_64 = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her red "
             "ball. One sunny Sunday, Lily saw a small dog near the big tree. The dog looked sad and lonely. "
             "Lily walked over and said, \"Hello, dear little dog!")  # 64 tokens with the shipped tokenizer (checked below)


def _ready(page, text: str, timeout: float = 60_000) -> None:
    page.get_by_text(text, exact=False).first.wait_for(timeout=timeout)


def _caption(page) -> str:
    return page.locator("[data-testid='stCaptionContainer']", has_text="Ablation:").first.inner_text()


def _caption_shows(page, text: str, timeout: float = 60_000) -> None:
    """Wait until the ablation caption reads `text` (a stale caption of the previous run may linger)."""
    page.wait_for_function(
        "e => [...document.querySelectorAll('[data-testid=\"stCaptionContainer\"]')]"
        ".some(c => c.innerText.startsWith('Ablation:') && c.innerText.includes(e))", arg=text, timeout=timeout)


def _pick(page, name: str) -> None:
    page.locator("[data-testid='stSelectbox']").filter(has_text="Checkpoint").locator("div[role='combobox'], input").first.click()
    page.get_by_role("option", name=name, exact=True).click()
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)
    _ready(page, "updated in")


def _idle(page) -> None:
    """Wait until Streamlit has finished the rerun in flight (its status widget is gone)."""
    time.sleep(0.3)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)


def _toggle_time(page, label: str, expect: str) -> tuple[float, float]:
    """Click a checkbox and wait until the ablation caption and every visible routing figure show it,
    drawn and painted (the ablated run is not cached yet: this is a full re-run: generation, trace,
    analyses, then the browser's redraw).
    Returns (seconds in the browser, the server-side run's seconds from the app's caption)."""
    _idle(page)
    t0 = time.perf_counter()
    page.get_by_text(label, exact=True).click()
    page.wait_for_function(
        "e => [...document.querySelectorAll('[data-testid=\"stCaptionContainer\"]')]"
        ".some(c => c.innerText.includes(e))", arg=expect, timeout=30_000)
    page.wait_for_function(PLOTS_SHOW, arg=expect, timeout=30_000)  # checked once per frame, after drawing
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")  # painted
    elapsed = time.perf_counter() - t0
    return elapsed, float(re.search(r"updated in (\d+) ms", _caption(page))[1]) / 1000


def _set_seed(page, seed: int) -> None:
    field = page.get_by_label("Seed")
    field.fill(str(seed))
    field.press("Enter")
    _idle(page)


def _repeat_toggle_times(page, label: str, expect: str, seeds: range) -> tuple[list, list]:
    """More uncached toggles: with the box off, a new seed (a new cache key, same work: decoding is
    greedy and routing deterministic), then time switching the box on. Switching it off again
    lands on a run already cached: those times are the app's and browser's floor."""
    uncached, cached = [], []
    for seed in seeds:
        cached.append(_toggle_time(page, label, "none"))  # off: the previous seed's base run is cached
        _set_seed(page, seed)
        uncached.append(_toggle_time(page, label, expect))
    _set_seed(page, 0)
    return uncached, cached


def _summary(seconds: list[float]) -> str:
    ms = [t * 1000 for t in seconds]
    return f"median {statistics.median(ms):.0f} ms ({', '.join(f'{x:.0f}' for x in ms)})"


def test_prompt_toggle_download(app_url, browser, tmp_path):
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1500, "height": 1000}, accept_downloads=True)
    page.goto(app_url)
    _ready(page, "updated in")
    page.screenshot(path=str(ARTIFACTS / "01_first_load.png"), full_page=True)

    _pick(page, "pgpt")
    box = page.get_by_role("textbox", name="Prompt")
    box.fill("Solve for x: 3x + 5 = 20.")
    box.press("Control+Enter")
    page.wait_for_function("() => [...document.querySelectorAll('.rs-text')].some(e => e.innerText.includes('3x + 5'))",
                           timeout=60_000)
    page.get_by_role("radio", name="Routing", exact=True).click()
    page.screenshot(path=str(ARTIFACTS / "02_pgpt_routing.png"), full_page=True)

    pgpt_times = [_toggle_time(page, "Drop path 1", "drop *:1")]  # pgpt-1 of the paper: path 0 alone
    assert "drop *:1" in _caption(page)
    page.get_by_role("radio", name="Ablation diff", exact=True).click()
    page.get_by_text("mean KL (nats)").first.wait_for(timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "03_pgpt1_diff.png"), full_page=True)

    page.get_by_role("radio", name="Export", exact=True).click()
    with page.expect_download(timeout=30_000) as dl:
        page.get_by_role("button", name="Routing table (CSV)").click()
    path = tmp_path / dl.value.suggested_filename
    dl.value.save_as(path)
    rows = list(csv.DictReader(path.open(encoding="utf-8", newline="")))
    assert rows and rows[0]["model"] == "pgpt" and rows[0]["ablation"] == "drop *:1"
    assert {"prompt", "generated"} <= {r["phase"] for r in rows}  # per-call rows (path weights) have none
    table = read_csv(path)  # the documented reader gives the typed table back
    assert table["token"].str.strip().eq("3").any() and (table["ablation"] == "drop *:1").all()
    page.get_by_role("radio", name="Routing", exact=True).click()
    more, pgpt_cached = _repeat_toggle_times(page, "Drop path 1", "drop *:1", range(1, TOGGLE_REPEATS))
    pgpt_times += more

    # a PaPaformer checkpoint with a 64-token prompt: toggle a path and time the update. The pgpt
    # box is still ticked: another checkpoint starts with no ablation (nothing carries over)
    _pick(page, "papaformer-gumbel-v2")
    _caption_shows(page, "Ablation: none")
    _idle(page)
    assert not any(c.is_checked() for c in page.get_by_role("checkbox", name="Drop path 1").all())
    from tokenizers import Tokenizer
    assert len(Tokenizer.from_file(str(ROOT / "checkpoints" / "tokenizer.json")).encode(PROMPT_64).ids) == 64
    box.fill(PROMPT_64)
    page.get_by_role("button", name="Generate").click()
    page.get_by_role("radio", name="Generation", exact=True).click()
    page.wait_for_function("() => [...document.querySelectorAll('.rs-text')].some(e => e.innerText.includes('Sunday'))",
                           timeout=60_000)
    page.get_by_role("radio", name="Routing", exact=True).click()
    papa_times = [_toggle_time(page, "Drop path 0", "drop *:0")]
    page.screenshot(path=str(ARTIFACTS / "04_papaformer_drop_path0.png"), full_page=True)
    more, papa_cached = _repeat_toggle_times(page, "Drop path 0", "drop *:0", range(1, TOGGLE_REPEATS))
    papa_times += more
    (pgpt_browser, pgpt_server), (papa_browser, papa_server) = zip(*pgpt_times), zip(*papa_times)
    print(f"\ntoggle-to-update in the browser: pgpt {_summary(pgpt_browser)}, "
          f"papaformer-gumbel-v2 {_summary(papa_browser)}; of which server-side run: "
          f"pgpt {_summary(pgpt_server)}, papaformer-gumbel-v2 {_summary(papa_server)}")
    print(f"toggle back to a cached run: pgpt {_summary([t for t, _ in pgpt_cached])}, "
          f"papaformer-gumbel-v2 {_summary([t for t, _ in papa_cached])}")
    page.close()


def test_downloads_clicked_close_together_all_arrive(app_url, browser, tmp_path):
    """Six downloads clicked 0.1 to 1 s apart (figure pages are deferred: rendered on the click)
    all arrive, and the server logs no MediaFileStorageError. A download used to rerun the app,
    which revoked the deferred figure downloads the page still offered: a click during that rerun
    got nothing (1 s on a slow machine, 0.1 s here). The figure pages carry plotly.js inline (they
    work offline) and load no script from elsewhere."""
    from routescope.analysis.export.plotly_bundle import plotly_js as get_plotlyjs  # the bundle pages inline

    log = ARTIFACTS / "routescope.app.log"
    log_start = log.stat().st_size if log.exists() else 0
    page = browser.new_page(viewport={"width": 1500, "height": 1000}, accept_downloads=True)
    got = []
    page.on("download", lambda d: got.append(d))
    page.goto(app_url)
    _ready(page, "updated in")
    page.get_by_role("radio", name="Export", exact=True).click()
    page.get_by_role("button", name="cosine_dominance.html").wait_for(timeout=60_000)
    _idle(page)
    fig_a, csv_, fig_b = "gumbel_routes.html", "Routing table (CSV)", "cosine_dominance.html"
    clicks = [(0.0, fig_a), (0.1, csv_), (0.1, fig_b), (0.3, fig_a), (1.0, fig_b), (1.0, csv_)]  # (s after the last)
    labels = [label for _, label in clicks]
    for gap, label in clicks:
        time.sleep(gap)
        page.get_by_role("button", name=label, exact=True).click()
    deadline = time.time() + 60
    while len(got) < len(labels) and time.time() < deadline:
        page.wait_for_timeout(200)
    names = [d.suggested_filename for d in got]
    assert len(got) == len(labels), names
    # a deferred page arrives after the server rendered it, so a static file clicked later can be first
    want = {"gumbel_routes.html": fig_a, "routing.csv": csv_, "cosine_dominance.html": fig_b}
    assert sorted(want[n.split("_base_")[-1]] for n in names) == sorted(labels)
    plotly_js = get_plotlyjs()
    for d in got:
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}_{d.suggested_filename}"
        d.save_as(path)
        if path.suffix == ".html":
            html = path.read_text(encoding="utf-8")
            assert plotly_js in html and not re.search(r"<script[^>]*\bsrc\s*=", html)
        else:
            assert read_csv(path)["token"].notna().any()
    page.close()
    with log.open(encoding="utf-8", errors="replace") as f:
        f.seek(log_start)
        new_log = f.read()
    assert "MediaFileStorageError" not in new_log and "not found" not in new_log, new_log[-2000:]


def test_tables_offer_no_raw_csv_export(app_url, browser):
    """st.dataframe's own "Download as CSV" writes cells raw (a probe prompt "=cmd|..." would run in a
    spreadsheet); the app turns it off (.streamlit/config.toml), so every CSV comes from Export."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(app_url)
    _ready(page, "updated in")
    page.get_by_role("radio", name="Table 6", exact=True).click()
    table = page.locator("[data-testid='stDataFrame']").first
    table.wait_for(timeout=60_000)
    table.hover()
    page.locator("[data-testid='stElementToolbarButton']").first.wait_for(timeout=10_000)  # the toolbar is up
    assert page.get_by_role("button", name="Download as CSV").count() == 0
    page.close()


def _text_of(page, selector: str) -> str:
    return page.locator(selector).first.inner_text()


def test_what_a_new_user_meets(app_url, browser):
    """The app details of issue 13, item 4, as a new user meets them (screenshots 05-09)."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(app_url)
    _ready(page, "updated in")
    # a Generate button, and typing alone runs nothing
    box = page.get_by_role("textbox", name="Prompt")
    box.fill("Hello 👋🏽 🦄 שלום עולם")
    _idle(page)
    assert "🦄" not in _text_of(page, ".rs-text")
    page.get_by_role("button", name="Generate").click()
    page.wait_for_function("() => [...document.querySelectorAll('.rs-prompt')].some(e => e.innerText.includes('🦄'))",
                           timeout=60_000)
    prompt_text = "".join(page.locator(".rs-prompt").all_inner_texts())
    assert prompt_text == "Hello 👋🏽 🦄 שלום עולם" and "\ufffd" not in prompt_text  # characters, not U+FFFD
    assert "dashed underline" in page.get_by_text("Hover a generated token").first.inner_text()
    page.screenshot(path=str(ARTIFACTS / "05_multibyte_prompt_and_legend.png"), full_page=True)

    # one numbering: labels, specs and captions count from 0
    page.get_by_text("Drop path 1", exact=True).click()
    page.wait_for_function("() => document.body.innerText.includes('drop path 1 everywhere')", timeout=60_000)
    assert "drop *:1" in _caption(page)
    page.get_by_role("radio", name="Routing", exact=True).click()
    page.get_by_text("the prompt ends there").first.wait_for(timeout=60_000)  # the divider's legend
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(p => p.layout && "
                           "(p.layout.shapes || []).some(s => s.name === 'prompt | generated'))", timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "06_routing_divider_legend.png"), full_page=True)

    page.get_by_role("radio", name="Ablation diff", exact=True).click()
    metric = page.locator("[data-testid='stMetric']", has_text="changed tokens").first
    metric.wait_for(timeout=60_000)
    changed, total = map(int, re.search(r"(\d+) of (\d+)", metric.inner_text()).groups())
    assert 0 <= changed <= total
    page.get_by_role("radio", name="Attribution", exact=True).click()
    page.get_by_text("without the ablation on the left").first.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "07_attribution_says_no_ablation.png"), full_page=True)

    # Table 6 exports without opening the Table 6 view first
    page.get_by_role("radio", name="Export", exact=True).click()
    page.get_by_role("button", name="Table 6 report (CSV)").wait_for(timeout=120_000)
    page.screenshot(path=str(ARTIFACTS / "08_export_table6_offered.png"), full_page=True)

    # another checkpoint: nothing ticked carries over; MoEP labels experts and blocks apart
    _pick(page, "moep")
    _caption_shows(page, "Ablation: none")
    _idle(page)
    assert not any(c.is_checked() for c in page.get_by_role("checkbox", name="Drop expert 1 / block 1").all())
    page.get_by_text("Per layer").first.click()
    page.get_by_text("moe_shrink: drop").first.wait_for(timeout=30_000)
    page.locator("[data-testid='stMultiSelect']").filter(has_text="moe_shrink: drop").locator("input").first.click()
    page.get_by_role("option", name="expert 0", exact=True).wait_for(timeout=30_000)
    page.keyboard.press("Escape")
    page.screenshot(path=str(ARTIFACTS / "09_moep_experts_and_blocks.png"), full_page=True)
    page.close()


# --- issue 23: the explorer's rough edges, as a new user at 1600 x 1000 meets them ----------------

DEFAULT_PROMPT = "Once upon a time, there was a little"  # app/main.py's (importing it would start the app)
# every visible chart as the browser drew it: its traces, tick labels and annotations where they are
CHARTS = """() => [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent).map(p => {
  const r = p.getBoundingClientRect(), L = p._fullLayout;
  const box = e => e.getBoundingClientRect();
  return {title: ((L.title && L.title.text) || '').replace(/<[^>]+>/g, ''), types: p.data.map(d => d.type), y: p.data.map(d => d.y || null),
          plotTop: r.top + L._size.t, range: L.xaxis ? L.xaxis.range : null,
          xticks: [...p.querySelectorAll('.xaxislayer-above text')].filter(t => t.textContent)
                    .map(t => ({text: t.textContent, left: box(t).left, right: box(t).right})),
          yticks: [...p.querySelectorAll('.yaxislayer-above text')].map(t => ({text: t.textContent, top: box(t).top})),
          notes: [...p.querySelectorAll('.annotation')].map(a => ({text: a.textContent, bottom: box(a).bottom})),
          dividers: (L.shapes || []).filter(s => s.name === 'prompt | generated').map(s => s.x0),
          legend: (p.data || []).filter(d => d.type === 'bar').map(d => d.name)}; })"""


def _charts(page) -> list[dict]:
    return page.evaluate(CHARTS)


def _heatmap_charts(page) -> list[dict]:
    return [c for c in _charts(page) if "heatmap" in c["types"]]


def _routing(page, title: str) -> None:
    """The Routing view, once a chart whose title (or a stacked row's) holds `title` is drawn."""
    radio = page.get_by_role("radio", name="Routing", exact=True)
    if not radio.is_checked():  # clicking the chosen view would unchoose it
        radio.click()
    _idle(page)
    page.wait_for_function(
        "t => [...document.querySelectorAll('.js-plotly-plot')].some(p => p.offsetParent && p.querySelector("
        "'.xaxislayer-above text') && [(p.layout.title || {}).text || '', ...(p.layout.annotations || []).map(a => a.text)]"
        ".some(x => x.includes(t)))", arg=title, timeout=60_000)


def _assert_ticks_readable(chart: dict, labels: list[str]) -> None:
    """One tick per token in the window, in order (`labels`: the ticks expected), none overlapping the next."""
    ticks = sorted(chart["xticks"], key=lambda t: t["left"])
    assert [t["text"] for t in ticks] == list(labels), chart["title"]
    for a, b in zip(ticks, ticks[1:]):
        assert a["right"] <= b["left"] + 1, (a, b)  # upright labels side by side, not on top of each other


def test_issue23_charts_rows_ticks_and_divider(app_url, browser):
    from tokenizers import Tokenizer

    from routescope.rendering.style import TOKEN_WINDOW
    from routescope.core_models.checkpoint import load_checkpoint

    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(app_url)
    _ready(page, "updated in")
    # the box's value may arrive a frame after the first run's caption: wait for it, then it must be the default
    from playwright.sync_api import expect
    expect(page.get_by_role("textbox", name="Prompt")).to_have_value(DEFAULT_PROMPT, timeout=30_000)
    # moep: rows top to bottom in model depth order, in the heatmap and along the utilisation bars
    _pick(page, "moep")
    _routing(page, "Utilisation")
    depth = list(load_checkpoint(ROOT / "checkpoints" / "moep")[0].routing_layers())
    (heat,) = _heatmap_charts(page)
    assert [t["text"] for t in sorted(heat["yticks"], key=lambda t: t["top"])] == depth  # as drawn, top down
    util = next(c for c in _charts(page) if c["title"].startswith("Utilisation"))
    assert util["legend"][0] == "expert 0 / block 0"  # the heatmap's own option names
    # every token ticked (9 prompt + 24 generated tokens: under the window, all of them shown), the
    # prompt's ticks being its tokens as the tokenizer splits them
    from routescope.rendering.style import token_label

    tok = Tokenizer.from_file(str(ROOT / "checkpoints" / "tokenizer.json"))
    prompt = [tok.decode([i]) for i in tok.encode(DEFAULT_PROMPT).ids]
    ticks = sorted(heat["xticks"], key=lambda t: t["left"])
    assert len(ticks) == len(prompt) + 24 <= TOKEN_WINDOW
    assert [t["text"] for t in ticks[:len(prompt)]] == [token_label(t) for t in prompt]
    _assert_ticks_readable(heat, [t["text"] for t in ticks])
    # the prompt | generated label sits above the plot, over no cell
    label = next(n for n in heat["notes"] if "generated" in n["text"])
    assert label["bottom"] <= heat["plotTop"] + 1
    page.screenshot(path=str(ARTIFACTS / "10_moep_depth_order_ticks.png"), full_page=True)

    # a 64-token prompt (88 tokens with the continuation): the last TOKEN_WINDOW tokens, each ticked
    _pick(page, "papaformer-gumbel-v2")
    box = page.get_by_role("textbox", name="Prompt")
    box.fill(PROMPT_64)
    page.get_by_role("button", name="Generate").click()
    page.wait_for_function("() => [...document.querySelectorAll('.rs-text')].some(e => e.innerText.includes('Sunday'))",
                           timeout=60_000)
    _routing(page, "Gumbel route per token")
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(p => p.offsetParent && "
                           "p.data.some(d => d.x && d.x.length > 64))", timeout=60_000)
    (heat,) = _heatmap_charts(page)
    model_tokens = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].find(p => p.offsetParent "
                                 "&& p.data[0].type === 'heatmap').layout.xaxis.ticktext")
    assert len(model_tokens) == 64 + 24
    prompt = [token_label(tok.decode([i])) for i in tok.encode(PROMPT_64).ids]
    assert model_tokens[:64] == prompt
    _assert_ticks_readable(heat, model_tokens[-TOKEN_WINDOW:])  # the last 40: prompt tokens 48..63, then 24 new
    assert heat["range"] == [88 - TOKEN_WINDOW - 0.5, 87.5]
    label = next(n for n in heat["notes"] if "generated" in n["text"])
    assert label["bottom"] <= heat["plotTop"] + 1 and heat["dividers"] == [63.5, 63.5]
    page.screenshot(path=str(ARTIFACTS / "11_papaformer_88_tokens_window.png"), full_page=True)
    page.close()


def test_issue23_table6_diff_keep_only_and_exports(app_url, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1600, "height": 1000}, accept_downloads=True)
    page.goto(app_url)
    _ready(page, "updated in")
    # Table 6 under "Drop path 0": the header says so, the CSV routes around path 0 (route 1)
    page.get_by_text("Drop path 0", exact=True).click()
    _caption_shows(page, "drop *:0")
    page.get_by_role("radio", name="Table 6", exact=True).click()
    header = page.get_by_text("Table 6 routes under the ablation").first
    header.wait_for(timeout=120_000)
    assert "drop *:0" in header.inner_text()
    _idle(page)
    page.locator("[data-testid='stDataFrame'] canvas").first.wait_for(timeout=60_000)
    time.sleep(1)  # the grid paints its cells on the canvas
    page.screenshot(path=str(ARTIFACTS / "12_table6_under_drop_path0.png"), full_page=True)
    page.get_by_role("radio", name="Export", exact=True).click()
    with page.expect_download(timeout=60_000) as dl:
        page.get_by_role("button", name="Table 6 report (CSV)").click()
    path = tmp_path / dl.value.suggested_filename
    dl.value.save_as(path)
    rows = list(csv.DictReader(path.open(encoding="utf-8", newline="")))
    assert rows and {r["ablation"] for r in rows} == {"drop *:0"}
    assert all("1" not in r["routes"].split(">") for r in rows)  # route 1 = path 0: never taken
    assert any("1" in r["paper_routes"].split(">") for r in rows)  # beside the paper's, which do take it
    # an exported figure page names the model and the ablation in its visible title
    with page.expect_download(timeout=60_000) as dl:
        page.get_by_role("button", name="gumbel_routes.html").click()
    fig_page = tmp_path / dl.value.suggested_filename
    dl.value.save_as(fig_page)
    viewer = browser.new_page(viewport={"width": 1600, "height": 1000})
    viewer.goto(fig_page.as_uri())
    viewer.wait_for_selector(".gtitle", timeout=60_000)
    title = viewer.locator(".gtitle").first.text_content()
    assert "papaformer-gumbel-v2" in title and "drop *:0" in title
    viewer.screenshot(path=str(ARTIFACTS / "13_exported_figure_title.png"), full_page=True)
    viewer.close()

    # the ablation diff: counts on one basis, a legend, the divider on the KL chart
    page.get_by_role("radio", name="Ablation diff", exact=True).click()
    page.locator("[data-testid='stMetric']", has_text="top-1 flips").first.wait_for(timeout=60_000)
    _idle(page)
    metrics = {m.split("\n")[0]: m for m in page.locator("[data-testid='stMetric']").all_inner_texts()}
    changed = re.search(r"(\d+) of (\d+)", metrics["changed tokens"]).groups()
    flips = re.search(r"(\d+) of (\d+)", metrics["top-1 flips"]).groups()
    assert changed[1] == flips[1] == "24"
    assert page.get_by_text("Red: a token the other continuation").count() == 1
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ROOT / "checkpoints" / "tokenizer.json"))
    n_prompt = len(tok.encode(DEFAULT_PROMPT).ids)
    kl = next(c for c in _charts(page) if c["title"].startswith("KL"))
    assert kl["dividers"] == [n_prompt - 0.5]  # between the prompt's last token and the first generated one
    page.screenshot(path=str(ARTIFACTS / "14_diff_basis_legend_divider.png"), full_page=True)

    # pgpt: "Keep only path 0" ticks "Drop path 1" (one state, shown in both places); its text is whole
    _pick(page, "pgpt")
    keep = page.locator("[data-testid='stSelectbox']").filter(has_text="Keep only")
    keep.locator("div[role='combobox'], input").first.click()
    page.get_by_role("option", name="path 0", exact=True).click()
    _caption_shows(page, "drop *:1")
    _idle(page)
    assert page.get_by_role("checkbox", name="Drop path 1").first.is_checked()
    assert not page.get_by_role("checkbox", name="Drop path 0").first.is_checked()
    shown = keep.locator("input[role='combobox']").first
    assert shown.input_value() == "path 0"
    assert shown.evaluate("e => e.scrollWidth <= e.clientWidth")  # the whole text fits: nothing is cut
    # the next-token chart's axis fits its values
    page.get_by_role("radio", name="Generation", exact=True).click()
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(p => p.offsetParent && "
                           "(p.layout.title.text || '').includes('Next-token'))", timeout=60_000)
    top, hi = page.evaluate("() => { const p = [...document.querySelectorAll('.js-plotly-plot')].find(p => "
                            "p.offsetParent && (p.layout.title.text || '').includes('Next-token'));"
                            " return [Math.max(...p.data[0].x), p._fullLayout.xaxis.range[1]]; }")
    assert top < hi <= top * 1.5
    page.screenshot(path=str(ARTIFACTS / "15_pgpt_keep_only_and_candidates.png"), full_page=True)
    page.close()


# --- issue 31: attribution shows the whole prompt; the exact-ablation table sorted by |effect| ---

MATH_PROMPT = ("Tom had 3 apples. He got 5 more apples. How many apples does Tom have now? Tom has 8 apples. Then "
               "Anna gave him 2 more apples and he ate one of them. How many apples does Tom have at the end? He has")


def test_issue31_attribution_ticks_every_prompt_token(app_url, browser):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ROOT / "checkpoints" / "tokenizer.json"))
    n_prompt = len(tok.encode(MATH_PROMPT).ids)
    assert n_prompt > 40  # longer than the heatmaps' window: the old chart opened on its end
    page = browser.new_page(viewport={"width": 1600, "height": 1000}, accept_downloads=True)
    page.goto(app_url)
    _ready(page, "updated in")
    _pick(page, "moep")
    box = page.get_by_role("textbox", name="Prompt")
    box.fill(MATH_PROMPT)
    page.get_by_role("button", name="Generate").click()
    _idle(page)
    page.get_by_role("radio", name="Attribution", exact=True).click()
    _idle(page)
    page.get_by_role("button", name="Attribute").click()
    page.get_by_text("Convergence delta").first.wait_for(timeout=120_000)
    _idle(page)
    ig = next(c for c in _charts(page) if c["title"].startswith("Integrated gradients"))
    ticks = [t["text"] for t in ig["xticks"]]
    assert len(ticks) == n_prompt  # every input token has its tick on screen, the start of the prompt too
    assert ticks[0] == "Tom"
    page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "31_01_ig_whole_prompt.png"))
    page.close()



# the rows of a st.dataframe as the page holds them: glide-data-grid paints its cells on a canvas and
# keeps an accessible table (role=grid) of the rows in view, which is what a screen reader (and this) reads
GRID_ROWS = """column => { const t = [...document.querySelectorAll('[data-testid=stDataFrame] table[role=grid]')]
    .find(t => [...t.querySelectorAll('thead th')].some(h => h.textContent === column));
  if (!t) return null;
  return {total: +t.getAttribute('aria-rowcount') - 1, head: [...t.querySelectorAll('thead th')].map(h => h.textContent),
          rows: [...t.querySelectorAll('tbody tr')].map(r => [+r.getAttribute('aria-rowindex') - 2,
                                                               [...r.querySelectorAll('td')].map(c => c.textContent)])}; }"""


def _grid_rows(page, column: str) -> list[dict]:
    """Every row of the table that has `column`, top to bottom: the grid draws only the rows in view,
    so the mouse wheel scrolls it a few rows at a time and the rows are collected by their index."""
    page.wait_for_function(f"c => ({GRID_ROWS})(c)", arg=column, timeout=60_000)
    frame = page.locator("[data-testid='stDataFrame']", has=page.locator("th", has_text=column)).first
    frame.scroll_into_view_if_needed()
    frame.hover()
    seen: dict[int, list[str]] = {}
    while True:
        grid = page.evaluate(GRID_ROWS, column)
        seen.update(dict(grid["rows"]))
        if len(seen) >= grid["total"]:
            break
        page.mouse.wheel(0, 105)  # three rows on; the grid's table follows a moment later
        page.wait_for_function(f"([c, last]) => Math.max(...({GRID_ROWS})(c).rows.map(r => r[0])) > last",
                               arg=[column, max(seen)], timeout=10_000)
    assert sorted(seen) == list(range(grid["total"])), (sorted(seen), grid["total"])  # every row, once
    return [dict(zip(grid["head"], seen[i])) for i in range(grid["total"])]


def _pick_radio(page, group: str, option: str) -> None:
    """Click a st.radio option by its label: the <input role=radio> sits under Streamlit's painted
    circle, which takes the pointer (a click on the input itself is retried until it times out)."""
    page.locator(f"[data-testid='stRadioGroup'][aria-label='{group}']").get_by_text(option, exact=True).click()
    _idle(page)


def test_issue31_exact_ablation_table_sorted_by_size(app_url, browser):
    """The exact-ablation table, read from the page: every option, each contribution the difference of
    its two log-probs, rows by |contribution| largest first, and the chart's bars in the same order."""
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(app_url)
    _ready(page, "updated in")
    _pick(page, "moep")
    page.get_by_role("radio", name="Attribution", exact=True).click()
    _idle(page)
    _pick_radio(page, "Method", "exact ablation (paths)")
    page.get_by_role("button", name="Attribute").click()
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(p => "
                           "(p.layout.title.text || '').includes('Contribution to log p (ablation)'))", timeout=120_000)
    rows = _grid_rows(page, "option name")
    assert len(rows) > 2  # moep: 16 experts' options
    # the contribution in the unit the chart uses ("contribution (µnats)"), shown to 3 significant digits
    (column,) = [c for c in rows[0] if c.startswith("contribution (")]
    per_nat = {"nats": 1.0, "millinats": 1e-3, "µnats": 1e-6, "nanonats": 1e-9}[column[len("contribution ("):-1]]
    effect = [float(r[column]) * per_nat for r in rows]

    def last_digit(text: str) -> float:  # the value of the last digit a number is shown with
        return 10.0 ** -len(text.split(".")[1]) if "." in text else 1.0
    for r, e in zip(rows, effect):  # the column is what it says: log p with the option minus without it
        diff = float(r["full_log_prob"]) - float(r["reference_log_prob"])
        shown = last_digit(r["full_log_prob"]) + last_digit(r["reference_log_prob"])
        assert e == pytest.approx(diff, rel=5e-3, abs=shown)
    by_size = sorted(effect, key=abs, reverse=True)
    assert [abs(e) for e in effect] == [abs(e) for e in by_size]
    by_name = [e for _, e in sorted(zip(rows, effect), key=lambda p: (p[0]["layer"], int(p[0]["option"])))]
    assert [abs(e) for e in by_name] != [abs(e) for e in by_size]  # a table in another order fails the line above
    bars = page.evaluate("() => { const d = [...document.querySelectorAll('.js-plotly-plot')].find(p => (p.layout.title.text"
                         " || '').includes('Contribution to log p'))._fullData[0]; return [Array.from(d.y), Array.from(d.x)]; }")
    top_down = list(zip(*[reversed(v) for v in bars]))  # plotly draws the first category at the bottom
    assert [n for n, _ in top_down] == [r["option name"] for r in rows][:len(top_down)]
    assert [x for _, x in top_down] == pytest.approx(effect[:len(top_down)], rel=1e-6)
    page.locator("[data-testid='stDataFrame']").last.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "31_03_exact_ablation_sorted.png"), full_page=True)
    page.close()
