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
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import sync_playwright

from shots41_page import (CHROMIUM, ARGS, ROOT, VIEWPORT, CHARTS_DRAWN, MODEL_SHOWN, SHORT_PROMPT, SIZES, SHOWN,
                          NOT_APPLICABLE, NOTES, DOWNLOADS, build, idle, ready, open_app, view, pick_radio,
                          caption_shows, specs, shoot, scroll_until, corpus)
from shots41_first import (p01_corpus_settings, p02_cancel, p03_toggle, p04_candidates, p05_comparison, titled_page)


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
                   ("9 (PaPaformer's probe table)", "4experts", "PaPaformer's own page; no MoE offers it"),
                   ("9 (PaPaformer's probe table)", "128x24", "PaPaformer's own page; no MoE offers it")]


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
