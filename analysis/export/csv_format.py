"""The project's one CSV format, for the export table and every other table it writes as CSV.

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
text). Missing numbers and booleans are empty cells. Every other column is text (`csv_kind`):
object, pandas 3's `str`, `string`, categoricals of strings, anything else (written as `str(v)`).
Reading restores the schema's dtypes, so `read_csv(write_csv(df))` equals `df`
(pandas.testing.assert_frame_equal, dtypes included).

`CsvWriter` is the one CSV writer of the project: the export table (files, `routescope export`,
the app's routing download) and every other table the app offers as CSV (`frame_csv_bytes`:
generation candidates, the tables of a family's pages) are written by it. `read_frame_csv` reads
such a table back, text restored exactly.

`CsvWriter` is the one CSV writer of the project: the export table (files, `routescope export`,
the app's routing download; `table_files`) and every other table the app offers as CSV
(`frame_csv_bytes`: generation candidates, the tables of a family's pages) are written by it.
`read_frame_csv` reads such a table back, text restored exactly.
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
from typing import Any, Callable, TextIO

import numpy as np
import pandas as pd

FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")
NA_TEXT = "\\N"
_SHORT = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
_UNSHORT = {v[1]: k for k, v in _SHORT.items()}
_NEEDS_ESCAPE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPED = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)


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


def csv_kind(dtype: Any) -> str:
    """How a column of this dtype is written: "bool", "int", "float" or "text". A categorical
    follows its categories; every other dtype that is not bool or numeric is text, so any
    string-like column (object, `str`, `string`) gets the escapes and formula neutralising."""
    dtype = pd.api.types.pandas_dtype(dtype)
    if isinstance(dtype, pd.CategoricalDtype):
        return csv_kind(dtype.categories.dtype)
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_float_dtype(dtype):
        return "float"
    return "text"


def csv_kinds(df: pd.DataFrame) -> dict[str, str]:
    """Column -> `csv_kind` of its dtype."""
    return {str(c): csv_kind(t) for c, t in df.dtypes.items()}


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v))


_ENCODE = {
    "text": lambda v: NA_TEXT if _missing(v) else escape_text(v if isinstance(v, str) else str(v)),
    "bool": lambda v: "" if _missing(v) else ("true" if v else "false"),
    "int": lambda v: "" if _missing(v) else str(int(v)),
    "float": lambda v: "" if _missing(v) else repr(float(v)),
}
_DECODE = {
    "text": lambda s: pd.NA if s == NA_TEXT else unescape_text(s),
    "bool": lambda s: pd.NA if s == "" else {"true": True, "false": False}[s],
    "int": lambda s: pd.NA if s == "" else int(s),
    "float": lambda s: math.nan if s == "" else float(s),
}
_FRAME_DTYPE = {"text": "string", "bool": "boolean", "int": "Int64", "float": "float64"}


class CsvWriter:
    """The one CSV writer: a header, then rows encoded per column kind (module doc), RFC 4180
    (`csv.QUOTE_MINIMAL`, CRLF). `kinds`: column -> "text" | "bool" | "int" | "float"."""

    def __init__(self, f: TextIO, kinds: dict[str, str]) -> None:
        self.kinds = dict(kinds)
        self._encoders = [_ENCODE[k] for k in self.kinds.values()]
        self._w = csv.writer(f, quoting=csv.QUOTE_MINIMAL, lineterminator="\r\n")
        self._w.writerow([escape_text(c) for c in self.kinds])

    def write(self, df: pd.DataFrame) -> None:
        cols = [_encoded(df[c], kind, enc) for (c, kind), enc in zip(self.kinds.items(), self._encoders)]
        self._w.writerows(zip(*cols))


def _encoded(column: pd.Series, kind: str, enc: Callable[[Any], str]) -> list[str]:
    """A column's cells as `enc` writes them. Columns of one type (every kind but float and object)
    repeat few values (layer, site, option, token: 73,728 rows of a 16-layer export hold under a
    thousand distinct ones), so each distinct value is encoded once; missing values, numbered -1 by
    `factorize`, take the table's last entry, the encoding of a missing cell. An object column is
    encoded cell by cell: factorize would merge values equal across types (1, 1.0 and True)."""
    if kind == "float" or column.dtype == object:
        return [enc(v) for v in column.astype(object).tolist()]
    codes, uniques = pd.factorize(column, use_na_sentinel=True)
    table = np.array([enc(v) for v in np.asarray(uniques, dtype=object).tolist()] + [enc(None)], dtype=object)
    return table[codes].tolist()


def read_records(f: TextIO, where: Any, kinds: dict[str, str] | None,
                  expect_header: list[str] | None = None) -> dict[str, list[Any]]:
    """Decoded columns of a CSV written by `CsvWriter`; ValueError naming `where` on a bad header
    or record. `kinds` None: every column is text."""
    reader = csv.reader(f)
    raw = next(reader, None)
    if expect_header is not None and raw != expect_header:
        raise ValueError(f"{where}: not a RouteScope export (header {raw!r}, expected {expect_header})")
    if raw is None:
        raise ValueError(f"{where}: empty CSV (no header)")
    header = [unescape_text(c) for c in raw]
    kinds = kinds if kinds is not None else {c: "text" for c in header}
    if header != list(kinds):
        raise ValueError(f"{where}: columns {header}, expected {list(kinds)}")
    decoders = [_DECODE[k] for k in kinds.values()]
    data: list[list[Any]] = [[] for _ in header]
    for n, row in enumerate(reader, start=2):
        if len(row) != len(header):
            raise ValueError(f"{where}: record {n} has {len(row)} fields, expected {len(header)}")
        for col, dec, cell in zip(data, decoders, row):
            col.append(dec(cell))
    return dict(zip(header, data))


# --- any table as CSV (downloads) ------------------------------------------------------------

def frame_csv_bytes(df: pd.DataFrame) -> bytes:
    """Any report table (no index) as UTF-8 CSV bytes, written by `CsvWriter` with the kinds of its
    dtypes (`csv_kinds`): text cells escaped and neutralised, numbers and booleans as numbers."""
    df = df.rename(columns=str)
    buf = io.StringIO(newline="")
    CsvWriter(buf, csv_kinds(df)).write(df)
    return buf.getvalue().encode("utf-8")


def read_frame_csv(data: bytes | os.PathLike, kinds: dict[str, str] | None = None) -> pd.DataFrame:
    """Read a `frame_csv_bytes` table (bytes, or a file path) back: text exactly as it was (dtype
    "string"), numbers and booleans by `kinds` (e.g. `csv_kinds(original)`; default: all text)."""
    if isinstance(data, bytes):
        cols = read_records(io.StringIO(data.decode("utf-8"), newline=""), "CSV data", kinds)
    else:
        with open(data, encoding="utf-8", newline="") as f:
            cols = read_records(f, data, kinds)
    kinds = kinds if kinds is not None else {c: "text" for c in cols}
    return pd.DataFrame({c: pd.array(v, dtype=_FRAME_DTYPE[kinds[c]]) for c, v in cols.items()})
