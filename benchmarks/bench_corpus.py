"""Issue 22 items 5 and 6: the Corpus view's speed and memory against `routescope export`, and the
app's first paint.

Prompts: 64-token texts (story and math training documents, whitespace folded, cut where the cut
re-encodes to exactly 64 tokens with the shipped tokenizer), one per line in a .txt file.

1. App vs export, 1,000 prompts on papaformer-gumbel-v2, one torch thread each, interleaved
   (export, app, export, app, ...):
   - export: `python -m routescope.cli --threads 1 export CK --prompts FILE --out F.parquet --quiet` in a
     fresh process; its wall time ("export, whole command": imports and model load included) and the
     time of the command's own run after the imports (`cli.main.main` timed inside the child: "export
     run"). The ratio's denominator is the export run (the stricter of the two).
   - app: `routescope app` (ROUTESCOPE_THREADS=1) in Chromium (Playwright): the Corpus view, "File
     on the server", the file's path entered; from pressing Enter until the view shows the
     statistics (the job on its background thread, the progress bar, the rerun). Each repetition
     routes a copy of the file with another trailing blank line: another digest, so nothing is
     cached, the same rows.
   - responsiveness: while a job routes the prompts, a click on the Generation view; the time until
     that view is drawn (the job keeps running).
2. Peak memory in the number of prompts: a fresh process per size (1,000 and 10,000) runs the app's
   code path (`corpus_data.load_corpus` with the app's limits, `corpus_run.CorpusJobs`), its peak
   RSS (ru_maxrss); goal: 10,000 / 1,000 <= 1.2x.
3. First paint (item 6): on the warm server, new pages (each its own browser context, so nothing is
   cached in the browser) from `page.goto` until the Routing view's route grid is painted, and until
   the first plotly heatmap is; goal: route grid <= 1 s (median). Also the switch from the
   Generation view back to the Routing view on a computed run.

--quick: 200 / 2,000 prompts, one repetition. --results PATH writes the report into PATH's
`bench_corpus` section.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common as C

CHECKPOINT = "papaformer-gumbel-v2"
TOKENS = 64
SECTION = ("<!-- bench_corpus -->", "<!-- /bench_corpus -->")
GRID = "() => { const c = document.querySelector('.rs-grid td'); return !!(c && c.offsetParent); }"
HEATMAP = ("() => [...document.querySelectorAll('.js-plotly-plot')].some(p => p.offsetParent && "
           "(p.data || []).some(t => t.type === 'heatmap') && p.querySelector('.heatmaplayer image'))")
PAINTED = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
        "--no-first-run", "--disable-component-update", "--disable-sync"]


def prompts_file(n: int) -> Path:
    """n prompts of exactly TOKENS tokens, one per line (cached)."""
    path = C.CACHE / f"corpus-prompts-{TOKENS}-{n}.txt"
    if path.is_file():
        return path
    from routescope.core_models.checkpoint import load_tokenizer_file
    from routescope.corpora.corpus import iter_documents

    tok = load_tokenizer_file(C.tokenizer_path())
    streams, out = [iter_documents("story", 7), iter_documents("math", 7)], []
    while len(out) < n:
        ids = tok.encode(" ".join(next(streams[len(out) % 2]).split())).ids
        for cut in range(TOKENS, min(len(ids), TOKENS + 8) + 1):
            text = tok.decode(ids[:cut])
            if "\n" not in text and text.strip() and len(tok.encode(text).ids) == TOKENS:
                out.append(text)
                break
    C.CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


# --- children -------------------------------------------------------------------------------------

def child(payload: dict) -> dict:
    """In a fresh process: "export" (the command's run, imports done) or "memory" (the app's path)."""
    import resource

    if payload["what"] == "export":
        from routescope.cli import export as _  # noqa: F401  (imports before the clock starts)
        from routescope.cli.main import main
        t0 = time.perf_counter()
        code = main(["--threads", "1", "export", payload["checkpoint"], "--prompts", payload["prompts"], "--out",
                     payload["out"], "--quiet"])
        seconds = time.perf_counter() - t0
        if code:
            raise SystemExit(f"export exited {code}")
        return {"seconds": seconds}
    import torch

    from routescope.analysis.inputs import datasets as D
    from routescope.analysis.corpus.run import CorpusJobs, run_corpus
    from routescope.core_models.checkpoint import load_checkpoint

    torch.set_num_threads(1)
    model, tok = load_checkpoint(payload["checkpoint"])
    start_rss = C.rss_mb()
    t0 = time.perf_counter()
    data = D.load_corpus(payload["prompts"], limits=D.APP_LIMITS)
    job = CorpusJobs().submit("k", data.n_rows, lambda progress: run_corpus(model, tok, data, name="m",
                                                                             progress=progress))
    job.finished.wait()
    if job.error:
        raise SystemExit(job.error)
    return {"seconds": time.perf_counter() - t0, "rows": job.result.stats.n_rows, "tokens": job.result.stats.n_tokens,
            "start_rss_mb": start_rss, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def export_once(ckpt: Path, prompts: Path, out: Path) -> tuple[float, float]:
    """(whole command wall seconds, the command's run after imports) of one export in a fresh process."""
    t0 = time.perf_counter()
    r = C.run_child("benchmarks.bench_corpus", {"what": "export", "checkpoint": str(ckpt), "prompts": str(prompts),
                                                "out": str(out)}, threads=1)
    return time.perf_counter() - t0, r["seconds"]


# --- the app in a browser ---------------------------------------------------------------------------

class App:
    """`routescope app` on a free port, stopped with everything it started."""

    def __enter__(self) -> "App":
        sys.path.insert(0, str(C.ROOT / "tests"))
        from procs import free_port, running, wait_for_health
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(C.CACHE / "bench_corpus_app.log", "w")
        self._ctx = running([sys.executable, "-m", "routescope.cli", "app", "--port", self.url.rsplit(":", 1)[1],
                             "--headless", "--address", "127.0.0.1"], cwd=C.ROOT,
                            env={**os.environ, "ROUTESCOPE_THREADS": "1"}, stdin=subprocess.DEVNULL, stdout=self.log,
                            stderr=subprocess.STDOUT)
        proc = self._ctx.__enter__()
        wait_for_health(self.url, proc)
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)
        self.log.close()


def _idle(page) -> None:
    time.sleep(0.3)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=300_000)


FIRST_ELEMENT = ("() => [...document.querySelectorAll('[data-testid=\"stSidebar\"] h1')]"
                 ".some(h => h.innerText.includes('RouteScope'))")


def _open(browser, url: str, floor: list | None = None):
    """(seconds to the route grid painted, seconds to the first plotly heatmap painted, page);
    `floor` gets the seconds to the page's first element (the sidebar's title): Streamlit's own
    loading, before any of the app's views."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    t0 = time.perf_counter()
    page.goto(url)
    if floor is not None:
        page.wait_for_function(FIRST_ELEMENT, timeout=300_000, polling="raf")
        floor.append(time.perf_counter() - t0)
    page.wait_for_function(GRID, timeout=300_000, polling="raf")
    page.evaluate(PAINTED)
    grid = time.perf_counter() - t0
    page.wait_for_function(HEATMAP, timeout=300_000, polling="raf")
    page.evaluate(PAINTED)
    return grid, time.perf_counter() - t0, page


def _corpus_on(page, path: Path, switch_away: bool = False) -> tuple[float, float | None]:
    """Route the file at `path` in the Corpus view: seconds from Enter to the statistics shown, and
    (switch_away) the seconds the Generation view took to draw while the job ran."""
    page.get_by_role("radio", name="Corpus", exact=True).click()
    page.get_by_text("File on the server", exact=True).click()
    box = page.get_by_label("Path on the server")
    box.wait_for(timeout=60_000)
    _idle(page)
    box.fill(str(path))
    t0 = time.perf_counter()
    box.press("Enter")
    switch = None
    if switch_away:
        page.locator("[data-testid='stProgress']").first.wait_for(timeout=60_000)  # the job is running
        s0 = time.perf_counter()
        page.get_by_role("radio", name="Generation", exact=True).click()
        page.get_by_text("Every step as a table").first.wait_for(timeout=60_000)
        page.evaluate(PAINTED)
        switch = time.perf_counter() - s0
        page.get_by_role("radio", name="Corpus", exact=True).click()
    page.get_by_text("Utilisation, dead and overloaded options").first.wait_for(timeout=600_000)
    page.evaluate(PAINTED)
    return time.perf_counter() - t0, switch


def run(args) -> C.Report:
    from playwright.sync_api import sync_playwright

    rep = C.Report("bench_corpus", "Issue 22: the Corpus view against `routescope export`, memory, first paint")
    ckpt, source = C.checkpoint_dir(CHECKPOINT)
    small, big = (200, 2000) if args.quick else (1000, 10000)
    reps = 1 if args.quick else 3
    prompts = prompts_file(small)
    work = Path(tempfile.mkdtemp(prefix="bench-corpus-"))
    try:
        exports, app_times, switches = [], [], []
        with App() as app, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            _, _, page = _open(browser, app.url)  # warms the server's default run
            page.close()
            for r in range(reps):
                exports.append(export_once(ckpt, prompts, work / f"e{r}.parquet"))
                copy = work / f"p{r}.txt"  # another digest: nothing cached, the same rows
                shutil.copyfile(prompts, copy)
                with copy.open("a") as f:
                    f.write("\n" * (r + 1))
                page = browser.new_page(viewport={"width": 1500, "height": 1100})
                page.goto(app.url)
                page.wait_for_function(GRID, timeout=300_000)
                _idle(page)
                seconds, _ = _corpus_on(page, copy)
                app_times.append(seconds)
                page.close()
            copy = work / "switch.txt"
            shutil.copyfile(prompts, copy)
            with copy.open("a") as f:
                f.write("\n" * 9)
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(app.url)
            page.wait_for_function(GRID, timeout=300_000)
            _idle(page)
            _, switch = _corpus_on(page, copy, switch_away=True)
            switches.append(switch)
            page.close()
            # first paint on the warm server
            grids, charts, floors = [], [], []
            for _ in range(3 if args.quick else 7):
                g, h, page = _open(browser, app.url, floors)
                grids.append(g)
                charts.append(h)
                page.close()
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(app.url)
            page.wait_for_function(HEATMAP, timeout=300_000)
            _idle(page)
            page.get_by_role("radio", name="Generation", exact=True).click()
            page.get_by_text("Every step as a table").first.wait_for(timeout=60_000)
            _idle(page)
            t0 = time.perf_counter()
            page.get_by_role("radio", name="Routing", exact=True).click()
            page.wait_for_function(HEATMAP, timeout=60_000, polling="raf")
            page.evaluate(PAINTED)
            back_to_routing = time.perf_counter() - t0
            page.close()
            browser.close()
        whole = [w for w, _ in exports]
        runs = [s for _, s in exports]
        t = C.Table(f"{small:,} prompts of {TOKENS} tokens, {CHECKPOINT} ({source}), 1 torch thread, interleaved",
                    ["what", "median s", "each s", "prompts/s"])
        t.add("export, whole command (fresh process)", C.median(whole), ", ".join(f"{x:.2f}" for x in whole),
              small / C.median(whole))
        t.add("export run (after imports)", C.median(runs), ", ".join(f"{x:.2f}" for x in runs), small / C.median(runs))
        t.add("app: Enter to statistics shown", C.median(app_times), ", ".join(f"{x:.2f}" for x in app_times),
              small / C.median(app_times))
        ratio = C.median(app_times) / C.median(runs)
        t.notes.append(f"app / export run: {ratio:.3f}x; app / export whole command: "
                       f"{C.median(app_times) / C.median(whole):.3f}x")
        t.notes.append(f"while a job routed the prompts, a click on the Generation view drew it in "
                       f"{switches[0] * 1000:.0f} ms (the job kept running on its thread)")
        rep.tables.append(t)
        rep.goals.append(C.Goal("22.5.speed", f"app / export run, {small:,} prompts of {TOKENS} tokens", "<=", 1.5,
                                ratio))
        mem = {n: C.run_child("benchmarks.bench_corpus", {"what": "memory", "checkpoint": str(ckpt),
                                                          "prompts": str(prompts_file(n))}, threads=1)
               for n in (small, big)}
        m = C.Table("The app's corpus code path in a fresh process per size (load_corpus with the app's limits, "
                    "CorpusJobs)", ["prompts", "tokens", "seconds", "prompts/s", "RSS after load MiB", "peak RSS MiB"])
        for n, r in mem.items():
            m.add(f"{n:,}", f"{r['tokens']:,}", r["seconds"], n / r["seconds"], r["start_rss_mb"], r["peak_rss_mb"])
        rep.tables.append(m)
        rep.goals.append(C.Goal("22.5.memory", f"corpus peak RSS at {big:,} prompts / at {small:,}", "<=", 1.2,
                                mem[big]["peak_rss_mb"] / mem[small]["peak_rss_mb"]))
        f = C.Table("First paint on a warm server (new page, empty browser cache, from goto)",
                    ["what", "median ms", "each ms"])
        f.add("the page's first element (sidebar title): Streamlit's own loading", 1000 * C.median(floors),
              ", ".join(f"{1000 * x:.0f}" for x in floors))
        f.add("route grid painted (Routing view, the default)", 1000 * C.median(grids),
              ", ".join(f"{1000 * x:.0f}" for x in grids))
        f.add("first plotly heatmap painted", 1000 * C.median(charts), ", ".join(f"{1000 * x:.0f}" for x in charts))
        f.add("switch Generation -> Routing on a computed run", 1000 * back_to_routing, "-")
        f.notes.append("before this issue (the issue's figures): 5.7 s to the first heatmap, 2.2 s of it the first "
                       "switch to the Routing view; the app now opens on the Routing view")
        rep.tables.append(f)
        rep.goals.append(C.Goal("22.6.first-paint", "warm server: page open to the first routing heatmap (route "
                                "grid), median", "<=", 1000.0, 1000 * C.median(grids), unit="ms"))
        rep.notes.append(f"machine: {C.cpu_model()}, {os.cpu_count()} cores; app and Chromium share them")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rep



def main() -> None:
    import torch

    p = C.parser(__doc__)
    p.add_argument("--results", metavar="PATH", help="write the report into PATH's bench_corpus section")
    args = p.parse_args()
    C.setup(args)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    rep = run(args)
    rep.seconds = time.perf_counter() - t0
    rep.notes.append(f"{rep.seconds:.0f} s in all; {torch.get_num_threads()} torch thread(s) in the driver; load "
                     f"average (1 min) {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    text = rep.render() + ("\n(QUICK mode: a smoke test, not the measurement)\n" if args.quick else "")
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(rep)))
    if args.results:
        C.write_section(Path(args.results), text, SECTION)


if __name__ == "__main__":
    main()
