"""Screenshots of issue 41's eleven points, at 4 experts and at 128 experts x 24 layers, from a running app.

    python scripts/shots_issue41.py build ROOT          # the checkpoints the shots need, into ROOT
    ROUTESCOPE_CHECKPOINTS=ROOT ROUTESCOPE_THREADS=1 python -m routescope.cli app --port 8641 --headless \
        --address 127.0.0.1 &
    python scripts/shots_issue41.py http://127.0.0.1:8641 test-artifacts/issue41 [SHOT,SHOT...] [--size 4experts|128x24]

`build` saves a random Qwen3-MoE of 128 experts x 24 layers, top-8 (tests/scale_models.scale_moe), a second
one (another seed: the checkpoint the Corpus comparison is made against) and mixtral-tiny-b (the shipped
mixtral-tiny with its routers perturbed, the 4-expert comparison's second checkpoint). The shots drive
Debian's Chromium (Playwright, never a downloaded browser) at 1600 x 1000 and write
OUT/{4experts,128x24}/NN_name.png, one or more per point, and OUT/INDEX.md listing each point, its shots,
one line of what each shows, and where a point does not apply to a model. A step that fails is reported
in one line (the page where it stopped is kept as *_where_it_stopped.png) and the other shots are still
taken; the exit status is the number of failed steps. Nothing is asserted: the pictures are for reading.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ROOT = Path(__file__).resolve().parents[1]
VIEWPORT = {"width": 1600, "height": 1000}
NO_STATUS = "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
CHARTS_DRAWN = ("n => [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent && "
                "(p.data || []).length && p.querySelector('.main-svg')).length >= n")
MODEL_SHOWN = ("m => { const ps = [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent);"
               " return ps.length > 0 && ps.every(p => p.layout && p.layout.meta && p.layout.meta.model === m); }")
SCROLLER = """() => [...document.querySelectorAll('[data-testid=stMain], [data-testid=stAppViewContainer], section')]
  .concat([document.scrollingElement]).find(e => e && e.scrollHeight > e.clientHeight + 2 &&
  getComputedStyle(e).overflowY !== 'visible') || document.scrollingElement"""
SHORT_PROMPT = "Once upon a time, there was a little girl named Lily. Solve for x: 3x + 5 = 20."
# multi-byte characters: the random 128 x 24 model ranks two byte tokens that each display as "\ufffd" among
# its 4th step's ten candidates (found by a search over a few prompts; mixtral-tiny ranks none over 15 such
# prompts x 24 steps)
BYTES_PROMPT = {"4experts": "Tom said: 🙂 ü é ñ and then", "128x24": "🙂🙂🙂🙂"}
TSV = ("text\tdomain\n" + "".join(f"{t}\t{d}\n" for t, d in [
    ("Once upon a time, there was a little girl named Lily.", "story"),
    ("She loved to play in the park with her red ball.", "story"),
    ("The dog looked sad and lonely under the big tree.", "story"),
    ("Solve for x: 3x + 5 = 20.", "math"),
    ("What is 12 divided by 4? Express your answer as a fraction.", "math"),
    ("Find the sum of 7 and 15, then simplify the result.", "math"),
])).encode()
SIZES = {"4experts": {"model": "mixtral-tiny", "other": "mixtral-tiny-b", "drop": None, "expect": "drop *:1",
                      "specs": "*:1\n*:200\nnolayer:0-3", "too_many": "*:1-3", "intended": "domain:story=0,math=1"},
         "128x24": {"model": "qwen3-moe-128x24", "other": "qwen3-moe-128x24-b", "drop": "*:0-15",
                    "expect": "drop *:0-15", "specs": "*:0-3\n*:200\nnolayer:0-15", "too_many": "*:0-120",
                    "intended": "domain:story=0,math=1"}}
SHOWN: list[tuple[str, str, str, str]] = []  # (point, size, file, what it shows): INDEX.md's rows
NOT_APPLICABLE: list[tuple[str, str, str]] = []  # (point, size, why)
NOTES: list[str] = []  # what a step saw that its shot does not show (printed, and kept in INDEX.md)
DOWNLOADS: list[tuple[str, str, str, str]] = []  # (size, button, file name, its header or summary rows)


# --- the checkpoints --------------------------------------------------------------------------------------

def build(root: Path) -> None:
    """ROOT/qwen3-moe-128x24, ROOT/qwen3-moe-128x24-b (seed 1) and ROOT/mixtral-tiny-b, each saved hidden
    under a dot name and renamed when complete (the app never lists half a model)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import torch  # optional heavy dependencies of the build step only (the shots need neither)
    from safetensors.torch import load_file, save_file
    from scale_models import scale_moe

    root.mkdir(parents=True, exist_ok=True)

    def make(name, fn):
        path = root / name
        if path.exists():
            return
        part = root / f".{name}.partial"
        shutil.rmtree(part, ignore_errors=True)
        fn(part)
        part.rename(path)
        print(f"built {path}")

    make("qwen3-moe-128x24", lambda p: scale_moe(p, experts=128, layers=24, seed=0))
    make("qwen3-moe-128x24-b", lambda p: scale_moe(p, experts=128, layers=24, seed=1))

    def mixtral_b(part: Path) -> None:
        src = ROOT / "checkpoints" / "mixtral-tiny"
        shutil.copytree(src, part)
        tensors = load_file(str(src / "model.safetensors"))
        g = torch.Generator().manual_seed(1)
        for k, v in tensors.items():  # another router: the comparison has differences to show
            if k.endswith("gate.weight"):
                tensors[k] = v + 0.5 * v.std() * torch.randn(v.shape, generator=g, dtype=v.dtype)
        save_file(tensors, str(part / "model.safetensors"), metadata={"format": "pt"})

    make("mixtral-tiny-b", mixtral_b)


# --- driving the page -------------------------------------------------------------------------------------

def idle(page, timeout: float = 300_000) -> None:
    """Streamlit's rerun in flight is done (its status widget is gone)."""
    time.sleep(0.5)
    page.wait_for_function(NO_STATUS, timeout=timeout)
    time.sleep(0.3)


def ready(page, text: str, timeout: float = 300_000) -> None:
    page.get_by_text(text, exact=False).first.wait_for(timeout=timeout)


def pick(page, name: str) -> None:
    box = page.locator("[data-testid='stSelectbox']").filter(has_text="Checkpoint").locator(
        "div[role='combobox'], input").first
    box.click()
    page.get_by_role("option", name=name, exact=True).click()
    idle(page)
    ready(page, "updated in")


def few_new_tokens(page, n: int = 2) -> None:
    """Max new tokens down to `n` (a 128-expert forward takes seconds on a CPU)."""
    slider = page.get_by_role("slider").first
    slider.wait_for(timeout=300_000)
    slider.focus()
    page.keyboard.press("Home")
    for _ in range(n):
        page.keyboard.press("ArrowRight")
    idle(page)


def open_app(browser, url: str, size: str, prompt: str | None = None, model: str | None = None, context=None):
    """A new page (its own browser context: a fresh Streamlit session) on the size's model, on the
    Routing view, with `prompt` run if given."""
    ctx = context or browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    page = ctx.new_page()
    page.goto(url)
    ready(page, "updated in")
    if size == "128x24":
        few_new_tokens(page)
    name = model or SIZES[size]["model"]
    pick(page, name)
    page.wait_for_function(MODEL_SHOWN, arg=name, timeout=300_000)  # the previous model's page is gone
    if prompt is not None:
        box = page.get_by_role("textbox", name="Prompt")
        box.fill(prompt)
        box.press("Control+Enter")
        idle(page)
        ready(page, "updated in")
        page.wait_for_function(MODEL_SHOWN, arg=name, timeout=300_000)
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


def caption_shows(page, text: str, timeout: float = 300_000) -> None:
    page.wait_for_function(
        "e => [...document.querySelectorAll('[data-testid=\"stCaptionContainer\"]')]"
        ".some(c => c.innerText.startsWith('Ablation:') && c.innerText.includes(e))", arg=text, timeout=timeout)


def specs(page, text: str) -> None:
    box = page.get_by_role("textbox", name="Specs", exact=True)
    if not box.count() or not box.first.is_visible():
        page.get_by_text("Specs (ranges, all but, most used)").first.click()
    box.first.fill(text)
    box.first.press("Control+Enter")
    idle(page)


def shoot(page, size: str, out: Path, name: str, point: str, what: str, locator=None, top: int = 60) -> None:
    """OUT/size/name.png of the viewport (with `locator`'s top `top` px below the view's top, if given)."""
    if locator is not None:  # into view, then wheeled so its top sits `top` px below the view's top
        locator.scroll_into_view_if_needed()
        box = locator.bounding_box()
        if box is not None and abs(box["y"] - top) > 5:
            page.mouse.move(320, 950)  # the main area's left margin: no chart or box to catch the wheel
            page.mouse.wheel(0, box["y"] - top)
            time.sleep(0.8)
    page.mouse.move(5, 995)  # off the charts: no plotly toolbar or hover label in the picture
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    time.sleep(0.5)
    path = out / size / f"{name}.png"
    page.screenshot(path=str(path))
    SHOWN.append((point, size, f"{size}/{name}.png", what))


def scroll_until(page, js: str, tries: int = 30) -> None:
    """Scroll the view down a screen at a time until `js` holds (Streamlit mounts a chart near the view)."""
    page.evaluate(f"() => {{ ({SCROLLER})().scrollTop = 0; }}")
    for _ in range(tries):
        try:
            page.wait_for_function(js, timeout=3_000)
            return
        except PlaywrightTimeout:
            page.evaluate(f"() => {{ ({SCROLLER})().scrollTop += 700; }}")
    titles = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(p => JSON.stringify("
                           "(p.layout || {}).title || null).slice(0, 80))")
    print(f"  charts on the page: {titles}")
    page.wait_for_function(js, timeout=60_000)


def uploader(page, label: str):
    box = page.locator("[data-testid='stFileUploader']").filter(has_text=label).first
    box.wait_for(timeout=60_000)
    return box.locator("input[type=file]")


def number(page, label: str, value) -> None:
    box = page.get_by_role("spinbutton", name=label, exact=True)
    box.fill(str(value))
    box.press("Enter")
    idle(page)


def corpus(page) -> None:
    view(page, "Corpus")
    ready(page, "Dataset")
    idle(page)


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


def p06_specs(browser, url, size, out):
    """6: a bad spec line left out while the others apply; an unknown layer's short message."""
    page = open_app(browser, url, size)
    view(page, "Routing")
    specs(page, SIZES[size]["specs"])
    page.get_by_text("Left out").first.wait_for(timeout=300_000)
    idle(page)
    warns = page.locator("[data-testid='stAlert']").filter(has_text="Left out").all_inner_texts()
    cap = page.locator("[data-testid='stCaptionContainer']", has_text="Ablation:").first.inner_text()
    shoot(page, size, out, "06_specs_left_out", "6",
          f"Specs {SIZES[size]['specs']!r}: caption '{cap.strip()[:90]}'; "
          f"{len(warns)} warnings: {' | '.join(w.strip() for w in warns)}",
          locator=page.locator("[data-testid='stAlert']").filter(has_text="Left out").first, top=450)
    page.context.close()


def p07_below_top_k(browser, url, size, out):
    """7: dropping more experts than top-k leaves: a spec left out; at 4 experts the Drop boxes refused."""
    page = open_app(browser, url, size)
    view(page, "Routing")
    specs(page, SIZES[size]["too_many"])
    page.get_by_text("Left out").first.wait_for(timeout=300_000)
    idle(page)
    warns = page.locator("[data-testid='stAlert']").filter(has_text="Left out").all_inner_texts()
    shoot(page, size, out, "07_spec_below_top_k", "7",
          f"spec {SIZES[size]['too_many']!r}: {' | '.join(w.strip() for w in warns)}",
          locator=page.locator("[data-testid='stAlert']").filter(has_text="Left out").first, top=450)
    if size == "4experts":
        specs(page, "")
        for j in (1, 2, 3):
            page.get_by_text(f"Drop expert {j}", exact=True).click()
            idle(page)
        page.get_by_text("Cannot run this ablation").first.wait_for(timeout=120_000)
        err = page.locator("[data-testid='stAlert']").filter(has_text="Cannot run").first.inner_text()
        shoot(page, size, out, "07_boxes_below_top_k", "7",
              f"Drop expert 1, 2, 3 ticked (top-2 of 4): '{err.strip()}'")
        view(page, "Corpus")
        idle(page)
        shoot(page, size, out, "07_corpus_below_top_k", "7", "the Corpus view under the same boxes")
    page.context.close()


UTIL = ("t => [...document.querySelectorAll('.js-plotly-plot')].find(p => p.offsetParent && "
        "((p.layout.title || {}).text || '').includes(t))")


def p08_utilisation(browser, url, size, out):
    """8: the utilisation heatmap on a short prompt: dead only where reachable, legend, per-layer order. At
    4 experts the Routing view draws bars per layer instead (no heatmap, no flags): shot for reference."""
    page = open_app(browser, url, size, prompt="The little dog ran to the park.")
    view(page, "Routing")
    scroll_until(page, f"() => !!({UTIL})('Utilisation')")
    idle(page)
    chart = page.locator(".js-plotly-plot").filter(has_text="Utilisation").first
    title = page.evaluate(f"() => {{ const p = ({UTIL})('Utilisation'); return p.layout.title.text + "
                          "' | subtitle: ' + ((p.layout.title.subtitle || {}).text || '') + ' | x axis: ' + "
                          "((p.layout.xaxis.title || {}).text || ''); }")
    shoot(page, size, out, "08_utilisation_one_order", "8",
          f"the Routing view's utilisation chart on a short prompt (8 tokens and the generated ones): {title}",
          locator=chart, top=20)
    button = chart.locator(".updatemenu-button").filter(has_text="each layer")
    if button.count():
        button.first.click()
        time.sleep(1.5)
        axis = page.evaluate(f"() => (({UTIL})('Utilisation').layout.xaxis.title || {{}}).text || ''")
        shoot(page, size, out, "08_utilisation_each_layer", "8",
              f"the same heatmap after its 'each layer busiest first' button: x axis '{axis}'", locator=chart, top=20)
    page.context.close()


def p09_numbers(browser, url, size, out):
    """9: path attribution units, IG's convergence verdict, the exported page's title."""
    page = open_app(browser, url, size, prompt=SHORT_PROMPT if size == "4experts" else None)
    view(page, "Attribution")
    ready(page, "Predict the token after position")
    idle(page)
    page.get_by_role("button", name="Attribute").click()  # integrated gradients, the default method
    ready(page, "Convergence delta", timeout=600_000)
    idle(page)
    verdict = page.locator("[data-testid='stCaptionContainer']").filter(has_text="Convergence delta").first
    said = verdict.inner_text().strip()
    shoot(page, size, out, "09_ig_convergence_verdict", "9",
          f"integrated gradients: '...{said[said.find('Convergence delta'):][:200]}'", locator=verdict, top=450)
    pick_radio(page, "Method", "exact ablation (paths)")
    page.get_by_role("button", name="Attribute").click()
    page.locator("[data-testid='stDataFrame']").last.wait_for(timeout=600_000)
    page.wait_for_function(CHARTS_DRAWN, arg=1, timeout=120_000)
    idle(page)
    table = page.locator("[data-testid='stDataFrame']").last
    axis = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(p => "
                         "((p.layout.xaxis || {}).title || {}).text || '').join(' / ')")
    shoot(page, size, out, "09_path_attribution_units", "9",
          f"exact ablation: chart axis '{axis}' and the table's contribution column in one unit", locator=table,
          top=500)
    shoot(page, size, out, "09_path_attribution_table", "9", "the same table's first rows (3 significant digits "
          "in the chart's unit)", locator=table, top=60)
    view(page, "Export")
    idle(page)
    buttons = page.get_by_role("button", name=re.compile(r"\.html$"))
    buttons.first.wait_for(timeout=60_000)
    with page.expect_download(timeout=300_000) as dl:
        buttons.first.click()
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "figure.html"
        dl.value.save_as(html)
        titled_page(browser, html, size, out, "09_exported_page_title",
                    f"the Export view's first figure page ({dl.value.suggested_filename}), its <title> in a banner")
    page.context.close()


# a top-2 layer of 4 options never passes 50% of the slots (overloaded: > 2 x 25%), so no ▲ can come near 100%
# at 4 experts: papaformer-gumbel-v2 (top-1 over path 0, path 1, combined) with every option but path 0
# dropped sends all of its slots through path 0; at 128 x 24 top-8 a share stays under 12.5%
OVER_MODELS = {"4experts": [("papaformer-gumbel-v2", "*:1-2")], "128x24": [("qwen3-moe-128x24", None)]}


def p09_over_marker(browser, url, size, out):
    """9: ▲ over markers near 100% on the Corpus view's utilisation bars (the shipped dataset)."""
    for name, spec in OVER_MODELS[size]:
        page = open_app(browser, url, size, model=name)
        if spec:
            specs(page, spec)
            caption_shows(page, "drop ")  # the caption writes the spec its own way (*:1-2 as *:1,2)
        corpus(page)
        ready(page, "Utilisation, dead and overloaded options", timeout=600_000)
        page.wait_for_function(CHARTS_DRAWN, arg=1, timeout=300_000)
        idle(page)
        # _fullData: the traces as drawn, their arrays decoded (data holds plotly's typed-array encoding)
        flags = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(p => (p._fullData || "
                              "p.data).filter(d => d.type === 'bar').flatMap(d => Array.from(d.y || []).map((y, i) => "
                              "[y, (d.text || [])[i]]).filter(t => t[1] && t[1].includes('over'))))")
        top = max((y for y, _ in flags), default=None)
        print(f"  {name}: {len(flags)} bars with '▲ over', highest {top}")
        heading = page.get_by_text("Utilisation, dead and overloaded options", exact=True).first
        shoot(page, size, out, f"09_corpus_utilisation_over_markers_{name}", "9",
              f"{name}{f' under drop {spec}' if spec else ''}, Corpus view on the shipped dataset: {len(flags)} bars "
              f"marked '▲ over', the highest at {'-' if top is None else f'{top:.1%}'}", locator=heading, top=20)
        page.context.close()


def p09_paths_seed(browser, url, size, out):
    """9: the exact-ablation (path attribution) table on a seed checkpoint whose options are paths (pgpt)."""
    if size != "4experts":
        return
    page = open_app(browser, url, size, prompt=SHORT_PROMPT, model="pgpt")
    view(page, "Attribution")
    ready(page, "Predict the token after position")
    idle(page)
    pick_radio(page, "Method", "exact ablation (paths)")
    page.get_by_role("button", name="Attribute").click()
    page.locator("[data-testid='stDataFrame']").last.wait_for(timeout=600_000)
    page.wait_for_function(CHARTS_DRAWN, arg=1, timeout=120_000)
    idle(page)
    axis = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(p => "
                         "((p.layout.xaxis || {}).title || {}).text || '').join(' / ')")
    shoot(page, size, out, "09_path_attribution_units_pgpt", "9",
          f"pgpt (paths), exact ablation: chart axis '{axis}' and the table's contribution column in one unit",
          locator=page.locator("[data-testid='stDataFrame']").last, top=500)
    page.context.close()


def p10_link(browser, url, size, out):
    """10: Copy link, and the link opened in a fresh browser context."""
    page = open_app(browser, url, size, prompt="The little dog ran to the park with a red ball")
    spec = SIZES[size]["drop"] or "*:1"
    specs(page, spec)
    caption_shows(page, f"drop {spec}")
    view(page, "Routing")
    if size == "128x24":  # a layer other than the first: the link carries the view's layer too
        boxes = page.locator("[data-testid='stSelectbox']").filter(has=page.get_by_text("Layer", exact=True))
        next(b for b in boxes.all() if b.is_visible()).locator("div[role='combobox'], input").first.click()
        page.get_by_role("option", name="5 · model.layers.5.mlp.gate", exact=True).click()
        idle(page)
        page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(p => "
                               "JSON.stringify(p.layout.title || '').includes('model.layers.5.mlp.gate'))",
                               timeout=120_000)
    page.get_by_role("button", name="Copy link").click()
    code = page.locator("[data-testid='stPopoverBody'] [data-testid='stCode'] code").first
    code.wait_for(timeout=30_000)
    link = code.inner_text().strip()
    shoot(page, size, out, "10_copy_link", "10", f"Copy link's popover: {link[:200]}")
    page.keyboard.press("Escape")
    before = page.evaluate(GRID_CELLS) or page.evaluate(FIGURES)
    shoot(page, size, out, "10_link_source_page", "10", "the page the link was copied from")
    fresh = browser.new_context(viewport=VIEWPORT)  # no cookies: a new Streamlit session
    other = fresh.new_page()
    other.goto(link)
    ready(other, "updated in")
    caption_shows(other, f"drop {spec}")
    other.wait_for_function(MODEL_SHOWN, arg=SIZES[size]["model"], timeout=300_000)
    idle(other)
    if size == "128x24":
        other.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(p => "
                                "JSON.stringify(p.layout.title || '').includes('model.layers.5.mlp.gate'))",
                                timeout=120_000)
        idle(other)
    after = other.evaluate(GRID_CELLS) or other.evaluate(FIGURES)
    what = "route grid, cell by cell (text, tooltip, colour)" if size == "4experts" else \
        "visible figures (each one's title and every trace's type, x, y and z)"
    same = f"the same {what}" if after == before and before else \
        f"NOT the same {what} ({len(before)} vs {len(after)} items read)"
    path = urlsplit(link)
    shoot(other, size, out, "10_link_opened_fresh", "10",
          f"the link opened in a fresh browser context (query {path.query[:200]}): {same} as the page it "
          "was copied from")
    fresh.close()
    page.context.close()


# per route-grid row: each cell's tag, text, tooltip and colour (tests/e2e/test_browser_links.py's comparison)
GRID_CELLS = """() => [...document.querySelectorAll('table.rs-grid tr')].map(tr =>
    [...tr.children].map(c => [c.tagName, c.innerText, c.getAttribute('title') || '', c.style.backgroundColor || '']))"""


# every visible plotly figure: its title and each trace's type, x, y and z (the 128-expert Routing view draws an
# expert matrix instead of the HTML route grid)
FIGURES = """() => [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent).map(p =>
    JSON.stringify([(p.layout.title || {}).text || '', p.data.map(d => [d.type, d.x, d.y, d.z])]))"""


def p11_docs(browser, url, size, out):
    """11: the MkDocs site built into a temporary folder, a page opened from file://; the README's length."""
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    with tempfile.TemporaryDirectory() as tmp:
        mkdocs = [str(Path(sys.executable).with_name("mkdocs")), "build", "--strict", "-q", "-d", tmp]
        done = subprocess.run(mkdocs, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        print(f"  mkdocs build --strict: exit {done.returncode} {done.stderr.strip()[-300:]}")
        doc = browser.new_page(viewport=VIEWPORT)
        doc.goto((Path(tmp) / "views" / "index.html").as_uri())
        time.sleep(2)
        target = "routing_128x24" if size == "128x24" else "routing.png"
        img = doc.locator(f"img[src*='{target}']").first
        if img.count():
            img.evaluate("e => e.scrollIntoView({block: 'center'})")
            time.sleep(1)
        doc.screenshot(path=str(out / size / "11_docs_views_page.png"))
        SHOWN.append(("11", size, f"{size}/11_docs_views_page.png",
                      f"the docs site's Views page (mkdocs build --strict exit {done.returncode}) from file://, at "
                      f"its {target} screenshot; README.md is {lines} lines"))
        doc.close()


SHOTS = [p01_corpus_settings, p02_cancel, p03_toggle, p04_candidates, p05_comparison, p06_specs, p07_below_top_k,
         p08_utilisation, p09_numbers, p09_paths_seed, p09_over_marker, p10_link, p11_docs]
NOT_APPLICABLE += [("2 (exact-ablation Cancel)", "4experts",
                    "mixtral-tiny's 16 options are ablated within the second the Attribution view waits before it "
                    "shows a progress bar (app/views/attribution.py QUICK_SECONDS), so its result shows at once and no "
                    "Cancel is offered (02_exact_ablation_done_at_once.png); the same job's Cancel is shot on Shapley "
                    "sampling (02_shapley_*)"),
                   ("7 (Drop boxes)", "128x24", "no Drop box per expert at 128 experts: the spec box shows point 7"),
                   ("9 (▲ near 100%)", "128x24", "top-8 of 128 options: an option takes at most 1/8 of a layer's slots; "
                    "the Corpus view draws a heatmap with ✕/▲ marks (09_corpus_utilisation_over_markers_*)"),
                   ("9 (▲ near 100%)", "4experts", "mixtral-tiny is top-2 of 4 (a share stays under 50%): shot on "
                    "papaformer-gumbel-v2 with path 1 and combined dropped (all slots through path 0)"),
                   ("9 (path attribution)", "128x24", "pgpt's paths shot in 4experts/ only; the 128x24 table is the "
                    "MoE's own (3,072 options)"),
                   ("8 (heatmap)", "4experts", "at 4 options the Routing view draws utilisation as bars per layer "
                    "(rendering/families/topk.py: the heatmap with its dead/overloaded flags is for many options); "
                    "08_utilisation_one_order.png shows those bars"),
                   ("9 (Table 6)", "4experts", "Table 6 is PaPaformer's page; no MoE offers it"),
                   ("9 (Table 6)", "128x24", "Table 6 is PaPaformer's page; no MoE offers it")]


def write_index(out: Path, failed: list[str]) -> None:
    """INDEX.md from this run's rows and those of earlier runs of other shots (OUT/index_rows.json)."""
    store = out / "index_rows.json"
    rows = {(r[1], r[2]): r for r in (json.loads(store.read_text()) if store.exists() else [])}
    for r in SHOWN:
        rows[(r[1], r[2])] = list(r)
    rows = {k: r for k, r in rows.items() if (out / r[2]).exists()}
    store.write_text(json.dumps(list(rows.values()), ensure_ascii=False, indent=0))
    lines = ["# Issue 41: screenshots of the eleven points", "",
             "Taken by `scripts/shots_issue41.py` from a running app (Chromium 1600 x 1000): `4experts` is the "
             "shipped mixtral-tiny (4 experts, top-2, 4 layers), `128x24` a random Qwen3-MoE (128 experts, top-8, "
             "24 layers; tests/scale_models.scale_moe).", "", "| point | shot | what it shows |", "|---|---|---|"]
    for point, _size, file, what in sorted(rows.values(), key=lambda r: (r[1], r[2])):
        lines.append(f"| {point} | [{file}]({file}) | {what.replace('|', chr(92) + '|')} |")
    kept = out / "downloads.json"
    dls = {(d[0], d[1]): d for d in (json.loads(kept.read_text()) if kept.exists() else [])}
    dls.update({(d[0], d[1]): list(d) for d in DOWNLOADS})
    kept.write_text(json.dumps(list(dls.values()), ensure_ascii=False, indent=0))
    if dls:
        lines += ["", "## Point 5: the comparison's downloads", ""] + [
            f"- {size}: `{button}` downloads as `{name}`: `{head}`" for size, button, name, head in dls.values()]
    lines += ["", "## Not applicable", ""] + [f"- {p} at {s}: {why}" for p, s, why in NOT_APPLICABLE]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines += ["", "## Point 7 in the docs", "",
              f"README.md ({len(readme.splitlines())} lines) states "
              f"{'it' if 'fewer options' in readme else 'nothing of it itself'}; docs/cli.md (linked from the "
              "README's table): " + next((ln.strip() for ln in (ROOT / "docs" / "cli.md").read_text(
                  encoding="utf-8").split("\n\n") if "fewer options than its router" in ln), "(not found)")
              .replace("\n", " ")]
    seen = out / "notes.json"
    notes = list(dict.fromkeys((json.loads(seen.read_text()) if seen.exists() else []) + NOTES))
    seen.write_text(json.dumps(notes, ensure_ascii=False, indent=0))
    if notes:
        lines += ["", "## Seen on the way", ""] + [f"- {n}" for n in notes]
    if failed:
        lines += ["", "## Steps that failed", ""] + [f"- {f}" for f in failed]
    (out / "INDEX.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "build":
        build(Path(argv[1]))
        return 0
    sizes = list(SIZES)
    if "--size" in argv:
        i = argv.index("--size")
        sizes = argv[i + 1].split(",")
        argv = argv[:i] + argv[i + 2:]
    if len(argv) not in (2, 3):
        print("usage: shots_issue41.py build ROOT | APP_URL OUT_DIR [SHOT,SHOT...] [--size 4experts,128x24]",
              file=sys.stderr)
        return 2
    url, out = argv[0], Path(argv[1])
    only = argv[2].split(",") if len(argv) == 3 else None
    failed: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for size in sizes:
                (out / size).mkdir(parents=True, exist_ok=True)
                for shot in [s for s in SHOTS if only is None or s.__name__ in only]:
                    t0 = time.perf_counter()
                    try:
                        shot(browser, url, size, out)
                        print(f"{size} {shot.__name__}: done in {time.perf_counter() - t0:.0f} s", flush=True)
                    except Exception as e:  # say so in one line, keep what the page showed, go on
                        line = f"{size} {shot.__name__}: not taken: {str(e).splitlines()[0]}"
                        failed.append(line)
                        print(line, flush=True)
                        for ctx in browser.contexts:
                            for page in ctx.pages:
                                page.screenshot(path=str(out / size / f"{shot.__name__}_where_it_stopped.png"))
                            ctx.close()
        finally:
            browser.close()
    write_index(out, failed)
    return len(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
