"""The browser side of scripts/shots_issue41.py: the checkpoints its shots need (`build`) and the steps that
drive the app in Debian's Chromium (Playwright), with the lists the shots fill for INDEX.md."""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from playwright.sync_api import TimeoutError as PlaywrightTimeout

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
