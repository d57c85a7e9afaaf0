"""Screenshots of issue 31's nine items, taken the same way from any running explorer.

    python scripts/shots_issue31.py http://127.0.0.1:8501 OUT_DIR [shot_uploads,shot_corpus,...]

Drives Debian's Chromium (Playwright) at 1600 x 1000 through the views each item is about, on the
shipped moep checkpoint, and writes one PNG per view to OUT_DIR (e.g. before/after directories, one
app from the commit before the work and one from after). A step the app under test cannot do (a
control it lacks) is reported in one line and the other shots are still taken; the exit status is
the number of failed steps. Nothing is asserted: the pictures are for reading.
"""
from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ROOT = Path(__file__).resolve().parents[1]
VIEWPORT = {"width": 1600, "height": 1000}
MATH_PROMPT = ("Tom had 3 apples. He got 5 more apples. How many apples does Tom have now? Tom has 8 apples. Then "
               "Anna gave him 2 more apples and he ate one of them. How many apples does Tom have at the end? He has")
NO_STATUS = "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"


def idle(page, timeout: float = 120_000) -> None:
    """Streamlit's rerun in flight is done (its status widget is gone)."""
    time.sleep(0.5)
    page.wait_for_function(NO_STATUS, timeout=timeout)
    time.sleep(0.5)


def open_app(browser, url: str, checkpoint: str = "moep", prompt: str | None = None):
    page = browser.new_page(viewport=VIEWPORT, accept_downloads=True)
    page.goto(url)
    page.get_by_text("updated in").first.wait_for(timeout=120_000)
    page.locator("[data-testid='stSelectbox']").filter(has_text="Checkpoint").locator(
        "div[role='combobox'], input").first.click()
    page.get_by_role("option", name=checkpoint, exact=True).click()
    idle(page)
    if prompt is not None:
        page.get_by_role("textbox", name="Prompt").fill(prompt)
        page.get_by_role("button", name="Generate").click()
        idle(page)
    return page


def view(page, name: str) -> None:
    radio = page.get_by_role("radio", name=name, exact=True)
    if not radio.is_checked():  # clicking the chosen view would unchoose it
        radio.click()
    idle(page)


def pick_radio(page, group: str, option: str) -> None:
    """A st.radio option by its label (Streamlit's painted circle takes the pointer from the input)."""
    page.locator(f"[data-testid='stRadioGroup'][aria-label='{group}']").get_by_text(option, exact=True).click()
    idle(page)


def chart_titled(page, text: str, timeout: float = 180_000) -> None:
    page.wait_for_function("t => [...document.querySelectorAll('.js-plotly-plot')].some(p => p.layout && "
                           "((p.layout.title || {}).text || '').includes(t))", arg=text, timeout=timeout)
    idle(page)


# Streamlit scrolls its main area inside the page, so a "full page" screenshot is the viewport: tall
# views are shot a screen at a time instead
SCROLLER = """() => [...document.querySelectorAll('[data-testid=stMain], [data-testid=stAppViewContainer], section')]
  .concat([document.scrollingElement]).find(e => e && e.scrollHeight > e.clientHeight + 2 &&
  getComputedStyle(e).overflowY !== 'visible') || document.scrollingElement"""


def screens(page, stem: str, out: Path, most: int = 6) -> None:
    """The view from the top, a screen at a time (900 px steps: 100 px overlap), at most `most` screens."""
    page.evaluate(f"() => {{ ({SCROLLER})().scrollTop = 0; }}")
    for i in range(most):
        time.sleep(0.5)
        page.screenshot(path=out / f"{stem}_{i + 1}.png")
        moved = page.evaluate(f"() => {{ const s = ({SCROLLER})(); const b = s.scrollTop; s.scrollTop += 900;"
                              " return s.scrollTop > b; }")
        if not moved:
            break


def at(page, locator, path: Path) -> None:
    """One screen with `locator`'s top near the top of the view."""
    locator.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.evaluate(f"() => {{ ({SCROLLER})().scrollTop -= 60; }}")
    time.sleep(0.5)
    page.screenshot(path=path)


def shot_attribution_ig(browser, url, out):
    """Items 1 and 2: integrated gradients on a 50-token prompt; the delta and what the view says of it."""
    page = open_app(browser, url, prompt=MATH_PROMPT)
    view(page, "Attribution")
    page.get_by_role("button", name="Attribute").click()
    chart_titled(page, "Integrated gradients")
    screens(page, "item1_2_attribution_ig", out)
    page.close()


def shot_kl(browser, url, out):
    """Item 1: the Ablation diff's KL chart and its text on the same prompt, one expert dropped."""
    page = open_app(browser, url, prompt=MATH_PROMPT)
    page.locator("[data-testid='stCheckbox']").filter(has_text=re.compile(r"^Drop ")).first.locator("label").click()
    idle(page)
    view(page, "Ablation diff")
    chart_titled(page, "KL")
    screens(page, "item1_ablation_diff_kl", out)
    page.close()


def shot_paths(browser, url, out):
    """Item 3: the exact-ablation chart and table."""
    page = open_app(browser, url)
    view(page, "Attribution")
    pick_radio(page, "Method", "exact ablation (paths)")
    page.get_by_role("button", name="Attribute").click()
    chart_titled(page, "Contribution")
    page.locator("[data-testid='stDataFrame']").last.wait_for(timeout=60_000)
    idle(page)
    screens(page, "item3_path_attribution", out)
    page.close()


def shot_generation(browser, url, out):
    """Item 4: candidate probabilities, chart and steps table."""
    page = open_app(browser, url)
    view(page, "Generation")
    chart_titled(page, "candidates")
    page.screenshot(path=out / "item4_generation_candidates.png")
    table = page.get_by_text("Every step as a table")
    if table.count():  # the steps table behind its expander
        table.first.click()
        idle(page)
    grid = page.locator("[data-testid='stDataFrame']").last
    grid.wait_for(timeout=60_000)
    at(page, grid, out / "item4_generation_steps_table.png")
    page.close()


def shot_routing(browser, url, out):
    """Item 5: the HTML route grid, the plotly heatmap, and their captions."""
    page = open_app(browser, url)
    view(page, "Routing")
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    idle(page)
    screens(page, "item5_routing", out, most=3)
    page.close()


def shot_views_offered(browser, url, out):
    """Item 6: the views offered for an MoE checkpoint, and Table 6 where it is offered."""
    page = open_app(browser, url)
    page.screenshot(path=out / "item6_moep_views_offered.png")
    if page.get_by_role("radio", name="Table 6", exact=True).count():
        view(page, "Table 6")
        page.screenshot(path=out / "item6_moep_table6.png")
    page.close()
    page = open_app(browser, url, checkpoint="papaformer-gumbel-v2")  # a family whose page Table 6 is
    page.screenshot(path=out / "item6_papaformer_views_offered.png")
    page.close()


def shot_corpus(browser, url, out):
    """Item 7: corpus tables of moep compared with moep-swiglu (shipped Table 6 probes), co-routing,
    and the view's own corpus.html download."""
    page = open_app(browser, url)
    view(page, "Corpus")
    page.locator("[data-testid='stSelectbox']").filter(has_text="Compare with").locator(
        "div[role='combobox'], input").first.click()
    page.get_by_role("option", name="moep-swiglu", exact=True).click()
    page.get_by_text("Download the tables").first.wait_for(timeout=600_000)
    page.get_by_text("Compared:").first.wait_for(timeout=120_000)  # the tables are drawn below the downloads
    page.get_by_text("Co-routing across layers").first.wait_for(timeout=120_000)
    idle(page)
    screens(page, "item7_corpus", out, most=20)
    page.get_by_text("Download the tables").first.click()
    with page.expect_download(timeout=120_000) as dl:
        page.get_by_role("button", name=re.compile(r"^corpus\.html")).click()
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "corpus.html"
        dl.value.save_as(html)
        doc = browser.new_page(viewport=VIEWPORT)
        doc.goto(html.as_uri())
        time.sleep(3)
        doc.screenshot(path=out / "item7_corpus_html_full.png", full_page=True)
        doc.close()
    page.close()


def uploader(page, label: str):
    """The file input of the uploader labelled `label` (the sidebar's checkpoint uploader is in the page too,
    folded away)."""
    box = page.locator("[data-testid='stFileUploader']").filter(has_text=label).first
    box.wait_for(timeout=60_000)
    return box.locator("input[type=file]")


def shot_uploads(browser, url, out):
    """Item 8: a .bin after a good .txt in the Corpus uploader; moep's files uploaded as a new checkpoint
    (no training summary) and the sidebar's parameter line."""
    page = open_app(browser, url)
    view(page, "Corpus")
    pick_radio(page, "Dataset", "Upload a file")
    drop = uploader(page, "Dataset file")
    drop.set_input_files(files=[{"name": "prompts.txt", "mimeType": "text/plain",
                                 "buffer": b"Once upon a time\nTom had 3 apples.\n"}])
    idle(page)
    drop.set_input_files(files=[{"name": "weights.bin", "mimeType": "application/octet-stream",
                                 "buffer": bytes(range(256)) * 4}])
    idle(page)
    try:  # the upload and its rerun take a moment: wait for a message that names the file, if the app gives one
        page.wait_for_function("() => [...document.querySelectorAll('[data-testid=stAlert], [data-testid=stException]')]"
                               ".some(a => a.innerText.includes('weights.bin'))", timeout=20_000)
    except Exception:
        print("  no message naming weights.bin within 20 s")
    idle(page)
    page.screenshot(path=out / "item8_corpus_upload_bin.png")
    page.get_by_text("Upload a checkpoint").first.click()
    ckpt = ROOT / "checkpoints" / "moep"
    uploader(page, "config.json, model.safetensors").set_input_files(
        [str(ckpt / n) for n in ("config.json", "model.safetensors", "tokenizer.json")])
    idle(page)
    page.get_by_role("button", name="Validate and open").click()
    idle(page)
    page.get_by_text("updated in").first.wait_for(timeout=120_000)
    page.screenshot(path=out / "item8_uploaded_checkpoint_sidebar.png", clip={"x": 0, "y": 0, "width": 420, "height": 1000})
    page.close()


def shot_failed_runs(browser, url, out):
    """Item 9: an empty prompt, on the Routing view and then the Corpus view."""
    page = open_app(browser, url, prompt="")
    page.screenshot(path=out / "item9_empty_prompt.png")
    corpus = page.get_by_role("radio", name="Corpus", exact=True)
    if corpus.count():
        view(page, "Corpus")
        page.screenshot(path=out / "item9_empty_prompt_corpus.png")
    page.close()


SHOTS = [shot_attribution_ig, shot_kl, shot_paths, shot_generation, shot_routing, shot_views_offered, shot_corpus,
         shot_uploads, shot_failed_runs]


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: shots_issue31.py APP_URL OUT_DIR [SHOT,SHOT...]", file=sys.stderr)
        return 2
    url, out = argv[0], Path(argv[1])
    only = argv[2].split(",") if len(argv) == 3 else None
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for shot in [s for s in SHOTS if only is None or s.__name__ in only]:
                t0 = time.perf_counter()
                try:
                    shot(browser, url, out)
                    print(f"{shot.__name__}: done in {time.perf_counter() - t0:.0f} s")
                except Exception as e:  # this app lacks the control: say so, keep what the page showed, go on
                    failed += 1
                    print(f"{shot.__name__}: not taken: {str(e).splitlines()[0]}")
                    for page in [pg for c in browser.contexts for pg in c.pages]:
                        page.screenshot(path=out / f"{shot.__name__}_where_it_stopped.png", full_page=True)
                        page.close()
        finally:
            browser.close()
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
