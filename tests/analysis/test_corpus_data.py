"""Datasets of the corpus view (analysis.inputs.datasets, analysis.corpus.shipped): every format read to the same rows, label
columns found or named, limits enforced, a digest that follows the content, and one line naming the
file and row for each refusal."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus import shipped as SH

ROWS = [("r1", "Once upon a time, there was a girl.", "story", "1"),
        ("r2", 'She said, "hello, world"\nand left.', "story", "1"),
        ("r3", "Solve for x: 3x + 5 = 20.", "math", "2")]


def _files(tmp_path):
    df = pd.DataFrame(ROWS, columns=["prompt_id", "text", "domain", "expected_path"])
    (tmp_path / "d.csv").write_text(df.to_csv(index=False), encoding="utf-8")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(dict(zip(df.columns, r))) + "\n" for r in ROWS),
                                      encoding="utf-8")
    df.to_parquet(tmp_path / "d.parquet")
    # a TSV record holds no newline or tab, and is not quoted
    (tmp_path / "d.tsv").write_text("\t".join(df.columns) + "\n" + "".join(
        "\t".join([i, t.replace("\n", " "), d, e]) + "\n" for i, t, d, e in ROWS), encoding="utf-8")
    return df


def test_every_format_gives_the_same_rows_and_labels(tmp_path):
    df = _files(tmp_path)
    for suffix in ("csv", "jsonl", "parquet", "tsv"):
        data = D.load_corpus(tmp_path / f"d.{suffix}")
        rows = list(data)
        assert data.label_columns == ("domain", "expected_path") and data.n_rows == 3
        assert [r.row_id for r in rows] == list(df["prompt_id"])
        want = list(df["text"]) if suffix != "tsv" else [t.replace("\n", " ") for t in df["text"]]
        assert [r.text for r in rows] == want, suffix
        assert [r.labels for r in rows] == [(d, e) for _, _, d, e in ROWS]
        assert data.n_chars == sum(map(len, want))
        assert list(data) == rows  # read again, the same


def test_txt_rows_and_bytes_uploads():
    data = D.load_corpus(b"first prompt\n\n  \nsecond\r\n", "u.txt")
    assert [(r.row_id, r.text, r.labels) for r in data] == [("1", "first prompt", ()), ("4", "second", ())]
    assert data.name == "u.txt" and data.label_columns == ()
    with pytest.raises(ValueError, match="need the file name"):
        D.load_corpus(b"x")


def test_label_columns_found_named_and_capped():
    wide = "text\tid_like\tlabel\n" + "".join(f"t{i}\tv{i}\t{'ab'[i % 2]}\n" for i in range(D.MAX_LABEL_VALUES + 1))
    data = D.load_corpus(wide.encode(), "w.tsv")
    assert data.label_columns == ("label",)
    assert data.notes == (f"column id_like has more than {D.MAX_LABEL_VALUES} distinct values: not used as a label",)
    assert D.load_corpus(wide.encode(), "w.tsv", label_columns=["label"]).label_columns == ("label",)
    with pytest.raises(ValueError, match="id_like have more than"):
        D.load_corpus(wide.encode(), "w.tsv", label_columns=["id_like"])
    data = D.load_corpus(b"prompt\tt\n a \t\n", "m.tsv")
    assert [r.labels for r in data] == [(D.MISSING,)]
    data = D.load_corpus(b"text\tprompt\nA\tB\n", "both.tsv", text_column="prompt")
    assert [r.text for r in data] == ["B"] and data.label_columns == ("text",)


def test_limits_and_digest():
    many = b"".join(b"row %d\n" % i for i in range(5))
    with pytest.raises(ValueError, match="more than 4 rows; the app takes at most 4"):
        D.load_corpus(many, "m.txt", limits=D.Limits(rows=4))
    with pytest.raises(ValueError, match=r"more than 20 characters of text \(by line 5\)"):
        D.load_corpus(many, "m.txt", limits=D.Limits(chars=20))
    a = D.load_corpus(many, "m.txt").digest
    assert a == D.load_corpus(many, "other.txt").digest  # the content, not the name
    assert a != D.load_corpus(many + b"x\n", "m.txt").digest
    tsv = b"text\ta\tb\nx\t1\t2\n"
    assert D.load_corpus(tsv, "t.tsv").digest != D.load_corpus(tsv, "t.tsv", label_columns=["a"]).digest


@pytest.mark.parametrize("name,data,message", [
    ("a.xlsx", b"x", "a.xlsx: unknown dataset format '.xlsx'"),
    ("a.tsv", b"", "a.tsv: empty file"),
    ("a.tsv", b"text\n", "a.tsv: no rows"),
    ("a.tsv", b"text\tl\nx\n", "a.tsv: line 2 has 1 tab-separated fields, the header has 2"),
    ("a.tsv", b"text\tl\n \tx\n", "a.tsv: line 2: empty text"),
    ("a.csv", b'text,l\n"unclosed,x\n', "a.csv: line"),
    ("a.csv", b"text,l\nx,y,z\n", "a.csv: line 2 has 3 fields, the header has 2"),
    ("a.jsonl", b'{"text": "a"}\n[1, 2]\n', "a.jsonl: line 2 is a JSON list, not an object"),
    ("a.jsonl", b'{"text": 3}\n', "a.jsonl: line 1: text is not text (int)"),
    ("a.jsonl", b'{"prompt": "a"}\n{"other": 1}\n', "a.jsonl: line 2: empty text"),
    ("a.txt", b"ok\n\xc3\x28\n", "a.txt: line 2 (byte offset 3) is not UTF-8 text"),
    ("a.parquet", b"not parquet at all", "a.parquet: not a readable Parquet file"),
])
def test_refusals_name_the_file_and_row(name, data, message):
    with pytest.raises(ValueError) as e:
        D.load_corpus(data, name)
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_paths_that_are_no_files(tmp_path):
    import os
    with pytest.raises(ValueError, match="no such dataset file"):
        D.load_corpus(tmp_path / "none.tsv")
    os.mkfifo(tmp_path / "p.tsv")
    with pytest.raises(ValueError, match="is a named pipe"):  # refused without waiting for a writer
        D.load_corpus(tmp_path / "p.tsv")


def test_shipped_datasets():
    t6 = SH.shipped("table6")
    assert t6.n_rows == 20 and t6.label_columns == ("domain", "expected_path")
    assert {r.labels[0] for r in t6} == {"story", "math"}
    val = SH.shipped("validation-math")
    assert val.label_columns == ("domain",) and {r.labels for r in val} == {("math",)}
    assert SH.shipped("validation").n_rows == 2 * SH.VALIDATION_DOCS
    with pytest.raises(ValueError, match="no shipped dataset 'x'"):
        SH.shipped("x")
