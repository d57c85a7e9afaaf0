"""A replay's files: `agreement`, `mismatches`, `checks`, `first_divergence` and `rows` as CSV and
Parquet side by side, `replay.html` (the page, `rendering.replay_figures.page`) and `replay.json`
(provenance and the corpus figures), written as one output set (`analysis.corpus.page.OutputSet`:
built beside DIR and swapped in whole; an interrupted run leaves the earlier set).

The mismatches are written while the replay runs (`MismatchFiles`, the CLI's sink): a trace of any
size leaves memory bounded; CSV by the project's one writer (`CsvWriter`: text escaped, formulas
neutralised), Parquet one row group per batch.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from routescope.analysis.corpus.page import frame_bytes, write_file
from routescope.analysis.export.csv_format import CsvWriter, csv_kinds

from routescope.analysis.replay.compare import MISMATCH_COLUMNS

TABLES = ("agreement", "mismatches", "checks", "first_divergence", "rows")
PAGE, PROVENANCE = "replay.html", "replay.json"
_SET = re.compile(r"(%s)\.(csv|parquet)" % "|".join(TABLES))


def check_out_dir(path: str | os.PathLike) -> Path:
    """The output directory (need not exist; its parent must), or ValueError naming the problem;
    checked before any work. It is replaced whole, so it may hold only an earlier replay's files."""
    p = Path(path)
    if p.name in ("", ".."):
        p = Path(os.path.abspath(p))
    if p.is_symlink():
        raise ValueError(f"{p}: is a symbolic link; --out is replaced whole and no link is followed")
    if p.exists() and not p.is_dir():
        raise ValueError(f"{p}: exists and is not a directory; --out names a directory for the tables")
    if not p.parent.is_dir():
        raise ValueError(f"{p}: directory {p.parent} does not exist")
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise ValueError(f"{p}: cannot write in {p.parent} (permission denied); the output set is built beside --out")
    if p.exists():
        foreign = sorted(e.name for e in os.scandir(p)
                         if not (e.is_file(follow_symlinks=False) and (e.name in (PAGE, PROVENANCE) or _SET.fullmatch(e.name))))
        if foreign:
            raise ValueError(f"{p}: holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} that no replay "
                             f"writes (e.g. {foreign[0]!r}); --out is replaced whole: give an empty or new directory")
    return p


def empty_mismatches() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in MISMATCH_COLUMNS.items()})


class MismatchFiles:
    """mismatches.csv and mismatches.parquet in directory `out`, appended batch by batch (`__call__`:
    the replay's sink); `close()` finishes both (an empty table has its header and schema)."""

    def __init__(self, out: Path) -> None:
        empty = empty_mismatches()
        self._csv = open(out / "mismatches.csv", "w", encoding="utf-8", newline="")
        self._writer = CsvWriter(self._csv, csv_kinds(empty))
        self.schema = pa.Schema.from_pandas(empty, preserve_index=False)
        self._pq = pq.ParquetWriter(out / "mismatches.parquet", self.schema)
        self.rows = 0

    def __call__(self, df: pd.DataFrame) -> None:
        self._writer.write(df)
        self._pq.write_table(pa.Table.from_pandas(df, schema=self.schema, preserve_index=False))
        self.rows += len(df)

    def close(self) -> None:
        self._csv.close()
        self._pq.close()


def write_set(out: Path, tables: dict[str, pd.DataFrame], provenance: dict[str, Any], page_html: str,
              *, skip: tuple[str, ...] = ()) -> list[Path]:
    """The tables (but `skip`: written already, the streamed mismatches), the page and the JSON into
    `out` (an output set's directory); the paths written."""
    written = []
    for name in TABLES:
        if name in skip:
            continue
        for fmt in ("csv", "parquet"):
            path = out / f"{name}.{fmt}"
            write_file(path, frame_bytes(tables[name], fmt, provenance))
            written.append(path)
    write_file(out / PAGE, page_html.encode("utf-8"))
    write_file(out / PROVENANCE, json.dumps(provenance, indent=1, ensure_ascii=False, default=str).encode("utf-8"))
    return written + [out / PAGE, out / PROVENANCE]
