"""The export table's files (schema: `columns.EXPORT_SCHEMA`, kinds: `columns.KINDS`) as CSV
(`csv_format`) or Parquet, whole or streamed batch by batch.

`ExportWriter` appends batches to a CSV and/or a Parquet file (`pyarrow.parquet.ParquetWriter`)
so memory stays flat; it writes to a hidden temporary file beside the target (`.<name>.<hex>.tmp`,
locked while in use) and renames it into place only when closed without error, so a failed or
interrupted export leaves no half-written file, and the next export to the same target deletes
the temporaries of one that was killed outright (`output_files`). Parquet files carry the export's
provenance when given (JSON under the key-value metadata key `routescope.provenance`: checkpoint,
weights hash, dtype, settings; `read_provenance`).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from routescope.analysis.export import columns as C
from routescope.analysis.export.csv_format import CsvWriter, csv_kind, read_records
from routescope.analysis.export.output_files import (check_output, export_format, naming, new_temporary,
                                                    remove_stale_temporaries)
from routescope.analysis.export.run_table import conform, empty_table

PROVENANCE_KEY = b"routescope.provenance"  # Parquet key-value metadata: how the file was made (JSON)


# --- streaming writer ------------------------------------------------------------------------

def provenance_json(provenance: dict) -> bytes:
    """The provenance as the Parquet key-value metadata holds it (JSON, keys sorted)."""
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
            self.schema = self.schema.with_metadata({**self.schema.metadata, PROVENANCE_KEY: provenance_json(provenance)})
        self.w = pq.ParquetWriter(str(path), self.schema)

    def write(self, df: pd.DataFrame) -> None:
        if len(df):
            self.w.write_table(pa.Table.from_pandas(df, schema=self.schema, preserve_index=False))

    def close(self) -> None:
        self.w.close()


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
                with naming(p):
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
            with naming(final):
                sink.write(df)
        self.n_rows += len(df)

    def close(self) -> None:
        """Finish every file and move it into place."""
        if not self._open:
            return
        self._open = False
        try:
            for sink, _, final in self._sinks:
                with naming(final):
                    sink.close()
            for _, tmp, final in self._sinks:
                with naming(final):
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
        data = read_records(f, path, {c: csv_kind(t) for c, t in schema.items()}, expect_header=list(schema))
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
