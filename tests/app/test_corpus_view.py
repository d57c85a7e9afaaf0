"""The Corpus view with Streamlit's AppTest: a labelled TSV uploaded, its per-label shares,
dead/overloaded flags, specialisation and the comparison of papaformer-gumbel-v1 with -v2 equal to
the analysis run directly; a bad upload's one line; a comparison that cannot be made says why; a
family without per-token routes says what it shows; the app opens on the routing heatmap."""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest

from routescope.analysis.corpus import stats as S
from routescope.analysis.corpus import compare as CMP
from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus import shipped as SH
from routescope.analysis.corpus.run import CorpusSettings, run_corpus
from routescope.analysis.export.csv_format import read_frame_csv
from routescope.app import state as K
from routescope.core_models.checkpoint import load_checkpoint
from routescope.analysis.export.plotly_bundle import plotly_js

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app" / "main.py")
CK = ROOT / "checkpoints"
TSV = ("text\ttopic\n" + "".join(f"{t}\t{lab}\n" for t, lab in [
    ("Once upon a time, there was a little girl named Lily.", "story"),
    ("She loved to play in the park with her red ball.", "story"),
    ("The dog looked sad and lonely under the big tree.", "story"),
    ("Solve for x: 3x + 5 = 20.", "math"),
    ("What is 12 divided by 4? Express your answer as a fraction.", "math"),
    ("Find the sum of 7 and 15, then simplify.", "=HYPERLINK(\"x\")"),
])).encode("utf-8")


@pytest.fixture
def downloads(monkeypatch):
    files: dict[str, tuple[str, bytes]] = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def record(self, data, mimetype, kind, filename=None):
        fid = original(self, data, mimetype, kind, filename)
        files[fid] = (filename, data if isinstance(data, bytes) else Path(data).read_bytes())
        return fid

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", record)
    return files


def corpus_view(name: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    box = at.selectbox(key=K.CHECKPOINT)
    box.set_value(next(p for p in box.options if Path(p).name == name)).run()
    at.segmented_control(key=K.VIEW).set_value("Corpus").run()
    return at


def until_done(at: AppTest, timeout: float = 120) -> AppTest:
    """Rerun while the job's progress bar shows (AppTest does not run the polling fragment itself)."""
    deadline = time.time() + timeout
    while at.get("progress") and time.time() < deadline:
        time.sleep(0.3)
        at.run()
    assert not at.get("progress"), "the corpus job did not finish"
    assert not at.exception, [e.value for e in at.exception]
    return at


# a table of the view by the columns only it has (AppTest does not report a dataframe's key)
COLUMNS = {"summary": {"metric", "value"}, "utilisation_table": {"slot_share", "dead"},
           "label_shares_table": {"label_value", "reading", "share"}, "specialisation": {"g2", "share_of_token"},
           "call_values_table": {"kind", "scope", "mean"},
           "compare_utilisation_table": {"slot_share (papaformer-gumbel-v2 − papaformer-gumbel-v1)"},
           "compare_label_shares_table": {"share (papaformer-gumbel-v2 − papaformer-gumbel-v1)"}}


def tables_of(at: AppTest) -> list[pd.DataFrame]:
    return [d.value for d in at.dataframe if isinstance(d.value, pd.DataFrame)]


def table(at: AppTest, name: str) -> pd.DataFrame:
    want = COLUMNS[name]
    found = [t for t in tables_of(at) if want <= set(t.columns) and (name.startswith("compare_") or
                                                                   not any(c.endswith(")") for c in t.columns))]
    assert len(found) == 1, (name, [list(t.columns) for t in tables_of(at)])
    return found[0]


def upload(at: AppTest, name: str, data: bytes) -> AppTest:
    at.radio(key=K.CORPUS_SOURCE).set_value("Upload a file").run()
    at.file_uploader(key=K.CORPUS_UPLOAD).set_value((name, data, "text/plain")).run()
    return at


def test_app_opens_on_the_routing_heatmap():
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    assert not at.exception and not at.error
    assert at.segmented_control(key=K.VIEW).value == "Routing"
    charts = at.get("plotly_chart")
    assert charts and any('"type":"heatmap"' in c.proto.spec.replace(" ", "") for c in charts)


def test_uploaded_tsv_per_label_shares_flags_specialisation_and_comparison(downloads):
    at = upload(corpus_view("papaformer-gumbel-v1"), "probes.tsv", TSV)
    at.selectbox(key=K.CORPUS_COMPARE).set_value(str(CK / "papaformer-gumbel-v2")).run()
    at.number_input(key=K.CORPUS_MIN_COUNT).set_value(1).run()
    until_done(at)
    assert not at.error, [e.value for e in at.error]
    # the same statistics computed directly, as the command line does
    data = D.load_corpus(TSV, "probes.tsv")
    tables = {}
    for name in ("papaformer-gumbel-v1", "papaformer-gumbel-v2"):
        model, tok = load_checkpoint(CK / name)
        max_tokens = at.number_input(key=K.CORPUS_MAX_TOKENS).value
        res = run_corpus(model, tok, data, name=name, settings=CorpusSettings(max_tokens=max_tokens),
                         decode=lambda i, t=tok: t.decode([i]))
        tables[name] = res.tables(top=10, min_count=1)
    want = tables["papaformer-gumbel-v1"]
    shares = table(at, "label_shares_table")
    assert set(shares["label_value"]) == {"story", "math", '=HYPERLINK("x")'}
    pd.testing.assert_frame_equal(shares.reset_index(drop=True), want["label_shares"], check_dtype=False)
    util = table(at, "utilisation_table")
    pd.testing.assert_frame_equal(util.reset_index(drop=True), want["utilisation"], check_dtype=False, check_like=True)
    assert {"dead", "overloaded"} <= set(util.columns) and util["dead"].any()  # "combined": never picked here
    assert list(util.columns[:5]) == ["layer", "option", "label", "dead", "overloaded"]  # flags on screen
    spec = table(at, "specialisation")
    assert list(spec["token_id"]) == list(want["specialisation"]["token_id"]) and len(spec)
    compared = CMP.compare_tables(want, tables["papaformer-gumbel-v2"])
    got = table(at, "compare_utilisation_table")
    a, b = "papaformer-gumbel-v1", "papaformer-gumbel-v2"  # columns named by checkpoint (the files keep _a, _b)
    by_name = {f"{m} ({a})": f"{m}_a" for m in ("slot_share", "token_share", "first_share", "dead", "overloaded")}
    by_name |= {f"{m} ({b})": f"{m}_b" for m in ("slot_share", "token_share", "first_share", "dead", "overloaded")}
    by_name |= {f"{m} ({b} − {a})": f"{m}_diff" for m in ("slot_share", "token_share", "first_share")}
    assert set(by_name) <= set(got.columns)
    pd.testing.assert_frame_equal(got.rename(columns=by_name).reset_index(drop=True), compared["utilisation"],
                                  check_dtype=False, check_like=True)
    assert "Compared: routes by label" in [s.value for s in at.subheader]
    # downloads: every table as CSV (the one writer: the label that looks like a formula is neutralised)
    csvs = {n: d for n, d in downloads.values() if n and n.endswith(".csv")}
    # this upload's file (an earlier run of the shipped probes, cached for the process, may be offered too)
    label_csv = csvs["papaformer-gumbel-v1_probes_label_shares.csv"]
    assert b"'=HYPERLINK" in label_csv and b",=HYPERLINK" not in label_csv
    back = read_frame_csv(label_csv)
    assert set(back["label_value"]) == set(shares["label_value"])
    assert any(n.endswith("_compare_specialisation.csv") for n in csvs)
    assert any(n and n.endswith(".parquet") for n, _ in downloads.values())


@pytest.mark.parametrize("name,data,message", [
    ("bad.tsv", b"text\ttopic\nhello\tstory\textra\n", "bad.tsv: line 2 has 3 tab-separated fields, the header has 2"),
    ("bad.csv", b"words,topic\nhello,story\n", "bad.csv: no text column (a column named text or prompt)"),
    ("bad.jsonl", b'{"text": "a"}\nnot json\n', "bad.jsonl: line 2 is not JSON"),
    ("bad.txt", b"fine\n\xff\xfe\n", "bad.txt: line 2 (byte offset 5) is not UTF-8 text"),
    ("bad.parquet", b"PAR1 not really", "bad.parquet: not a readable Parquet file"),
])
def test_a_bad_upload_is_one_line_and_nothing_else_changes(name, data, message):
    at = upload(corpus_view("papaformer-gumbel-v2"), name, data)
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("Dataset refused: " + message), errors
    assert "\n" not in errors[0]
    assert not at.get("progress") and not tables_of(at)
    assert at.segmented_control(key=K.VIEW).value == "Corpus"  # the page is as it was


def test_the_row_limit_is_enforced(monkeypatch):
    monkeypatch.setattr(D, "APP_LIMITS", D.Limits(rows=3, chars=D.APP_MAX_CHARS))
    at = upload(corpus_view("papaformer-gumbel-v2"), "many.txt", b"one\ntwo\nthree\nfour\n")
    assert [e.value for e in at.error] == ["Dataset refused: many.txt: more than 3 rows; the app takes at most 3 "
                                           "(routescope corpus streams files of any size)"]


def test_checkpoints_that_cannot_be_compared_say_why():
    at = corpus_view("papaformer-gumbel-v2")
    at.selectbox(key=K.CORPUS_COMPARE).set_value(str(CK / "papaformer-share-linear")).run()
    until_done(at)
    warnings = [w.value for w in at.warning]
    assert any("Not compared with papaformer-share-linear: parallel.0 has 3 options in papaformer-gumbel-v2 and 2 in "
               "papaformer-share-linear" in w for w in warnings), warnings
    assert not any(c.endswith("_diff") for t in tables_of(at) for c in t.columns)
    assert len(table(at, "utilisation_table"))  # its own statistics are still shown


def test_a_family_without_routes_shows_its_values_and_says_so():
    at = until_done(corpus_view("pgpt"))
    assert any("has no per-token routes" in i.value for i in at.info)
    cv = table(at, "call_values_table")
    assert set(cv["kind"]) == {"weight", "contribution"}
    w = cv[(cv["kind"] == "weight") & (cv["label_value"] == S.ALL)]
    assert set(w["scope"]) == {"per call"} and (w["std"] < 1e-6).all()  # learned weights: one value per call


def test_moep_top_k_slots(tmp_path):
    at = until_done(corpus_view("moep"))
    util = table(at, "utilisation_table")
    k = 2  # the shipped moep picks 2 of 4 everywhere
    sums = util.groupby("layer")[["token_share", "slot_share", "first_share"]].sum()
    assert (abs(sums["token_share"] - k) < 1e-9).all() and (abs(sums["slot_share"] - 1) < 1e-9).all()
    assert (abs(sums["first_share"] - 1) < 1e-9).all()
    summary = table(at, "summary").set_index("metric")["value"]
    assert summary["top_k_recorded"] == str(k)
    html = next(b for b in at.get("download_button") if b.proto.label.startswith("corpus.html"))
    assert html is not None


def test_page_html_is_offline_and_holds_every_table(tmp_path):
    from routescope.rendering.corpus_report import page

    model, tok = load_checkpoint(CK / "papaformer-gumbel-v2")
    res = run_corpus(model, tok, SH.shipped("table6"), name="v2", decode=lambda i: tok.decode([i]))
    tables = res.tables(min_count=1)
    text = page(res, tables, model.option_labels())
    import json
    import re
    assert not re.search(r"<script[^>]*\bsrc\s*=", text) and text.count(plotly_js()[:300]) == 1
    doc = json.loads(re.search(r'<script type="application/json" id="corpus-data">(.*?)</script>', text, re.S)[1])
    assert set(doc["tables"]) == set(tables)
    u = tables["utilisation"]
    emb = doc["tables"]["utilisation"]
    assert emb["columns"] == list(u.columns) and len(emb["data"]) == len(u)
    for row, want in zip(emb["data"], u.itertuples(index=False)):  # floats to 6 significant digits
        for got, w in zip(row, want):
            assert got == w if not isinstance(w, float) else abs(got - w) <= 1e-5 * max(1.0, abs(w))
    for view in tables:
        assert f'<h2 id="{view}">' in text


def test_route_grid_cells_are_the_runs_choices():
    """The Routing view's HTML grid: one cell per layer and token of each choice view, coloured by
    the option the run's view selected there (white: none)."""
    import re

    from routescope.rendering.style import PALETTE

    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    grid = next(m.value for m in at.markdown if 'class="rs-grid"' in m.value)
    rows = re.findall(r'<tr><th class="rs-layer">([^<]*)</th>(.*?)</tr>', grid)
    colours = [re.findall(r'background:(#[0-9A-Fa-f]{6})', cells) for _, cells in rows]
    path = at.selectbox(key=K.CHECKPOINT).value
    model, tok = load_checkpoint(path)
    import routescope as rs
    run = rs.run(model, tok, at.text_area(key=K.PROMPT).value, max_new_tokens=at.slider(key=K.MAX_NEW).value)
    g = run.views["gumbel_routes"].frame
    layers = list(dict.fromkeys(g["layer"]))
    T = len(run.tokens)
    for i, layer in enumerate(layers):
        sel = g[(g["layer"] == layer) & g["selected"]].set_index("position")["option"]
        want = [PALETTE[int(sel[t])] if t in sel.index else "#FFFFFF" for t in range(T)]
        assert rows[i][0] == layer and colours[i] == want
    assert len(rows) == len(layers) + len(set(run.views["cosine_dominance"].frame["layer"]))


def test_a_failed_run_is_shown_until_run_again_not_started_on_every_rerun(monkeypatch):
    from routescope.app import corpus_resources as CR

    calls = []

    def fails(*args, **kwargs):
        calls.append(1)
        raise ValueError("this dataset cannot be routed")

    monkeypatch.setattr(CR, "run_corpus", fails)
    CR.jobs.clear()  # no finished run of an earlier test for these inputs (the jobs are process-wide)
    at = until_done(corpus_view("moep"))
    tried = len(calls)
    for _ in range(3):  # a rerun shows the failure; it does not start the run again
        time.sleep(0.3)
        at.run()
        assert not at.get("progress") and [e.value for e in at.error] == ["moep: this dataset cannot be routed"]
    assert len(calls) == tried >= 1
    at.button(key=K.CORPUS_AGAIN).click().run()
    until_done(at)
    assert len(calls) == tried + 1 and [e.value for e in at.error] == ["moep: this dataset cannot be routed"]
