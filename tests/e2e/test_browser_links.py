"""Issue 41 in Chromium: a link reopens the view. Set a checkpoint, a prompt, an ablation spec and the
Routing view, read the link under "Copy link", open it in a fresh browser context (a new Streamlit
session: no cookies, no session state), and compare the two pages' route grids cell by cell (each
cell's colour, the option picked there, and its tooltip), with the widgets and the ablation caption.
Then a stale link (an unknown checkpoint, a bad spec) opens the default page with one line each."""
from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from test_browser import _caption_shows, _idle, _pick, _ready

pytestmark = pytest.mark.e2e

CHECKPOINT = "papaformer-gumbel-v1"  # not the default: the link has to pick it
PROMPT = "The little dog ran to the park with a red ball"
SPEC = "*:1"
# per grid row: its header cell, then every cell's colour and tooltip (the route picked there, in words)
GRID_CELLS = """() => [...document.querySelectorAll('table.rs-grid tr')].map(tr =>
    [...tr.children].map(c => [c.tagName, c.innerText, c.getAttribute('title') || '',
                               c.style.backgroundColor || '']))"""


def _grid(page) -> list:
    page.locator("table.rs-grid").first.wait_for(timeout=60_000)
    return page.evaluate(GRID_CELLS)


def _copy_link(page) -> str:
    page.get_by_role("button", name="Copy link").click()
    code = page.locator("[data-testid='stPopoverBody'] [data-testid='stCode'] code").first
    code.wait_for(timeout=30_000)
    url = code.inner_text().strip()
    page.keyboard.press("Escape")
    return url


def test_a_copied_link_reopens_the_same_route_grid_in_a_fresh_browser(app_url, browser):
    first = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = first.new_page()
    page.goto(app_url)
    _ready(page, "updated in")
    _pick(page, CHECKPOINT)
    box = page.get_by_role("textbox", name="Prompt")
    box.fill(PROMPT)
    box.press("Control+Enter")
    page.wait_for_function("e => [...document.querySelectorAll('.rs-text')].some(x => x.innerText.includes(e))",
                           arg="red ball", timeout=60_000)
    page.get_by_text("Specs (ranges, all but, most used)").click()
    specs = page.get_by_role("textbox", name="Specs")
    specs.fill(SPEC)
    specs.press("Control+Enter")
    _caption_shows(page, f"drop {SPEC}")
    page.get_by_role("radio", name="Generation", exact=True).click()
    _idle(page)
    page.get_by_role("radio", name="Routing", exact=True).click()
    _idle(page)
    before = _grid(page)
    url = _copy_link(page)
    query = {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}
    assert url.startswith(app_url)
    assert {k: query.get(k) for k in ("checkpoint", "prompt", "ablate", "view")} == {
        "checkpoint": CHECKPOINT, "prompt": PROMPT, "ablate": SPEC, "view": "Routing"}
    assert parse_qs(urlsplit(page.url).query) == parse_qs(urlsplit(url).query)  # the address bar holds it too

    fresh = browser.new_context(viewport={"width": 1600, "height": 1000})  # no cookies: a new session
    other = fresh.new_page()
    other.goto(url)
    _ready(other, "updated in")
    _caption_shows(other, f"drop {SPEC}")
    _idle(other)
    after = _grid(other)
    # the same tokens across the head, the same layers down the side, every cell's route the same
    assert after == before
    tokens = " ".join(c[1] for c in before[0])
    assert "dog" in tokens and len(before) > 2 and sum(len(r) for r in before) > 20
    # the prompt box mounts a moment after the fragment's caption (Streamlit loads the widget's code lazily)
    other.wait_for_function("e => [...document.querySelectorAll('textarea')].some(t => t.value === e)", arg=PROMPT,
                            timeout=30_000)
    picker = other.locator("[data-testid='stSelectbox']").filter(has_text="Checkpoint").first
    shown = picker.evaluate("e => e.innerText + ' ' + [...e.querySelectorAll('input')].map(i => i.value).join(' ')")
    assert CHECKPOINT in shown, shown
    assert not other.locator("[data-testid='stAlert']").filter(has_text="Link:").count()
    first.close()
    fresh.close()


def test_a_stale_link_opens_the_default_page_with_a_line_per_value(app_url, browser):
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    page.goto(f"{app_url}/?checkpoint=gone-model&ablate=*:zz&seed=abc&view=Routing")
    _ready(page, "updated in")
    notices = page.locator("[data-testid='stAlert']").filter(has_text="Link:")
    notices.first.wait_for(timeout=30_000)
    lines = notices.all_inner_texts()
    assert len(lines) == 3 and all("\n" not in t.strip() for t in lines), lines
    for name in ("checkpoint", "ablate", "seed"):
        assert sum(name in t for t in lines) == 1, (name, lines)
    _caption_shows(page, "Ablation: none")
    page.locator("table.rs-grid").first.wait_for(timeout=60_000)  # the default checkpoint's Routing view
    assert "checkpoint=papaformer-gumbel-v2" in page.url and "seed=0" in page.url and "ablate" not in page.url
    context.close()
