"""Hostile text in every CSV the project writes: the app's downloads, the Table 6 export, the CLI.

Each CSV is parsed back with Python's csv module (as a spreadsheet would see it) and must have one
record per row with the header's field count, no text cell that starts a formula (=, +, -, @, tab,
CR), and the documented readers (`analysis.export.table_files.read_csv`, `csv_format.read_frame_csv`) must give the
original text back. Good text is written as it is.
"""
from __future__ import annotations

import csv
import io
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest
from tokenizers import Tokenizer

from routescope.analysis.export import columns as C
from routescope.analysis.export.csv_format import csv_kind, csv_kinds, frame_csv_bytes, read_frame_csv
from routescope.analysis.export.table_files import read_csv

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app" / "main.py")
CHECKPOINTS = ROOT / "checkpoints"
TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
HOSTILE = ["=cmd|' /C calc'!A0", "+1+1", "-2+3+cmd|' /C calc'!A0", "@SUM(A1:A9)", "\t=1+1", "\r=1+1",
           'he said "hi", then\nleft', "line 1\r\nline 2", "'=quoted", '=HYPERLINK("http://x","y")', "\\N", ""]
GOOD = ["Once upon a time", "girl", " a, b", 'say "hi"', "3x + 5 = 20", "100%"]
PROMPTS = ["=cmd|' /C calc'!A0", "+1\r\n-2\t@x \"q\", =y\nlast line"]


def records(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))


def assert_safe(data: bytes, n_rows: int, kinds: dict[str, str]) -> list[list[str]]:
    """One CRLF record per row plus the header, every record as wide as the header, and a cell
    that starts with a formula trigger only in a numeric column, as a number."""
    recs = records(data)
    assert len(recs) == n_rows + 1, (len(recs), n_rows)
    assert data.count(b"\n") == data.count(b"\r\n") == n_rows + 1  # no raw line break inside a record
    assert [r for r in recs if len(r) != len(recs[0])] == []
    assert recs[0] == list(kinds)
    for rec in recs[1:]:
        for (col, kind), cell in zip(kinds.items(), rec):
            if cell.startswith(TRIGGERS):
                assert kind in ("int", "float"), f"{col}: {cell!r} starts a formula"
                float(cell)  # a number, not text
    return recs


# --- the writer itself, every string-like dtype ------------------------------------------------

@pytest.mark.parametrize("dtype", [None, "object", "str", "string", "category"])
def test_report_csv_neutralises_every_string_dtype(dtype):
    """None: the dtype pandas infers for a list of str (pandas 3: `str`), the case that was missed."""
    texts = HOSTILE + GOOD
    df = pd.DataFrame({"text": pd.Series(texts, dtype=dtype), "rank": range(len(texts)),
                       "prob": [-0.5 + k / 7 for k in range(len(texts))], "flag": [k % 2 == 0 for k in range(len(texts))]})
    kinds = csv_kinds(df)
    assert kinds == {"text": "text", "rank": "int", "prob": "float", "flag": "bool"}
    data = frame_csv_bytes(df)
    recs = assert_safe(data, len(df), kinds)
    back = read_frame_csv(data, kinds)
    assert back["text"].tolist() == texts
    assert back["prob"].tolist() == df["prob"].tolist() and back["rank"].tolist() == df["rank"].tolist()
    assert back["flag"].tolist() == df["flag"].tolist()
    assert [r[0] for r in recs[1 + len(HOSTILE):]] == GOOD  # good text is written unchanged
    assert float(recs[1][2]) == -0.5  # a negative number stays a number


def test_missing_text_and_odd_dtypes():
    df = pd.DataFrame({"s": pd.array(["=a", None], dtype="string"), "o": ["@b", None],
                       "c": pd.Categorical(["-c", None]), "n": pd.array([1, None], dtype="Int64")})
    data = frame_csv_bytes(df)
    assert_safe(data, 2, csv_kinds(df))
    back = read_frame_csv(data, csv_kinds(df))
    assert back["s"].tolist()[0] == "=a" and back["o"].tolist()[0] == "@b" and back["c"].tolist()[0] == "-c"
    assert back.iloc[1].isna().all()
    assert csv_kind(pd.CategoricalDtype([1, 2])) == "int"  # a categorical follows its categories


def test_cells_encoded_once_per_distinct_value_equal_cells_encoded_one_by_one():
    """The writer encodes each distinct value of a one-type column once (`tables._encoded`): its rows
    must be those of encoding every cell by itself, for repeated and missing values of every dtype."""
    from routescope.analysis.export import csv_format as T

    n = 40
    texts = [HOSTILE[k % 5] if k % 7 else None for k in range(n)]
    df = pd.DataFrame({
        "str": pd.Series(texts, dtype="str"), "string": pd.array(texts, dtype="string"),
        "category": pd.Categorical(texts), "object": [t if k % 3 else k % 2 == 0 for k, t in enumerate(texts)],
        "int": [k % 4 for k in range(n)], "Int64": pd.array([k % 3 if k % 5 else None for k in range(n)], dtype="Int64"),
        "bool": [k % 3 == 0 for k in range(n)], "boolean": pd.array([k % 2 == 0 if k % 6 else None for k in range(n)],
                                                                 dtype="boolean"),
        "int_category": pd.Categorical([k % 3 for k in range(n)]), "float": [k / 3 if k % 4 else None for k in range(n)]})
    for column, kind in csv_kinds(df).items():
        enc = T._ENCODE[kind]
        assert T._encoded(df[column], kind, enc) == [enc(v) for v in df[column].astype(object).tolist()], column


# --- the app's downloads ---------------------------------------------------------------------

@pytest.fixture
def downloads(monkeypatch):
    """Every file the app offers for download, by media id: (file name, bytes)."""
    files: dict[str, tuple[str, bytes]] = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def record(self, data, mimetype, kind, filename=None):
        fid = original(self, data, mimetype, kind, filename)
        files[fid] = (filename, data if isinstance(data, bytes) else Path(data).read_bytes())
        return fid

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", record)
    return files


def offered_csvs(at: AppTest, files: dict) -> dict[str, bytes]:
    """label -> bytes of every CSV download button on the page."""
    out = {}
    for b in at.get("download_button"):
        if b.proto.url:
            name, data = files[b.proto.url.rsplit("/", 1)[-1].split(".")[0]]
            if name.endswith(".csv"):
                out[b.proto.label] = data
    return out


def app_at(name: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    box = at.selectbox(key="checkpoint")
    box.set_value(next(p for p in box.options if Path(p).name == name)).run()
    return at


def view(at: AppTest, name: str) -> AppTest:
    at.segmented_control(key="view").set_value(name).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("prompt", PROMPTS + ["Once upon a time, there was a little"])
def test_app_routing_and_generation_csv(prompt, downloads):
    tok = Tokenizer.from_file(str(CHECKPOINTS / "tokenizer.json"))
    at = app_at("pgpt")
    at.text_area(key="prompt").set_value(prompt)
    at.button(key="generate").click().run()  # the prompt box is a form
    csvs = offered_csvs(view(at, "Export"), downloads)
    assert set(csvs) == {"Routing table (CSV)", "Generation with top-k (CSV)"}

    routing = csvs["Routing table (CSV)"]
    assert_safe(routing, len(records(routing)) - 1, {c: csv_kind(t) for c, t in C.EXPORT_SCHEMA.items()})

    gen = csvs["Generation with top-k (CSV)"]
    frame = read_frame_csv(gen)
    numeric = {"step": "int", "position": "int", "chosen_prob": "float", "rank": "int", "candidate_id": "int",
               "prob": "float"}
    assert_safe(gen, len(frame), {c: numeric.get(c, "text") for c in frame.columns})
    assert set(frame["prompt"]) == {prompt}  # the documented reader gives the prompt back exactly
    assert frame["candidate"].tolist() == [tok.decode([int(i)]) for i in frame["candidate_id"]]


def test_app_routing_csv_reads_back_the_prompt_tokens(downloads, tmp_path):
    tok = Tokenizer.from_file(str(CHECKPOINTS / "tokenizer.json"))
    prompt = PROMPTS[1]
    at = app_at("pgpt")
    at.text_area(key="prompt").set_value(prompt)
    at.button(key="generate").click().run()  # the prompt box is a form
    path = tmp_path / "routing.csv"
    path.write_bytes(offered_csvs(view(at, "Export"), downloads)["Routing table (CSV)"])
    table = read_csv(path)
    ids = tok.encode(prompt).ids
    rows = table[table[C.PHASE] == "prompt"].drop_duplicates(C.POSITION).sort_values(C.POSITION)
    assert rows[C.TOKEN_ID].tolist() == ids
    assert "".join(rows[C.TOKEN]) == prompt


def test_app_table6_csvs_with_a_hostile_probe_file(downloads):
    probes = [("=1+1", "@story", "1", "=cmd|' /C calc'!A0"), ("+P2", "-math", "2", "-2+3+cmd|' /C calc'!A0"),
              ("P3", "story", "1", 'she said "hi", then left'), ("P4", "math", "2", "Solve for x: 3x + 5 = 20.")]
    tsv = "prompt_id\tdomain\texpected_path\tprompt\n" + "".join("\t".join(p) + "\n" for p in probes)
    at = view(app_at("papaformer-gumbel-v1"), "Table 6")
    at.file_uploader(key="probes_upload").set_value(("hostile.tsv", tsv.encode(), "text/tab-separated-values")).run()
    assert not at.error, [e.value for e in at.error]
    csvs = offered_csvs(view(at, "Export"), downloads)
    assert {"Table 6 report (CSV)", "Table 6 summary (CSV)"} <= set(csvs)

    report = csvs["Table 6 report (CSV)"]
    back = read_frame_csv(report)
    assert_safe(report, len(probes), {c: "text" if c != C.EXPECTED_PATH else "int" for c in back.columns})
    for col, k in ((C.PROMPT_ID, 0), (C.DOMAIN, 1), (C.PROMPT, 3)):
        assert back[col].tolist() == [p[k] for p in probes]
    assert back[C.EXPECTED_PATH].astype(int).tolist() == [int(p[2]) for p in probes]

    summary = csvs["Table 6 summary (CSV)"]
    back = read_frame_csv(summary)
    assert_safe(summary, len(back), {c: "float" if c == C.VALUE else "text" for c in back.columns})
    assert set(back["model"]) == {"papaformer-gumbel-v1"}


def test_dataframe_csv_export_is_off():
    """st.dataframe's own "Download as CSV" writes cells as they are (no neutralising), so the app
    turns it off: every CSV it offers comes from `analysis.export.csv_format`."""
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert config["client"]["disableDataExport"] is True


# --- the command line --------------------------------------------------------------------------

def _export(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "routescope.cli", "--threads", "1", "export",
                           str(CHECKPOINTS / "papaformer-gumbel-v1"), *args, "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_cli_export_csv_with_hostile_prompts_and_ids(tmp_path):
    tok = Tokenizer.from_file(str(CHECKPOINTS / "tokenizer.json"))
    ids = ["=1+1", "@id", "-3", "P4"]
    texts = ["=cmd|' /C calc'!A0", "+1 @x \"q\", =y", "-2+3+cmd|' /C calc'!A0", "Once upon a time"]
    (tmp_path / "p.tsv").write_text("prompt_id\tprompt\n" + "".join(f"{i}\t{t}\n" for i, t in zip(ids, texts)),
                                    encoding="utf-8")
    out = tmp_path / "tsv.csv"
    r = _export(tmp_path, "--prompts", str(tmp_path / "p.tsv"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    prompts = dict(zip(ids, texts))

    # newlines and CRLF only fit on the command line
    out2 = tmp_path / "argv.csv"
    r = _export(tmp_path, "--prompt", PROMPTS[1], "--prompt", "line 1\r\nline 2", "--out", str(out2))
    assert r.returncode == 0, r.stderr
    prompts2 = {"1": PROMPTS[1], "2": "line 1\r\nline 2"}

    schema = {c: csv_kind(t) for c, t in C.EXPORT_SCHEMA.items()}
    for path, want in ((out, prompts), (out2, prompts2)):
        data = path.read_bytes()
        assert_safe(data, len(records(data)) - 1, schema)
        table = read_csv(path)
        assert list(dict.fromkeys(table[C.PROMPT_ID])) == list(want)
        for pid, text in want.items():
            rows = table[(table[C.PROMPT_ID] == pid) & table[C.POSITION].notna()].drop_duplicates(C.POSITION)
            assert rows[C.TOKEN_ID].tolist() == tok.encode(text).ids
            assert "".join(rows.sort_values(C.POSITION)[C.TOKEN]) == text
    pid, token = list(C.EXPORT_SCHEMA).index(C.PROMPT_ID), list(C.EXPORT_SCHEMA).index(C.TOKEN)
    good = {r[token] for r in records(out.read_bytes())[1:] if r[pid] == "P4" and r[token] != "\\N"}
    assert good == {tok.decode([i]) for i in tok.encode("Once upon a time").ids}  # good text as it is
