"""Reading and writing the export table (schema: `analysis.columns.EXPORT_SCHEMA`, kinds:
`analysis.columns.KINDS`) as CSV or Parquet, whole or streamed batch by batch.

CSV format (UTF-8, RFC 4180: comma separated, CRLF line ends, fields with commas or double quotes
quoted with doubled quotes, `csv.QUOTE_MINIMAL`). Text columns are encoded so every record stays
on one line and no spreadsheet evaluates a cell:

1. Escapes: backslash -> `\\\\`, newline -> `\\n`, carriage return -> `\\r`, tab -> `\\t`, NUL ->
   `\\0`; other control characters (C0, DEL, C1) and the Unicode line/paragraph separators and
   bidirectional overrides (U+2028/2029, U+202A-202E, U+2066-2069) -> `\\uXXXX`.
2. Missing text (NA) is the cell `\\N`; an empty string is an empty cell. (`\\N` cannot come from
   step 1, which doubles every backslash.)
3. Formula neutralising: a text cell that, after step 1, begins with `=`, `+`, `-`, `@`, a tab,
   a carriage return or a single quote gets one single quote prefixed. Because a cell that starts
   with a quote is always prefixed too, reading strips exactly one leading quote from every cell
   that has one, and the round trip is exact (a token that really begins with `'` is written `''`).

Numeric and boolean columns are written as plain numbers (`repr` of floats, so they round-trip
exactly) and `true`/`false`; they are never neutralised (a negative number is a number, not
text). Missing numbers and booleans are empty cells. Reading restores the schema's dtypes, so
`read_csv(write_csv(df))` equals `df` (pandas.testing.assert_frame_equal, dtypes included).

`ExportWriter` appends batches to a CSV and/or a Parquet file (`pyarrow.parquet.ParquetWriter`)
so memory stays flat; it writes to a temporary file beside the target and renames it into place
only when closed without error, so a failed export leaves no half-written file.
"""
from __future__ import annotations

import csv
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from . import columns as C
from .table import conform, empty_table

FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")
NA_TEXT = "\\N"
_SHORT = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
_UNSHORT = {v[1]: k for k, v in _SHORT.items()}
_NEEDS_ESCAPE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPED = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)

CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")


# --- cell encoding -----------------------------------------------------------------------------

def escape_text(s: str) -> str:
    """Steps 1 and 3 of the module doc: escapes, then formula neutralising."""
    s = _NEEDS_ESCAPE.sub(lambda m: _SHORT.get(m[0], f"\\u{ord(m[0]):04x}"), s)
    return "'" + s if s.startswith(FORMULA_START) else s


def unescape_text(cell: str) -> str:
    """Inverse of `escape_text`; ValueError on an escape it never writes."""
    if cell.startswith("'"):
        cell = cell[1:]

    def one(m: re.Match) -> str:
        e = m[1]
        if e in _UNSHORT:
            return _UNSHORT[e]
        if len(e) == 5:
            return chr(int(e[1:], 16))
        raise ValueError(f"unknown escape \\{e} in CSV cell {cell!r}")

    return _ESCAPED.sub(one, cell)


def _encoder(dtype: str):
    if dtype == "string":
        return lambda v: NA_TEXT if v is pd.NA or v is None else escape_text(v)
    if dtype == "boolean":
        return lambda v: "" if v is pd.NA or v is None else ("true" if v else "false")
    if dtype in ("Int64", "int64"):
        return lambda v: "" if v is pd.NA or v is None else str(int(v))
    if dtype == "float64":
        return lambda v: "" if v is None or v is pd.NA or math.isnan(v) else repr(float(v))
    raise ValueError(f"no CSV encoding for dtype {dtype!r}")


def _decoder(dtype: str):
    if dtype == "string":
        return lambda s: pd.NA if s == NA_TEXT else unescape_text(s)
    if dtype == "boolean":
        return lambda s: pd.NA if s == "" else {"true": True, "false": False}[s]
    if dtype in ("Int64", "int64"):
        return lambda s: pd.NA if s == "" else int(s)
    if dtype == "float64":
        return lambda s: math.nan if s == "" else float(s)
    raise ValueError(f"no CSV decoding for dtype {dtype!r}")


def _csv_rows(df: pd.DataFrame, schema: dict[str, str]) -> Iterator[list[str]]:
    cols = [[enc(v) for v in df[c].astype(object).tolist()] for c, enc in
            ((c, _encoder(t)) for c, t in schema.items())]
    return (list(r) for r in zip(*cols))


# --- streaming writer ------------------------------------------------------------------------

def arrow_schema() -> pa.Schema:
    """The Parquet schema of the export table (with pandas metadata for the nullable dtypes)."""
    return pa.Table.from_pandas(empty_table(), preserve_index=False).schema


class _CsvSink:
    def __init__(self, path: Path, schema: dict[str, str]) -> None:
        self.schema = schema
        self.f = open(path, "w", encoding="utf-8", newline="")
        self.w = csv.writer(self.f, quoting=csv.QUOTE_MINIMAL, lineterminator="\r\n")
        self.w.writerow(list(schema))

    def write(self, df: pd.DataFrame) -> None:
        self.w.writerows(_csv_rows(df, self.schema))

    def close(self) -> None:
        self.f.close()


class _ParquetSink:
    def __init__(self, path: Path, schema: dict[str, str]) -> None:
        self.schema = arrow_schema()
        self.w = pq.ParquetWriter(str(path), self.schema)

    def write(self, df: pd.DataFrame) -> None:
        if len(df):
            self.w.write_table(pa.Table.from_pandas(df, schema=self.schema, preserve_index=False))

    def close(self) -> None:
        self.w.close()


def export_format(path: str | os.PathLike) -> str:
    """"csv" or "parquet" from the file suffix; ValueError otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix in CSV_SUFFIXES:
        return "csv"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise ValueError(f"{path}: unknown export format {suffix or '(no suffix)'!r}; use .csv or .parquet")


class ExportWriter:
    """Append export batches to one or more files (.csv and/or .parquet), memory flat.

    Use as a context manager: on a clean exit the temporary files are renamed onto the targets; on
    an exception (or `abort()`) they are deleted and the targets are left as they were.

        with ExportWriter("out.csv", "out.parquet") as w:
            for df in batches:
                w.write(df)
    """

    def __init__(self, *paths: str | os.PathLike) -> None:
        if not paths:
            raise ValueError("ExportWriter needs at least one output path")
        self.schema = C.EXPORT_SCHEMA
        self.n_rows = 0
        self._sinks: list[tuple[Any, Path, Path]] = []
        try:
            for p in paths:
                p = Path(p)
                fmt = export_format(p)
                p.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
                os.close(fd)
                tmp = Path(tmp)
                try:
                    sink = (_CsvSink if fmt == "csv" else _ParquetSink)(tmp, self.schema)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
                self._sinks.append((sink, tmp, p))
        except BaseException:
            self.abort()
            raise
        self._open = True

    def write(self, df: pd.DataFrame) -> None:
        if not self._open:
            raise ValueError("ExportWriter is closed")
        df = conform(df)
        for sink, _, _ in self._sinks:
            sink.write(df)
        self.n_rows += len(df)

    def close(self) -> None:
        """Finish every file and move it into place."""
        if not self._open:
            return
        self._open = False
        try:
            for sink, _, _ in self._sinks:
                sink.close()
            for _, tmp, final in self._sinks:
                os.replace(tmp, final)
        except BaseException:
            self._cleanup()
            raise

    def abort(self) -> None:
        """Drop everything written; the targets are untouched."""
        self._open = False
        for sink, _, _ in self._sinks:
            try:
                sink.close()
            except Exception:  # closing a broken sink must not hide the original error
                pass
        self._cleanup()

    def _cleanup(self) -> None:
        for _, tmp, _ in self._sinks:
            tmp.unlink(missing_ok=True)

    def __enter__(self) -> "ExportWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# --- whole tables ------------------------------------------------------------------------------

def write_table(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write the whole table to .csv or .parquet (by suffix), atomically."""
    with ExportWriter(path) as w:
        w.write(df)
    return Path(path)


def write_csv(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    if export_format(path) != "csv":
        raise ValueError(f"{path}: write_csv needs a .csv path")
    return write_table(df, path)


def write_parquet(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    if export_format(path) != "parquet":
        raise ValueError(f"{path}: write_parquet needs a .parquet path")
    return write_table(df, path)


def read_csv(path: str | os.PathLike) -> pd.DataFrame:
    """Read an export CSV back into the schema's dtypes; ValueError on a foreign header."""
    schema = C.EXPORT_SCHEMA
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != list(schema):
            raise ValueError(f"{path}: not a RouteScope export (header {header!r}, expected {list(schema)})")
        decoders = [_decoder(t) for t in schema.values()]
        data: list[list[Any]] = [[] for _ in schema]
        for n, row in enumerate(reader, start=2):
            if len(row) != len(schema):
                raise ValueError(f"{path}: record {n} has {len(row)} fields, expected {len(schema)}")
            for col, dec, cell in zip(data, decoders, row):
                col.append(dec(cell))
    return conform(pd.DataFrame({c: pd.array(v, dtype=t) if v else pd.Series(dtype=t)
                                 for (c, t), v in zip(schema.items(), data)}))


def read_parquet(path: str | os.PathLike) -> pd.DataFrame:
    return conform(pq.read_table(str(path)).to_pandas())


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    return read_csv(path) if export_format(path) == "csv" else read_parquet(path)


# --- in-memory exports (downloads) -------------------------------------------------------------

def table_bytes(df: pd.DataFrame, fmt: str) -> bytes:
    """The export table as CSV or Parquet bytes, written exactly as `write_table` writes files."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"table.{fmt}"
        write_table(df, path)
        return path.read_bytes()


def frame_csv_bytes(df: pd.DataFrame) -> bytes:
    """Any small report table as CSV bytes with the same safety rules for text cells (escapes,
    formula neutralising); other columns are written as pandas writes them."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object or str(out[c].dtype).startswith("string"):
            out[c] = [NA_TEXT if v is None or v is pd.NA else escape_text(str(v)) for v in out[c]]
    return out.to_csv(index=False, lineterminator="\r\n").encode("utf-8")
