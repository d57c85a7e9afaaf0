"""Export table I/O: exact CSV and Parquet round trips, hostile token text, streaming, atomicity."""
from __future__ import annotations

import csv

import numpy as np
import pandas as pd
import pytest

from routescope.analysis.export import columns as C
from routescope.analysis.export.csv_format import escape_text, unescape_text
from routescope.analysis.export.table_files import (ExportWriter, read_csv, read_parquet, read_table, write_csv,
                                                    write_parquet)
from routescope.analysis.export.run_table import conform, empty_table

HOSTILE = ["=cmd|' /C calc'!A0", "+1", "-x", "@a", "\ttab", "\rcr", "line\nbreak", "crlf\r\nend", 'say "hi"',
           "a,b", "😀 emoji", "nul\0byte", "שלום עולם", "\u202eevil\u202c", "'quoted", "''", "'", "\\N", "\\",
           "back\\slash\\n", "", "=", "-1.5", "\x0bvt\x0cff\x1c", "\u2028sep", "\x85nel", " =space", "plain"]


def frame(tokens: list[str | None], start: int = 0) -> pd.DataFrame:
    n = len(tokens)
    k = np.arange(start, start + n)
    return conform(pd.DataFrame({
        C.MODEL: "tiny", C.FAMILY: "papaformer", C.PROMPT_ID: [f"-p{i}" if i % 2 else f"p{i}" for i in k],
        C.POSITION: pd.array([None if i % 5 == 0 else int(i) for i in k], dtype="Int64"),
        C.TOKEN: pd.array(tokens, dtype="string"), C.TOKEN_ID: pd.array(k, dtype="Int64"),
        C.PHASE: ["prompt", "generated"] * (n // 2) + ["prompt"] * (n % 2),
        C.LAYER: "parallel.0", C.SITE: "parallel.0.router.probs", C.KIND: "prob",
        C.OPTION: pd.array([None if i % 4 == 0 else int(i % 3) for i in k], dtype="Int64"),
        C.VALUE: [-(i / 7) if i % 6 else (np.nan if i % 12 == 0 else np.inf) for i in k],
        C.SELECTED: pd.array([None if i % 3 == 0 else bool(i % 2) for i in k], dtype="boolean"),
        C.ABLATION: "drop parallel.0:1", C.SEED: 7}))


def test_escape_round_trip_for_every_hostile_string():
    for s in HOSTILE:
        e = escape_text(s)
        assert unescape_text(e) == s
        assert "\n" not in e and "\r" not in e and "\t" not in e and "\0" not in e
        assert not e.startswith(("=", "+", "-", "@", "\t", "\r")), e


def test_csv_round_trip_is_exact_with_hostile_tokens(tmp_path):
    df = frame(HOSTILE + [None])
    path = write_csv(df, tmp_path / "x.csv")
    back = read_csv(path)
    pd.testing.assert_frame_equal(back, df)
    assert back[C.TOKEN].tolist()[:len(HOSTILE)] == HOSTILE
    # as any CSV consumer sees it: one record per row, no text cell that starts a formula
    with open(path, encoding="utf-8", newline="") as f:
        records = list(csv.reader(f))
    assert len(records) == len(df) + 1
    assert records[0] == list(C.EXPORT_SCHEMA)
    text_cols = [i for i, c in enumerate(records[0]) if c in C.TEXT_COLUMNS]
    for rec in records[1:]:
        assert len(rec) == len(C.EXPORT_SCHEMA)
        for i in text_cols:
            assert not rec[i].startswith(("=", "+", "-", "@", "\t", "\r")), rec[i]
    raw = path.read_bytes()
    assert raw.count(b"\r\n") == len(df) + 1 and raw.count(b"\n") == len(df) + 1  # RFC 4180 line ends only
    assert len(raw.decode("utf-8").splitlines()) == len(df) + 1  # even str.splitlines (\x0b, \x85, \u2028 ...)
    assert "\x00" not in raw.decode("utf-8")


def test_numbers_are_numbers_not_neutralised_text(tmp_path):
    df = frame(["a", "b", "c"], start=1)
    path = write_csv(df, tmp_path / "n.csv")
    rec = list(csv.reader(open(path, encoding="utf-8", newline="")))[1]
    value = rec[list(C.EXPORT_SCHEMA).index(C.VALUE)]
    assert value.startswith("-") and float(value) == df[C.VALUE][0]  # negative number, as a number
    assert read_csv(path)[C.VALUE].dtype == "float64"


def test_parquet_round_trip(tmp_path):
    df = frame(HOSTILE + [None])
    pd.testing.assert_frame_equal(read_parquet(write_parquet(df, tmp_path / "x.parquet")), df)
    pd.testing.assert_frame_equal(read_table(tmp_path / "x.parquet"), df)


def test_empty_table_round_trips(tmp_path):
    e = empty_table()
    pd.testing.assert_frame_equal(read_csv(write_csv(e, tmp_path / "e.csv")), e)
    pd.testing.assert_frame_equal(read_parquet(write_parquet(e, tmp_path / "e.parquet")), e)


def test_streaming_writer_appends_batches_to_both_formats(tmp_path):
    batches = [frame(HOSTILE[i:i + 5], start=i) for i in range(0, len(HOSTILE), 5)]
    with ExportWriter(tmp_path / "s.csv", tmp_path / "s.parquet") as w:
        for b in batches:
            w.write(b)
            assert not (tmp_path / "s.csv").exists()  # only renamed into place at the end
    want = pd.concat(batches, ignore_index=True)
    assert w.n_rows == len(want)
    pd.testing.assert_frame_equal(read_csv(tmp_path / "s.csv"), want)
    pd.testing.assert_frame_equal(read_parquet(tmp_path / "s.parquet"), want)
    import pyarrow.parquet as pq
    assert pq.ParquetFile(tmp_path / "s.parquet").num_row_groups == len(batches)


def test_failed_export_leaves_nothing_and_keeps_an_old_file(tmp_path):
    (tmp_path / "old.csv").write_text("previous export\n")
    with pytest.raises(RuntimeError):
        with ExportWriter(tmp_path / "old.csv", tmp_path / "new.parquet") as w:
            w.write(frame(["a"]))
            raise RuntimeError("model crashed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.csv"]
    assert (tmp_path / "old.csv").read_text() == "previous export\n"


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown export format"):
        ExportWriter(tmp_path / "x.xlsx")
    with pytest.raises(ValueError, match="missing column"):
        conform(pd.DataFrame({"model": ["m"]}))
    (tmp_path / "foreign.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a RouteScope export"):
        read_csv(tmp_path / "foreign.csv")
    assert list(tmp_path.iterdir()) == [tmp_path / "foreign.csv"]
