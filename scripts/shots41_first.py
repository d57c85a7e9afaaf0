"""Issue 41's points 1 to 5 for scripts/shots_issue41.py (corpus settings, cancel, toggles, candidates,
comparison labels), each a function (browser, url, size, out) that takes its shots."""
from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from playwright.sync_api import TimeoutError as PlaywrightTimeout

from shots41_page import (VIEWPORT, CHARTS_DRAWN, SHORT_PROMPT, BYTES_PROMPT, TSV, SIZES, SHOWN, NOTES, DOWNLOADS,
                          idle, ready, few_new_tokens, open_app, view, pick_radio, caption_shows, specs, shoot,
                          uploader, number, corpus)


# --- the points -------------------------------------------------------------------------------------------

def p01_corpus_settings(browser, url, size, out):
    """1: the Corpus view's settings after a refused upload and a view switch (and 9: the refused file
    is not listed as uploaded earlier)."""
    page = open_app(browser, url, size)
    corpus(page)
    routed(page)
    setting(page, "Tokens per row", 7)
    page.get_by_text("Specialisation settings").first.click()
    setting(page, "Tokens per option", 3)
    setting(page, "Minimum count of a token", 2)
    setting(page, "Intended options", SIZES[size]["intended"], role="textbox")
    shoot(page, size, out, "01_corpus_settings_set", "1",
          f"the settings as set on the shipped dataset, as the page draws them: {settings_shown(page)}",
          locator=page.get_by_text("Tokens per row").first, top=200)
    pick_radio(page, "Dataset", "Upload a file")
    uploader(page, "Dataset file").set_input_files(files=[{"name": "bad.csv", "mimeType": "text/plain",
                                                             "buffer": b"words,topic\nhello,story\n"}])
    idle(page)
    page.get_by_text("Dataset refused").first.wait_for(timeout=60_000)
    shoot(page, size, out, "01_corpus_refused_upload", "1, 9",
          "a refused upload (bad.csv): one line 'Dataset refused: ...'; the settings are not drawn")
    view(page, "Routing")
    view(page, "Corpus")
    ready(page, "Dataset")
    said = " | ".join(t.strip() for t in page.locator("[data-testid='stCaptionContainer'], [data-testid='stAlert']")
                      .filter(has_text="bad.csv").all_inner_texts())
    shoot(page, size, out, "01_corpus_after_view_switch", "1, 9",
          f"back on the Corpus view after Routing, the lines naming the refused bad.csv: {said}")
    uploader(page, "Dataset file").set_input_files(files=[{"name": "probes.tsv", "mimeType": "text/plain",
                                                             "buffer": TSV}])
    idle(page)
    ready(page, "rows,", timeout=600_000)
    page.get_by_text("Specialisation settings").first.click()
    idle(page)
    shoot(page, size, out, "01_corpus_settings_kept", "1",
          f"probes.tsv uploaded next (set before the refusal: 7, 3, 2 and the intended options); the page draws "
          f"{settings_shown(page)}")
    said = page.get_by_text(re.compile(r"^[\d,]+ rows, [\d,]+ tokens routed")).first
    said.wait_for(timeout=600_000)
    idle(page)
    shoot(page, size, out, "01_corpus_routed_as_set", "1",
          f"the dataset routed with those settings: '{said.inner_text().strip()[:120]}' (6 rows of up to 7 "
          "tokens) and the summary's max_tokens", locator=said, top=80)
    page.context.close()


def cancel_run(page, method: str, size, out, stem: str) -> bool:
    """Start an attribution by `method`; if it shows its progress and Cancel, shoot that, press Cancel and
    shoot the line it leaves. False when the run ended before a Cancel showed (a run done within a
    second shows its result at once)."""
    pick_radio(page, "Method", method)
    page.get_by_role("button", name="Attribute").click()
    cancel = page.get_by_role("button", name="Cancel", exact=True)
    try:
        cancel.wait_for(timeout=30_000)
    except PlaywrightTimeout:
        idle(page)
        return False
    try:
        page.get_by_text(re.compile(r": [1-9][\d,]* of [\d,]+ ")).first.wait_for(timeout=60_000)  # under way
    except PlaywrightTimeout:
        print(f"  {method}: no progress counted within 60 s")
    bar = page.locator("[data-testid='stProgress']").first
    said = bar.inner_text().strip() if bar.count() else ""
    shoot(page, size, out, f"{stem}_progress", "2", f"{method} under way: '{said}', a Cancel button and the line "
          "saying what stops it")
    t0 = time.perf_counter()
    cancel.click()
    line = page.get_by_text(re.compile(r"^Cancelled after [\d,]+ of [\d,]+")).first
    line.wait_for(timeout=120_000)
    took = time.perf_counter() - t0
    idle(page)
    charts = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent).length")
    shoot(page, size, out, f"{stem}_cancelled", "2", f"after Cancel ({took:.2f} s from the click to the line here): "
          f"'{line.inner_text().strip()}'; {charts} chart(s) on the page")
    return True


def routed(page) -> None:
    """The Corpus view's routing job is done (its progress bar gone and the page idle)."""
    idle(page)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stProgress\"]')", timeout=600_000)
    idle(page)


def setting(page, label: str, value, role: str = "spinbutton") -> None:
    """Type a Corpus setting and wait until the dataset is routed with it; say so if the page then draws
    another value (a value typed while a routing job ends was seen replaced at 128 x 24), and type it again."""
    for attempt in range(2):
        box = page.get_by_role(role, name=label, exact=True)
        box.fill(str(value))
        box.press("Enter")
        routed(page)
        shown = page.get_by_role(role, name=label, exact=True).input_value()
        if shown == str(value):
            return
        line = f"Corpus view: '{label}' typed {value!r} and Enter, the page drew {shown!r} once the routing ended"
        print(f"  p01: {line}" + (" (typed again)" if attempt == 0 else ""))
        NOTES.append(line)


def settings_shown(page) -> str:
    """The Corpus settings' values as the browser draws them."""
    values = []
    for role, label in (("spinbutton", "Tokens per row"), ("spinbutton", "Tokens per option"),
                        ("spinbutton", "Minimum count of a token"), ("textbox", "Intended options")):
        box = page.get_by_role(role, name=label, exact=True)
        values.append(f"{label} = {box.first.input_value()!r}" if box.count() else f"{label} not drawn")
    return "; ".join(values)


def p02_cancel(browser, url, size, out):
    """2: exact-ablation attribution's Cancel; at 4 experts its 16 options end within the second in which
    the view shows a result at once, so Shapley sampling and integrated gradients (512 steps) show the
    same Cancel; at 128 x 24 also the Experts view's Cancel and time left."""
    # a prompt of this run's own: a finished attribution is kept for every session, and one of an earlier
    # run of this script on the same server would show at once
    page = open_app(browser, url, size, prompt=f"{SHORT_PROMPT} Run {int(time.time()) % 100_000}.")
    view(page, "Attribution")
    ready(page, "Predict the token after position")
    idle(page)
    if not cancel_run(page, "exact ablation (paths)", size, out, "02_exact_ablation"):
        print(f"  p02 ({size}): exact ablation ended before a Cancel showed")
        shoot(page, size, out, "02_exact_ablation_done_at_once", "2",
              "exact ablation ended before a Cancel showed (the view shows a run done within 1 s at once): "
              "its chart", locator=page.get_by_role("button", name="Attribute"), top=200)
        if not cancel_run(page, "Shapley value sampling (paths)", size, out, "02_shapley"):
            print(f"  p02 ({size}): Shapley sampling ended before a Cancel showed")
            pick_radio(page, "Method", "integrated gradients (input tokens)")
            steps = page.get_by_role("slider", name="Integration steps")
            if steps.count():
                steps.first.focus()
                page.keyboard.press("End")
                idle(page)
            if not cancel_run(page, "integrated gradients (input tokens)", size, out, "02_ig"):
                print(f"  p02 ({size}): integrated gradients ended before a Cancel showed")
    if size == "128x24":
        experts_cancel(page, size, out)
    page.context.close()


def experts_cancel(page, size, out):
    data = Path(tempfile.gettempdir()) / "shots_issue41_texts.txt"
    data.write_text(TSV.decode().split("\n", 1)[1].replace("\tstory", "").replace("\tmath", ""), encoding="utf-8")
    view(page, "Experts")
    ready(page, "Shipped dataset")
    page.get_by_text("File on the server", exact=True).click()
    idle(page)
    path = page.get_by_role("textbox", name="Path on the server")
    path.fill(str(data))
    path.press("Enter")
    idle(page)
    for label, value in (("Tokens", "200"), ("Control draws", "2")):
        number(page, label, value)
    page.get_by_role("button", name="Measure expert importance").click()
    t0 = time.perf_counter()
    bar = page.get_by_text(re.compile(r"Dropping experts one at a time: .*, about .* left")).first
    bar.wait_for(timeout=300_000)
    shown = time.perf_counter() - t0
    shoot(page, size, out, "02_experts_progress_time_left", "2",
          f"the Experts view's sweep under way: '{bar.inner_text().strip()}' (the time left shown {shown:.1f} s "
          "after the click, here), and Cancel")
    t0 = time.perf_counter()
    page.get_by_role("button", name="Cancel", exact=True).click()
    said = page.get_by_text("Sweep cancelled").first
    said.wait_for(timeout=120_000)
    took = time.perf_counter() - t0
    idle(page)
    shoot(page, size, out, "02_experts_cancelled", "2",
          f"the Experts view after Cancel ({took:.1f} s from the click to the line): '{said.inner_text().strip()}'")


def p03_toggle(browser, url, size, out):
    """3: a toggle on the Routing view, to the caption 'updated in'."""
    page = open_app(browser, url, size)
    view(page, "Routing")
    seed = page.get_by_label("Seed")  # a seed of this run's own: the toggled run is not in the cache yet
    seed.fill(str(1 + int(time.time()) % 9_999))
    seed.press("Enter")
    idle(page)
    ready(page, "updated in")
    if SIZES[size]["drop"] is None:
        t0 = time.perf_counter()
        page.get_by_text("Drop expert 1", exact=True).click()
    else:  # typed first; the clock runs from the key that applies it
        box = page.get_by_role("textbox", name="Specs", exact=True).first
        if not box.is_visible():  # behind its expander where there are Drop boxes
            page.get_by_text("Specs (ranges, all but, most used)").first.click()
        box.fill(SIZES[size]["drop"])
        t0 = time.perf_counter()
        box.press("Control+Enter")
    caption_shows(page, SIZES[size]["expect"])
    took = time.perf_counter() - t0
    idle(page)
    cap = page.locator("[data-testid='stCaptionContainer']", has_text="Ablation:").first.inner_text()
    shoot(page, size, out, "03_routing_after_toggle", "3",
          f"Routing view after {'a Drop box' if SIZES[size]['drop'] is None else 'a spec edit'}: caption "
          f"'{cap.strip()}' ({took:.2f} s from the {'click' if SIZES[size]['drop'] is None else 'Ctrl+Enter'} to "
          "that caption in this browser, one sample on the shared, loaded 2-core machine: not a benchmark)")
    page.context.close()


def p04_candidates(browser, url, size, out):
    """4: Generation's candidate chart on a prompt with multi-byte characters."""
    page = open_app(browser, url, size)
    if size == "128x24":  # the random model's 4th step ranks two byte tokens ("\ufffd" each) in its top 10
        few_new_tokens(page, 4)
    box = page.get_by_role("textbox", name="Prompt")
    box.fill(BYTES_PROMPT[size])
    box.press("Control+Enter")
    idle(page)
    view(page, "Generation")
    ready(page, "Every step as a table")
    if size == "128x24":
        step = page.get_by_role("slider").nth(1)
        step.focus()
        page.keyboard.press("Home")
        for _ in range(3):
            page.keyboard.press("ArrowRight")
        idle(page)
    page.wait_for_function(CHARTS_DRAWN, arg=1, timeout=120_000)
    chart = page.locator(".js-plotly-plot").filter(has_text="andidate").first
    ticks = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].filter(p => "
                          "((p.layout.title || {}).text || '').toLowerCase().includes('candidate')).map(p => "
                          "[...p.querySelectorAll('.ytick text, .xtick text')].map(t => t.textContent))")
    shoot(page, size, out, "04_generation_candidates", "4",
          f"the candidate chart: one bar per candidate in rank order; tick labels {ticks[:1]}",
          locator=chart if chart.count() else None)
    page.context.close()


def p05_comparison(browser, url, size, out):
    """5: the Corpus view comparing two checkpoints: caption, download names, titles."""
    page = open_app(browser, url, size)
    if SIZES[size]["drop"] is None:  # an ablation from a box, not a typed spec: summary's ablation_specs
        page.get_by_text("Drop expert 1", exact=True).click()
        idle(page)
    else:
        specs(page, SIZES[size]["drop"])
    caption_shows(page, SIZES[size]["expect"])
    corpus(page)
    pick_radio(page, "Dataset", "Upload a file")
    uploader(page, "Dataset file").set_input_files(files=[{"name": "probes.tsv", "mimeType": "text/plain",
                                                             "buffer": TSV}])
    idle(page)
    other = SIZES[size]["other"]
    page.locator("[data-testid='stSelectbox']").filter(has_text="Compare with").locator(
        "div[role='combobox'], input").first.click()
    page.get_by_role("option", name=other, exact=True).click()
    ready(page, "Compared:", timeout=600_000)
    panel = page.get_by_text("Download the tables").first
    panel.wait_for(timeout=600_000)
    idle(page)
    summary = page.locator("[data-testid='stDataFrame'], [data-testid='stTable']").first
    shoot(page, size, out, "05_compare_summary", "5", f"the summary naming {SIZES[size]['model']} and {other}",
          locator=summary, top=200)
    panel.click()
    idle(page)
    shoot(page, size, out, "05_compare_downloads", "5",
          "the download panel: its title and the file names (summary, compare_*) naming both checkpoints",
          locator=page.get_by_text("Download the tables").first)
    cap = page.locator("[data-testid='stCaptionContainer']").filter(has_text="downloaded files").first
    if cap.count():
        shoot(page, size, out, "05_compare_caption", "5", f"the caption over the compared tables: "
              f"'{cap.inner_text().strip()[:160]}'", locator=cap, top=120)
    for name in ("summary.csv", "compare_utilisation.csv"):
        with page.expect_download(timeout=300_000) as dl:
            page.get_by_role("button", name=name, exact=True).click()
        with tempfile.TemporaryDirectory() as tmp:
            got = Path(tmp) / "f.csv"
            dl.value.save_as(got)
            lines = got.read_text(encoding="utf-8").splitlines()
        head = lines[0] if name != "summary.csv" else " / ".join(l for l in lines if l.split(",")[0] in (
            "metric", "model", "ablation", "ablation_specs"))
        print(f"  {name} downloads as {dl.value.suggested_filename}: {head[:300]}")
        DOWNLOADS.append((size, name, dl.value.suggested_filename, head))
    with page.expect_download(timeout=300_000) as dl:
        page.get_by_role("button", name=re.compile(r"^corpus\.html")).click()
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "corpus.html"
        dl.value.save_as(html)
        title = titled_page(browser, html, size, out, "05_compare_corpus_html",
                            f"corpus.html ({dl.value.suggested_filename}) opened in Chromium, its <title> shown "
                            "in a banner")
        print(f"  corpus.html title: {title!r}")
    page.context.close()


def titled_page(browser, html: Path, size, out, name, what) -> str:
    """Open a downloaded page from file:// and shoot it with its document.title written in a banner at
    the top (a headless screenshot has no title bar)."""
    doc = browser.new_page(viewport=VIEWPORT)
    doc.goto(html.as_uri())
    time.sleep(3)
    title = doc.evaluate("() => document.title")
    doc.evaluate("t => { const d = document.createElement('div'); d.textContent = 'document.title = ' + "
                 "JSON.stringify(t); d.style.cssText = 'position:fixed;top:0;left:0;right:0;z-index:99999;"
                 "background:#ffe;border-bottom:2px solid #c00;font:16px monospace;padding:6px;'; "
                 "document.body.appendChild(d); }", title)
    time.sleep(0.5)
    doc.screenshot(path=str(out / size / f"{name}.png"))
    SHOWN.append(("5, 9" if "corpus" in name else "9", size, f"{size}/{name}.png", f"{what}: {title!r}"))
    doc.close()
    return title


