"""Property-based fuzz of the corpus path (issue 29, item 6), with Hypothesis: datasets in every
format (.txt, .tsv, .csv, .jsonl, .parquet) with hostile strings (markup, quotes, control and
line-separator characters, lone surrogates, formula prefixes), hostile sizes and structures
(duplicate or missing columns, ragged rows, non-objects, cut-off files, stray bytes). The contract:

- `load_corpus` returns rows or raises a ValueError of one line, nothing else;
- `routescope corpus` exits 0 with tables that read back, a page that holds no data string
  unescaped and ids it generated, or exits 2 with one line; never a traceback, never a terminal
  control character, never a leftover file (an output set is all there or not there);
- `encode_head` gives exactly the first n tokens of the whole text.

Bounded for CI: derandomized, no example database, a fixed number of examples (about 20 s here).
The model is loaded once and shared (read-only), as the app shares it between sessions."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus.run import encode_head
from routescope.cli import corpus as corpus_cli
from routescope.cli.main import main
from routescope.core_models.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
CK = ROOT / "checkpoints" / "papaformer-gumbel-v2"
FUZZ = settings(derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))

PIECES = ["<", ">", "&", '"', "'", "\n", "\r", "\t", ",", "=", "+", "-", "@", " ", "\u2028", "\u2029", "\x00",
          "\x1b", "\x07", "é", "漢", "🙂", "</script>", "<!--", "<script>", "\\", "{", "}", "text", "prompt", "id",
          "expected_path", "<|endoftext|>", "a", "b", "0", "1", "9"]
SURROGATES = ["\ud800", "\udcff"]  # not text: refused wherever they come from (rarer, so most datasets get read)
hostile = st.lists(st.sampled_from(PIECES * 8 + SURROGATES), max_size=12).map("".join)
words = st.lists(st.sampled_from(["Once", " upon", " a", " time", " 3x", " +", " 5", " =", " 20", "."]),
                 min_size=1, max_size=12).map("".join)
cells = st.one_of(words, hostile, st.integers(-10**30, 10**30).map(str))


@st.composite
def datasets(draw) -> tuple[str, bytes]:
    """(file name, bytes) of a dataset, hostile in its names, cells, structure or bytes."""
    fmt = draw(st.sampled_from(["txt", "tsv", "csv", "jsonl", "parquet"]))
    n_rows = draw(st.integers(0, 6))
    columns = ["text", *draw(st.lists(st.one_of(hostile, st.sampled_from(["domain", "expected_path", "id"])),
                                      max_size=3))]
    if draw(st.booleans()):
        columns = draw(st.permutations(columns))
    if draw(st.integers(0, 5)) == 0:
        columns = [c for c in columns if c != "text"]  # no text column
    texts = st.one_of(words, words, words, words, hostile)  # mostly text a model can read
    rows = [[draw(texts if c == "text" else cells) for c in columns] for _ in range(n_rows)]
    if fmt == "txt":
        data = "".join(r[0] + "\n" for r in rows if r).encode("utf-8", "surrogatepass")
    elif fmt == "tsv":
        data = "".join("\t".join(r) + "\n" for r in [columns, *rows]).encode("utf-8", "surrogatepass")
    elif fmt == "csv":
        buf = io.StringIO()
        csv.writer(buf).writerows([columns, *rows])
        data = buf.getvalue().encode("utf-8", "surrogatepass")
    elif fmt == "jsonl":
        lines = [json.dumps(dict(zip(columns, r))) if draw(st.integers(0, 9)) else draw(
            st.sampled_from(["[1]", "7", '"x"', "{", '{"text": 1}', "[" * 50 + "]" * 50])) for r in rows]
        data = "".join(line + "\n" for line in lines).encode()
    else:
        clean = [[c.encode("utf-8", "replace").decode() for c in r] for r in rows]
        arrays = [pa.array([r[i] for r in clean], pa.string()) for i in range(len(columns))]
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_arrays(arrays, names=[c.encode("utf-8", "replace").decode() for c in columns]),
                       sink)
        data = sink.getvalue().to_pybytes()
    damage = draw(st.integers(0, 11))
    if damage == 0 and data:
        data = data[:draw(st.integers(0, len(data) - 1))]  # cut off
    elif damage == 1:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=6)) + data[at:]  # stray bytes
    return f"d.{fmt}", data


@settings(FUZZ, max_examples=150)
@given(datasets())
def test_load_corpus_returns_rows_or_one_line(dataset):
    name, data = dataset
    try:
        corpus = D.load_corpus(data, name)
        rows = list(corpus)
    except ValueError as e:
        assert "\n" not in str(e) and str(e).startswith(name), str(e)
        event(f"{name} refused")
        return
    event(f"{name} read")
    assert len(rows) == corpus.n_rows > 0
    assert all(r.text.strip() and len(r.labels) == len(corpus.label_columns) for r in rows)
    for r in rows:
        r.text.encode("utf-8")  # no lone surrogate reaches the model
        "".join(r.labels).encode("utf-8")


@pytest.fixture(scope="module")
def shared_model():
    return load_checkpoint(CK)


SET_ID = re.compile(r"fig-\d+|corpus-data|[a-z_]+")


@settings(FUZZ, max_examples=40)
@given(datasets())
def test_the_corpus_command_keeps_its_contract(shared_model, monkeypatch_module, dataset):
    name, data = dataset
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / name).write_bytes(data)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["corpus", str(CK), "--data", str(d / name), "--out", str(d / "out"), "--quiet",
                         "--max-tokens", "8", "--min-count", "1", "--batch-size", "4"])
        err = err.getvalue()
        event(f"{name} exit {code}")
        assert "Traceback" not in err and not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", err), repr(err)
        assert code in (0, 2), err
        if code == 2:
            assert err.count("\n") == 1 and err.startswith("routescope corpus: "), err
            assert sorted(p.name for p in d.iterdir()) == [name]  # nothing written, nothing left
            return
        assert err.count("\n") == 1 and err.startswith("wrote "), err
        assert sorted(p.name for p in d.iterdir()) == [name, "out"]
        out = d / "out"
        doc = json.loads((out / "corpus.json").read_text(encoding="utf-8"))
        assert sorted(p.name for p in out.iterdir()) == sorted(
            [*(f"{t}.{f}" for t in doc["tables"] for f in doc["formats"]), "corpus.html", "corpus.json"])
        for t in doc["tables"]:
            pd.read_csv(out / f"{t}.csv")
            pd.read_parquet(out / f"{t}.parquet")
        page = (out / "corpus.html").read_text(encoding="utf-8")
        for script in re.findall(r"<script[^>]*>(.*?)</script>", page, re.S):
            assert "<!--" not in script and "\u2028" not in script and "\u2029" not in script
        markup = re.sub(r"(<script[^>]*>).*?</script>", r"\1", page, flags=re.S)  # the elements, not plotly.js
        assert all(SET_ID.fullmatch(i) for i in re.findall(r'\bid="([^"]*)"', markup))
        strings = set(D.load_corpus(d / name).label_columns)
        strings |= {v for r in D.load_corpus(d / name) for v in r.labels}
        for s in strings:
            if "<" in s or ">" in s:
                assert s not in page, s


@pytest.fixture(scope="module")
def monkeypatch_module(shared_model):
    """`routescope corpus` given the shared model instead of loading the checkpoint per example."""
    mp = pytest.MonkeyPatch()
    mp.setattr(corpus_cli, "load_with_tokenizer", lambda path, **placement: shared_model)
    yield mp
    mp.undo()


@settings(FUZZ, max_examples=300)
@given(st.lists(st.sampled_from(PIECES[:-4] + ["hello", " world", "  ", "\n\n", "'s", "123", "é"]), max_size=300)
       .map("".join), st.integers(1, 40))
def test_encode_head_is_the_head_of_the_whole_encoding(shared_model, text, n):
    tok = shared_model[1]
    text = text.encode("utf-8", "replace").decode()
    assert encode_head(tok, text, n) == tok.encode(text).ids[:n]
