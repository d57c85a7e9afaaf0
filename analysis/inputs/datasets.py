"""Datasets for corpus statistics: a user's file (or its uploaded bytes), read strictly and streamed
(`records` reads the tabular formats), with its limits and a digest (the cache key of its
statistics); also rows held in memory (`rows_corpus`: the shipped validation splits,
`analysis.corpus.shipped`).

Formats (by suffix, like the prompt readers, `prompts`):
- `.txt`: one prompt per non-blank line (a trailing "\\r" dropped); no labels; row id = line number.
- `.tsv`: a header, then one record per line, fields split on tabs (no quoting).
- `.csv`: RFC 4180 (quoted fields may hold commas, quotes and newlines).
- `.jsonl`: one JSON object per non-blank line.
- `.parquet` / `.pq`: a Parquet file.
Tabular formats need a text column (`text`, else `prompt`, or the one named by `text_column`); an
id column (`prompt_id` or `id`) names rows, else the 1-based row number does; every other column
is a label column when it has at most `MAX_LABEL_VALUES` distinct values (or the ones named by
`label_columns`). A missing label value (empty cell, null) is `MISSING`.

Errors are ValueErrors of one line naming the file and the row or line: an unknown suffix, bytes
that are not UTF-8 (or a lone surrogate from a JSON escape), no text column, a duplicate column
name, more than `MAX_LABEL_COLUMNS` candidate label columns, a record with the wrong number of
fields or an unterminated quote, JSON that is no object, nests too deep or holds a number Python
refuses, a corrupt Parquet file, an empty text, a label column with too many values, more rows or
characters than the limits allow, no rows at all.

Memory is bounded in every format: one row (a line of .txt/.tsv/.jsonl, a record of .csv, the cells
read from a Parquet row) is at most `files.MAX_LINE_BYTES` (1 MiB); a Parquet file is read in
batches of `records.PARQUET_BATCH` rows, only the columns used, after its metadata shows no column
chunk over `records.MAX_PARQUET_CHUNK` uncompressed and none that must hold a cell over 1 MiB; a label value is at
most `MAX_LABEL_CHARS` characters (a longer one makes its column no label).

`load_corpus` reads the whole input once to check it (and to digest it) before any model runs, so
a bad file changes nothing; the rows are then read again as they are run, so a large file is never
held in memory (uploaded bytes are, within the app's limits).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from routescope.analysis.inputs.files import shown
from routescope.analysis.inputs.records import (TEXT_COLUMNS, cell, check_text, dataset_suffix, open_binary, records,
                                                text_lines)

ID_COLUMNS = ("prompt_id", "id")
MAX_LABEL_VALUES = 50  # a column with more distinct values is not a label (free text, ids, numbers)
MAX_LABEL_COLUMNS = 256  # candidate label columns of one dataset (each costs a count table per layer)
MAX_LABEL_CHARS = 200  # a longer value is text, not a label (and label values are held while reading)
MISSING = "(missing)"

# the app's limits (the command line has none: it streams); README "Corpus view" states them
APP_MAX_ROWS = 20_000
APP_MAX_CHARS = 10_000_000


@dataclass(frozen=True)
class Limits:
    rows: int | None = None
    chars: int | None = None


APP_LIMITS = Limits(APP_MAX_ROWS, APP_MAX_CHARS)


@dataclass(frozen=True)
class CorpusRow:
    row_id: str
    text: str
    labels: tuple[str, ...]  # one value per label column of the dataset


@dataclass(frozen=True, eq=False)
class CorpusData:
    """A checked dataset: its name (as the user knows it), digest, label columns, size, notes
    (e.g. a column not taken as a label), and its rows, read anew on every iteration."""

    name: str
    digest: str
    label_columns: tuple[str, ...]
    n_rows: int
    n_chars: int
    opener: Callable[[], Iterator[CorpusRow]] = field(repr=False)
    notes: tuple[str, ...] = ()
    label_values: Mapping[str, tuple[str, ...]] | None = field(default=None, repr=False)  # per label column (None: not read)

    def __iter__(self) -> Iterator[CorpusRow]:
        return self.opener()

    def describe(self) -> str:
        labels = ", ".join(self.label_columns) or "none"
        return f"{self.name}: {self.n_rows:,} rows, {self.n_chars:,} characters, label columns: {labels}"


def _text_column(columns: Sequence[str], name: str, wanted: str | None) -> str:
    if wanted is not None:
        if wanted not in columns:
            raise ValueError(f"{name}: no text column {wanted!r}; found: {', '.join(map(str, columns)) or 'none'}")
        return wanted
    for c in TEXT_COLUMNS:
        if c in columns:
            return c
    raise ValueError(f"{name}: no text column (a column named {' or '.join(TEXT_COLUMNS)}); "
                     f"found: {', '.join(map(str, columns)) or 'none'}")


def _rows(source: Any, name: str, text_column: str | None, label_columns: Sequence[str] | None,
          ) -> tuple[list[str], Iterator[tuple[str, str, str, dict[str, Any]]]]:
    """(candidate label columns, iterator of (where, row id, text, record))."""
    suffix = dataset_suffix(name)
    if suffix == ".txt":
        f = open_binary(source, name)

        def txt():
            with f:
                for n, t in text_lines(f, name):
                    if t.strip():
                        yield f"line {n}", str(n), t, {}

        if label_columns:
            raise ValueError(f"{name}: a .txt dataset has no label columns (asked for {', '.join(label_columns)})")
        return [], txt()
    columns, make = records(source, name, suffix)
    text_col = _text_column(columns, name, text_column)
    id_col = next((c for c in ID_COLUMNS if c in columns and c != text_col), None)
    others = [c for c in columns if c not in (text_col, id_col)]
    if label_columns is not None:
        unknown = [c for c in label_columns if c not in others]
        if unknown:
            raise ValueError(f"{name}: no label column(s) {shown(', '.join(unknown))}; found: "
                             f"{shown(', '.join(others)) or 'none'}")
        others = list(label_columns)
    if len(others) > MAX_LABEL_COLUMNS:
        raise ValueError(f"{name}: {len(others):,} label columns; at most {MAX_LABEL_COLUMNS} (name the ones to use "
                         "with label_columns / --labels)")
    recs = make([text_col, *([id_col] if id_col else []), *others])

    def gen():
        for k, (where, rec) in enumerate(recs, start=1):
            text = rec.get(text_col)
            if not isinstance(text, str):
                if text is not None:
                    raise ValueError(f"{name}: {where}: {shown(text_col)} is not text ({type(text).__name__})")
                text = ""
            check_text(text, name, where, shown(text_col))
            rid = cell(rec.get(id_col)) if id_col else None
            if rid:
                check_text(rid, name, where, shown(id_col))
            yield where, rid or str(k), text, rec

    return others, gen()


def _digest(source: Any, parts: Sequence[str]) -> str:
    h = hashlib.sha256("\0".join(parts).encode("utf-8"))
    if isinstance(source, bytes):
        h.update(source)
    else:
        with open(source, "rb") as f:
            while block := f.read(2**20):
                h.update(block)
    return h.hexdigest()


def _one_line(rows: Iterator[Any]) -> Iterator[Any]:
    """`rows`, with any ValueError's message made one line (`shown`: file and column names may hold
    line breaks and control characters)."""
    try:
        yield from rows
    except ValueError as e:
        raise ValueError(shown(str(e))) from None


def load_corpus(source: str | os.PathLike | bytes, name: str | None = None, *, limits: Limits = Limits(),
                text_column: str | None = None, label_columns: Sequence[str] | None = None) -> CorpusData:
    """Check a dataset file (a path, or uploaded bytes with their file `name`) and return it as a
    `CorpusData` (module doc: formats, label columns, errors). Reads the input twice before
    returning (the check and the digest); iterating the result reads it again."""
    try:
        return _load_corpus(source, name, limits, text_column, label_columns)
    except ValueError as e:
        raise ValueError(shown(str(e))) from None


def _load_corpus(source: Any, name: str | None, limits: Limits, text_column: str | None,
                 label_columns: Sequence[str] | None) -> CorpusData:
    name = name if name is not None else str(source)
    if isinstance(source, bytes) and name == str(source):
        raise ValueError("uploaded bytes need the file name they came with")
    candidates, rows = _rows(source, name, text_column, label_columns)
    values: dict[str, dict[str, None]] = {c: {} for c in candidates}  # distinct values, in order of appearance
    long: set[str] = set()  # columns with a value over MAX_LABEL_CHARS: text, not labels
    n_rows = n_chars = 0
    for where, _, text, rec in rows:
        if not text.strip():
            raise ValueError(f"{name}: {where}: empty text")
        n_rows += 1
        n_chars += len(text)
        if limits.rows is not None and n_rows > limits.rows:
            raise ValueError(f"{name}: more than {limits.rows:,} rows; the app takes at most {limits.rows:,} "
                             "(routescope corpus streams files of any size)")
        if limits.chars is not None and n_chars > limits.chars:
            raise ValueError(f"{name}: more than {limits.chars:,} characters of text (by {where}); the app takes "
                             f"at most {limits.chars:,} (routescope corpus streams files of any size)")
        for c, seen in values.items():
            if len(seen) <= MAX_LABEL_VALUES and c not in long:
                v = cell(rec.get(c)) or MISSING
                if len(v) > MAX_LABEL_CHARS:
                    if label_columns is not None:
                        raise ValueError(f"{name}: {where}: label column {shown(c)!r} holds a value of {len(v):,} "
                                         f"characters; a label is at most {MAX_LABEL_CHARS}")
                    long.add(c)
                    continue
                seen[check_text(v, name, where, f"label column {shown(c)!r}")] = None
    if not n_rows:
        raise ValueError(f"{name}: no rows (only a header, or only blank lines)")
    notes = []
    if label_columns is not None:
        wide = [c for c in candidates if len(values[c]) > MAX_LABEL_VALUES]
        if wide:
            raise ValueError(f"{name}: label column(s) {shown(', '.join(wide))} have more than {MAX_LABEL_VALUES} "
                             "distinct values; a label groups rows")
        labels = list(candidates)
    else:
        labels = [c for c in candidates if len(values[c]) <= MAX_LABEL_VALUES and c not in long]
        notes += [f"column {shown(c)} has more than {MAX_LABEL_VALUES} distinct values: not used as a label"
                  for c in candidates if c not in labels and c not in long]
        notes += [f"column {shown(c)} has values longer than {MAX_LABEL_CHARS} characters: not used as a label"
                  for c in candidates if c in long]
    digest = _digest(source, ["file", Path(name).suffix.lower(), text_column or "", *labels])

    def opener() -> Iterator[CorpusRow]:
        _, again = _rows(source, name, text_column, labels if candidates else None)
        for _, rid, text, rec in _one_line(again):
            yield CorpusRow(rid, text, tuple(cell(rec.get(c)) or MISSING for c in labels))

    return CorpusData(name=Path(name).name if not isinstance(source, bytes) else name, digest=digest,
                      label_columns=tuple(labels), n_rows=n_rows, n_chars=n_chars, opener=opener, notes=tuple(notes),
                      label_values={c: tuple(values[c]) for c in labels})


def rows_corpus(name: str, rows: Sequence[CorpusRow], label_columns: Sequence[str], *,
                limits: Limits = Limits()) -> CorpusData:
    """A dataset from rows in memory (the shipped validation splits; tests)."""
    rows = tuple(rows)
    if not rows:
        raise ValueError(f"{name}: no rows")
    n_chars = sum(len(r.text) for r in rows)
    if limits.rows is not None and len(rows) > limits.rows:
        raise ValueError(f"{name}: {len(rows):,} rows; the app takes at most {limits.rows:,}")
    if limits.chars is not None and n_chars > limits.chars:
        raise ValueError(f"{name}: {n_chars:,} characters; the app takes at most {limits.chars:,}")
    h = hashlib.sha256("\0".join(["rows", name, *label_columns]).encode("utf-8"))
    for r in rows:
        h.update("\0".join([r.row_id, r.text, *r.labels, "\n"]).encode("utf-8"))
    values = {c: tuple(dict.fromkeys(r.labels[i] for r in rows)) for i, c in enumerate(label_columns)}
    return CorpusData(name=name, digest=h.hexdigest(), label_columns=tuple(label_columns), n_rows=len(rows),
                      n_chars=n_chars, opener=lambda: iter(rows), label_values=values)
