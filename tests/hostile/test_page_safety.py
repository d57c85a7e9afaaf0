"""Pages built from hostile names and values (issue 29, item 1): corpus.html, report.html, a figure
page and the app's HTML route grid, made from a dataset whose file name, label column names and
label values, and a checkpoint whose directory name, are script injections in every context a
page has (HTML text, attribute, JS string, JSON inside <script>, a `<!--<script>` that would make
the JSON swallow the page's end, U+2028/9). Without a browser: no payload appears verbatim in any
page, and the embedded JSON reads back as the data. In Debian's Chromium: nothing ran (each
payload calls `__ran`, which the test defines before the page loads), no dialog opened, every
figure was drawn and the page was read to its end."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from routescope.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CK = ROOT / "checkpoints" / "papaformer-gumbel-v2"

# every payload calls __ran(k) if a browser ever runs it
PAYLOADS = [
    '");__ran(1);//',  # out of a double-quoted JS string (plotly's getElementById("<id>"))
    "');__ran(2);//",
    "</script><script>__ran(3)</script>",  # out of the script element
    "<!--<script>",  # the JSON in <script> would swallow the page's closing tags
    "<img src=x onerror=__ran(5)>",
    '"><svg onload=__ran(6)>',  # out of an attribute
    "\u2028\u2029x';__ran(7)//",
    "x\n\n<img src=y onerror=__ran(8)>",  # a blank line: the end of a Markdown HTML block
    "<iframe srcdoc='<script>parent.__ran(9)</script>'></iframe>",
]
LABELS = PAYLOADS[:6]  # label column names (file names and values get the rest too)


def hostile_dataset(directory: Path) -> Path:
    rows = ["Once upon a time, there was a little girl named Lily.", "Solve for x: 3x + 5 = 20.",
            "She loved to play in the park with her red ball.", "What is 12 divided by 4?"]
    df = pd.DataFrame({"text": rows})
    for i, col in enumerate(LABELS):
        df[col] = [PAYLOADS[(i + k) % len(PAYLOADS)] for k in range(len(rows))]
    path = directory / "d<img src=x onerror=__ran(10)>.csv"
    df.to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """corpus.html (and its run's corpus.json), report.html, a figure page and a route grid page."""
    d = tmp_path_factory.mktemp("pages")
    ck = d / "ck<svg onload=__ran(11)>"
    shutil.copytree(CK, ck)
    data = hostile_dataset(d)
    out = d / "out"
    assert main(["corpus", str(ck), "--data", str(data), "--out", str(out), "--quiet", "--max-tokens", "16",
                 "--min-count", "1"]) == 0
    report = d / "r.html"
    assert main(["report", str(ck), "--out", str(report), "--docs", "1", "--seq-len", "24", "--min-count", "1"]) == 0
    from routescope.rendering.route_heatmaps import ChoiceGrid
    from routescope.rendering.route_grid import CSS, route_grid_html
    from routescope.app.views.export import figure_html
    import plotly.graph_objects as go

    z = np.array([[0.0, 1.0, np.nan]])
    hover = np.array([[PAYLOADS[0], PAYLOADS[3], PAYLOADS[7]]], dtype=object)
    grid = route_grid_html([ChoiceGrid(z, hover, [PAYLOADS[4]], [PAYLOADS[5], PAYLOADS[2]], PAYLOADS[7])],
                           [PAYLOADS[1], PAYLOADS[6], PAYLOADS[8]])
    (d / "grid.html").write_text(f"<!DOCTYPE html><html><body>{CSS}{grid}<p id='end'>end</p></body></html>")
    fig = go.Figure(go.Bar(x=LABELS, y=list(range(len(LABELS))), name=PAYLOADS[2]))
    fig.update_layout(title=PAYLOADS[6])
    (d / "figure.html").write_text(figure_html(fig))
    return {"corpus": out / "corpus.html", "json": out / "corpus.json", "report": report, "grid": d / "grid.html",
            "figure": d / "figure.html"}


def test_no_payload_verbatim_and_the_json_reads_back(pages):
    for name in ("corpus", "report", "grid", "figure"):
        html = pages[name].read_text(encoding="utf-8")
        for p in PAYLOADS + ["__ran(10)>", "<svg onload=__ran(11)>"]:
            if "<" in p or ">" in p:  # markup: only escaping keeps it out of the page
                assert p not in html, (name, p)
        for script in re.findall(r"<script[^>]*>(.*?)</script>", html, re.S):
            assert "\u2028" not in script and "\u2029" not in script and "<!--" not in script, name
    html = pages["corpus"].read_text(encoding="utf-8")
    assert re.findall(r'<div id="([^"]+)" class="plotly-graph-div"', html) == [
        f"fig-{i}" for i in range(1, html.count('class="plotly-graph-div"') + 1)]
    block = re.search(r'<script type="application/json" id="corpus-data">(.*?)</script>', html, re.S).group(1)
    doc = json.loads(block)
    shares = pd.DataFrame(doc["tables"]["label_shares"]["data"], columns=doc["tables"]["label_shares"]["columns"])
    assert set(shares["label_column"]) == set(LABELS)
    assert set(shares["label_value"]) == set(PAYLOADS)
    assert doc["meta"]["a"]["model"] == "ck<svg onload=__ran(11)>"


@pytest.mark.e2e
def test_nothing_runs_in_chromium(pages, browser):  # the run's one Chromium (tests/conftest.py)
    for name in ("corpus", "report", "grid", "figure"):
        page = browser.new_page()
        dialogs = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.add_init_script("window.__hits = []; window.__ran = k => window.__hits.push(k);")
        page.goto(pages[name].as_uri(), wait_until="load")
        figures = page.locator(".plotly-graph-div").count()
        page.wait_for_function(f"() => document.querySelectorAll('.plotly-graph-div .main-svg').length >= "
                               f"{figures}", timeout=60_000)
        page.wait_for_timeout(300)  # an onerror of a broken image fires after load
        assert page.evaluate("window.__hits") == [], name
        assert dialogs == [], name
        assert page.evaluate("document.querySelectorAll('iframe, svg[onload], img[onerror]').length") == 0
        if name == "corpus":  # the whole page was read: the data block parses, every section is there
            doc = page.evaluate("JSON.parse(document.getElementById('corpus-data').textContent)")
            assert json.loads(pages["json"].read_text())["tables"] == sorted(doc["tables"])
            assert figures >= len(LABELS)  # one label-share figure per hostile column, and more
        if name == "grid":
            assert page.locator("#end").count() == 1
        page.close()
