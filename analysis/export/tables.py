"""Reading and writing the export table (schema: `analysis.export.columns.EXPORT_SCHEMA`, kinds:
`analysis.export.columns.KINDS`) as CSV or Parquet, whole or streamed batch by batch.

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

`ExportWriter` appends batches to a CSV and/or a Parquet file (`pyarrow.parquet.ParquetWriter`)
so memory stays flat; it writes to a hidden temporary file beside the target (`.<name>.<hex>.tmp`,
locked while in use) and renames it into place only when closed without error, so a failed or
interrupted export leaves no half-written file, and the next export to the same target deletes
the temporaries of one that was killed outright. Parquet files
carry the export's provenance when given (JSON under the key-value metadata key
`routescope.provenance`: checkpoint, weights hash, dtype, settings; `read_provenance`).
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import secrets
import tempfile

try:
    import fcntl
except ImportError:  # not on Windows: temporaries are still cleaned on errors and interrupts, not after a kill
    fcntl = None  # type: ignore[assignment]
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from routescope.analysis.export import columns as C
from routescope.analysis.export.run_table import conform, empty_table

FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")
NA_TEXT = "\\N"
_SHORT = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
_UNSHORT = {v[1]: k for k, v in _SHORT.items()}
_NEEDS_ESCAPE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPED = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)

PROVENANCE_KEY = b"routescope.provenance"  # Parquet key-value metadata: how the file was made (JSON)
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


def _read_records(f: TextIO, where: Any, kinds: dict[str, str] | None,
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


# --- streaming writer ------------------------------------------------------------------------

def _provenance_json(provenance: dict) -> bytes:
    return json.dumps(provenance, sort_keys=True, ensure_ascii=False, allow_nan=False).encode("utf-8")


def arrow_schema() -> pa.Schema:
    """The Parquet schema of the export table (with pandas metadata for the nullable dtypes)."""
    return pa.Table.from_pandas(empty_table(), preserve_index=False).schema


class _CsvSink:
    def __init__(self, path: Path, schema: dict[str, str], provenance: dict | None = None) -> None:
        self.schema = schema
        self.f = open(path, "w", encoding="utf-8", newline="")
        self.w = CsvWriter(self.f, {c: csv_kind(t) for c, t in schema.items()})

    def write(self, df: pd.DataFrame) -> None:
        self.w.write(df)

    def close(self) -> None:
        self.f.close()


class _ParquetSink:
    def __init__(self, path: Path, schema: dict[str, str], provenance: dict | None = None) -> None:
        self.schema = arrow_schema()
        if provenance is not None:
            self.schema = self.schema.with_metadata({**self.schema.metadata, PROVENANCE_KEY: _provenance_json(provenance)})
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


def check_output(path: str | os.PathLike) -> Path:
    """ValueError unless `path` can take an export: a known suffix, not a directory, inside an
    existing directory this process may write to. Checked before any work, so a long export never
    fails at its end; directories are never created."""
    p = Path(path)
    parent = p.parent
    if p.is_dir():
        raise ValueError(f"{p}: is a directory; give a file name, e.g. {p / 'routes.csv'}")
    export_format(p)
    if p.exists() and not p.is_file():
        raise ValueError(f"{p}: exists and is not a regular file")
    if not parent.exists():
        raise ValueError(f"{p}: directory {parent} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{p}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{p}: cannot write to directory {parent} (permission denied)")
    return p


_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{12}\.tmp")  # ".<target name>.<12 hex>.tmp", beside the target


def temporary_name(path: Path) -> Path:
    """A fresh name for a hidden temporary file beside `path` (`.<name>.<12 hex digits>.tmp`)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def new_temporary(path: Path) -> tuple[Path, int]:
    """Create an empty hidden temporary file beside `path`, with the mode any new file gets there
    (0o666 & ~umask; tempfile.mkstemp would make it 0o600, so the renamed output does too), and
    hold an exclusive lock on it: (its path, the locked descriptor). While the descriptor is open
    the file is in use; the lock goes with the process however it ends (SIGKILL included), which
    is how `remove_stale_temporaries` tells a live writer's file from one a killed run left."""
    for _ in range(100):
        tmp = temporary_name(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a brand-new file: nobody else holds it
        return tmp, fd
    raise FileExistsError(f"no free temporary name beside {path}")


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files an interrupted run left beside `path` (`new_temporary`'s names
    for this target whose lock nobody holds: their writer is gone); the deleted paths. A file
    another process is still writing is left alone. Without file locks (no fcntl) nothing is
    deleted."""
    path = Path(path)
    if fcntl is None:
        return []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return []
    removed = []
    for entry in entries:
        m = _TEMPORARY.fullmatch(entry.name)
        if not m or m["name"] != path.name or not entry.is_file(follow_symlinks=False):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(fd), os.stat(entry.path, follow_symlinks=False)):  # not renamed meanwhile
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:  # locked (a live writer), gone, or not ours to delete
            pass
        finally:
            os.close(fd)
    return removed


class ExportWriter:
    """Append export batches to one or more files (.csv and/or .parquet), memory flat.

    Use as a context manager: on a clean exit the temporary files are renamed onto the targets (an
    existing target is replaced: `replaced` lists those); on an exception, KeyboardInterrupt and the
    CLI's stop signals included (or `abort()`), they are deleted and the targets are left as they
    were. Temporaries a killed run left beside a target are deleted when the next writer opens it
    (`removed_temporaries`). Files get the mode the umask gives new files. OS errors become
    ValueErrors naming the target, not the temporary file.

        with ExportWriter("out.csv", "out.parquet") as w:
            for df in batches:
                w.write(df)
    """

    def __init__(self, *paths: str | os.PathLike, provenance: dict | None = None) -> None:
        if not paths:
            raise ValueError("ExportWriter needs at least one output path")
        self.schema = C.EXPORT_SCHEMA
        self.n_rows = 0
        self.replaced: list[Path] = []  # targets that existed and were replaced (known once closed)
        self.removed_temporaries: list[Path] = []  # what interrupted runs had left beside the targets
        self._sinks: list[tuple[Any, Path, Path]] = []
        self._locks: list[int] = []
        try:
            for p in paths:
                p = check_output(p)
                if any(p.resolve() == final.resolve() for _, _, final in self._sinks):
                    raise ValueError(f"{p}: given twice as an output")
                sink_class = _CsvSink if export_format(p) == "csv" else _ParquetSink
                self.removed_temporaries += remove_stale_temporaries(p)
                with _naming(p):
                    tmp, lock = new_temporary(p)
                    self._locks.append(lock)
                    try:
                        sink = sink_class(tmp, self.schema, provenance)
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
        for sink, _, final in self._sinks:
            with _naming(final):
                sink.write(df)
        self.n_rows += len(df)

    def close(self) -> None:
        """Finish every file and move it into place."""
        if not self._open:
            return
        self._open = False
        try:
            for sink, _, final in self._sinks:
                with _naming(final):
                    sink.close()
            for _, tmp, final in self._sinks:
                with _naming(final):
                    existed = final.exists()
                    os.replace(tmp, final)
                if existed:
                    self.replaced.append(final)
        except BaseException:
            self._cleanup()
            raise
        finally:
            self._unlock()

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
        self._unlock()

    def _unlock(self) -> None:
        while self._locks:
            os.close(self._locks.pop())

    def __enter__(self) -> "ExportWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


@contextlib.contextmanager
def _naming(target: Path) -> Iterator[None]:
    """Report an OS error while writing `target` (or its temporary file) as a ValueError naming target."""
    try:
        yield
    except OSError as e:
        raise ValueError(f"{target}: cannot write ({e.strerror or e})") from None


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
        data = _read_records(f, path, {c: csv_kind(t) for c, t in schema.items()}, expect_header=list(schema))
    return conform(pd.DataFrame({c: pd.array(v, dtype=t) if v else pd.Series(dtype=t)
                                 for (c, t), v in zip(schema.items(), data.values())}))


def read_parquet(path: str | os.PathLike) -> pd.DataFrame:
    return conform(pq.read_table(str(path)).to_pandas())


def read_provenance(path: str | os.PathLike) -> dict | None:
    """The provenance a Parquet export file records (`ExportWriter(provenance=...)`), or None."""
    raw = (pq.read_schema(str(path)).metadata or {}).get(PROVENANCE_KEY)
    return None if raw is None else json.loads(raw)


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
        cols = _read_records(io.StringIO(data.decode("utf-8"), newline=""), "CSV data", kinds)
    else:
        with open(data, encoding="utf-8", newline="") as f:
            cols = _read_records(f, data, kinds)
    kinds = kinds if kinds is not None else {c: "text" for c in cols}
    return pd.DataFrame({c: pd.array(v, dtype=_FRAME_DTYPE[kinds[c]]) for c, v in cols.items()})
