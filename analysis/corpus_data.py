"""Datasets for corpus statistics: a user's file (or its uploaded bytes) or a shipped dataset, read
strictly and streamed, with its limits and a digest (the cache key of its statistics).

Formats (by suffix, like the export's prompt readers):
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
that are not UTF-8, no text column, a record with the wrong number of fields, an empty text, a JSON
line that is no object, a label column with too many values, more rows or characters than the
limits allow, no rows at all. `load_corpus` reads the whole input once to check it (and to digest
it) before any model runs, so a bad file changes nothing; the rows are then read again as they are
run, so a large file is never held in memory (uploaded bytes are, within the app's limits).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Sequence

from .prompts import iter_lines, open_regular_file

SUFFIXES = (".txt", ".tsv", ".csv", ".jsonl", ".parquet", ".pq")
TEXT_COLUMNS = ("text", "prompt")  # the text column, in order of preference
ID_COLUMNS = ("prompt_id", "id")
MAX_LABEL_VALUES = 50  # a column with more distinct values is not a label (free text, ids, numbers)
MISSING = "(missing)"

# the app's limits (the command line has none: it streams); README "Corpus view" states them
APP_MAX_ROWS = 20_000
APP_MAX_CHARS = 10_000_000

DATA = Path(__file__).parent / "data"


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

    def __iter__(self) -> Iterator[CorpusRow]:
        return self.opener()

    def describe(self) -> str:
        labels = ", ".join(self.label_columns) or "none"
        return f"{self.name}: {self.n_rows:,} rows, {self.n_chars:,} characters, label columns: {labels}"


# --- reading records ------------------------------------------------------------------------------

def _suffix(name: str) -> str:
    suffix = Path(name).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{name}: unknown dataset format {suffix or '(no suffix)'!r}; use "
                         f"{', '.join(SUFFIXES[:-1])} (one prompt per line, or a text column and label columns)")
    return suffix


def _binary(source: Any, name: str) -> IO[bytes]:
    """Uploaded bytes, or the file opened as the prompt readers open theirs (a directory, FIFO,
    device or socket refused without waiting on it)."""
    if isinstance(source, bytes):
        return io.BytesIO(source)
    return open_regular_file(source, "dataset file")


def _text_lines(f: IO[bytes], name: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its line end); a bad byte is named with its line and
    offset, a line over the prompt readers' 1 MiB limit refused."""
    return iter_lines(f, name, "dataset")


def _records(source: Any, name: str, suffix: str) -> tuple[list[str], Iterator[tuple[str, dict[str, Any]]]]:
    """(columns, iterator of (where, record)) of a tabular file; `where` names the record in messages."""
    f = _binary(source, name)
    if suffix in (".parquet", ".pq"):
        return _parquet_records(f, name)
    if suffix == ".jsonl":
        return _jsonl_records(f, name)
    lines = _text_lines(f, name)
    if suffix == ".tsv":
        header = next((t.split("\t") for _, t in lines if t), None)  # the first non-empty line
        if header is None:
            f.close()
            raise ValueError(f"{name}: empty file; expected a header naming a text column ({' or '.join(TEXT_COLUMNS)})")

        def tsv() -> Iterator[tuple[str, dict[str, Any]]]:
            with f:
                for n, t in lines:
                    if not t:
                        continue
                    fields = t.split("\t")
                    if len(fields) != len(header):
                        raise ValueError(f"{name}: line {n} has {len(fields)} tab-separated fields, the header has "
                                         f"{len(header)}")
                    yield f"line {n}", dict(zip(header, fields))

        return header, tsv()
    # csv: the csv module reads quoted newlines; line numbers come from the reader
    text = (t + "\n" for _, t in lines)
    reader = csv.reader(text)
    try:
        header = next(reader)
    except StopIteration:
        f.close()
        raise ValueError(f"{name}: empty file; expected a header naming a text column "
                         f"({' or '.join(TEXT_COLUMNS)})") from None
    except csv.Error as e:
        f.close()
        raise ValueError(f"{name}: line 1: {e}") from None

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        with f:
            while True:
                try:
                    fields = next(reader)
                except StopIteration:
                    return
                except csv.Error as e:
                    raise ValueError(f"{name}: line {reader.line_num}: {e}") from None
                if not any(fields):
                    continue
                if len(fields) != len(header):
                    raise ValueError(f"{name}: line {reader.line_num} has {len(fields)} fields, the header has "
                                     f"{len(header)}")
                yield f"line {reader.line_num}", dict(zip(header, fields))

    return header, rows()


def _jsonl_records(f: IO[bytes], name: str):
    lines = _text_lines(f, name)
    first = None
    for n, t in lines:
        if t.strip():
            first = (n, t)
            break
    if first is None:
        f.close()
        raise ValueError(f"{name}: empty file; expected one JSON object per line with a "
                         f"{' or '.join(repr(c) for c in TEXT_COLUMNS)} field")

    def parse(n: int, t: str) -> dict[str, Any]:
        try:
            obj = json.loads(t)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name}: line {n} is not JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{name}: line {n} is a JSON {type(obj).__name__}, not an object")
        return obj

    head = parse(*first)

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        with f:
            yield f"line {first[0]}", head
            for n, t in lines:
                if t.strip():
                    yield f"line {n}", parse(n, t)

    return list(head), rows()  # columns: the first object's keys (later objects may add labels: not seen)


def _parquet_records(f: IO[bytes], name: str):
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f)
    except Exception as e:  # pyarrow's errors name no file; ours does
        f.close()
        raise ValueError(f"{name}: not a readable Parquet file ({str(e).splitlines()[0][:200]})") from None
    columns = pf.schema_arrow.names

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        n = 0
        with f:
            for batch in pf.iter_batches(batch_size=4096):
                for rec in batch.to_pylist():
                    n += 1
                    yield f"row {n}", rec

    return columns, rows()


def _cell(v: Any) -> str | None:
    """A label or id cell as text (None: missing)."""
    if v is None or v == "":
        return None
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False, sort_keys=True)
    return str(v)


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
    suffix = _suffix(name)
    if suffix == ".txt":
        f = _binary(source, name)

        def txt():
            with f:
                for n, t in _text_lines(f, name):
                    if t.strip():
                        yield f"line {n}", str(n), t, {}

        if label_columns:
            raise ValueError(f"{name}: a .txt dataset has no label columns (asked for {', '.join(label_columns)})")
        return [], txt()
    columns, records = _records(source, name, suffix)
    text_col = _text_column(columns, name, text_column)
    id_col = next((c for c in ID_COLUMNS if c in columns and c != text_col), None)
    others = [c for c in columns if c not in (text_col, id_col)]
    if label_columns is not None:
        unknown = [c for c in label_columns if c not in others]
        if unknown:
            records.close()
            raise ValueError(f"{name}: no label column(s) {', '.join(unknown)}; found: {', '.join(others) or 'none'}")
        others = list(label_columns)

    def gen():
        for k, (where, rec) in enumerate(records, start=1):
            text = rec.get(text_col)
            if not isinstance(text, str):
                if text is not None:
                    raise ValueError(f"{name}: {where}: {text_col} is not text ({type(text).__name__})")
                text = ""
            rid = _cell(rec.get(id_col)) if id_col else None
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


def load_corpus(source: str | os.PathLike | bytes, name: str | None = None, *, limits: Limits = Limits(),
                text_column: str | None = None, label_columns: Sequence[str] | None = None) -> CorpusData:
    """Check a dataset file (a path, or uploaded bytes with their file `name`) and return it as a
    `CorpusData` (module doc: formats, label columns, errors). Reads the input twice before
    returning (the check and the digest); iterating the result reads it again."""
    name = name if name is not None else str(source)
    if isinstance(source, bytes) and name == str(source):
        raise ValueError("uploaded bytes need the file name they came with")
    candidates, rows = _rows(source, name, text_column, label_columns)
    values: dict[str, set[str]] = {c: set() for c in candidates}
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
            if len(seen) <= MAX_LABEL_VALUES:
                seen.add(_cell(rec.get(c)) or MISSING)
    if not n_rows:
        raise ValueError(f"{name}: no rows (only a header, or only blank lines)")
    notes = []
    if label_columns is not None:
        wide = [c for c in candidates if len(values[c]) > MAX_LABEL_VALUES]
        if wide:
            raise ValueError(f"{name}: label column(s) {', '.join(wide)} have more than {MAX_LABEL_VALUES} distinct "
                             "values; a label groups rows")
        labels = list(candidates)
    else:
        labels = [c for c in candidates if len(values[c]) <= MAX_LABEL_VALUES]
        notes += [f"column {c} has more than {MAX_LABEL_VALUES} distinct values: not used as a label"
                  for c in candidates if c not in labels]
    digest = _digest(source, ["file", Path(name).suffix.lower(), text_column or "", *labels])

    def opener() -> Iterator[CorpusRow]:
        _, again = _rows(source, name, text_column, labels if candidates else None)
        for _, rid, text, rec in again:
            yield CorpusRow(rid, text, tuple(_cell(rec.get(c)) or MISSING for c in labels))

    return CorpusData(name=Path(name).name if not isinstance(source, bytes) else name, digest=digest,
                      label_columns=tuple(labels), n_rows=n_rows, n_chars=n_chars, opener=opener, notes=tuple(notes))


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
    return CorpusData(name=name, digest=h.hexdigest(), label_columns=tuple(label_columns), n_rows=len(rows),
                      n_chars=n_chars, opener=lambda: iter(rows))


# --- shipped datasets -----------------------------------------------------------------------------

VALIDATION_DOCS = 200  # documents per domain of a shipped validation split (the corpus' default)


def validation_split(domains: Sequence[str], n_docs: int = VALIDATION_DOCS, max_chars: int | None = None) -> CorpusData:
    """The fixed validation documents of each domain (`corpora.corpus.validation_documents`), one
    row per document, labelled by its domain."""
    from routescope.corpora.corpus import validation_documents

    rows = [CorpusRow(f"{d}-{k + 1}", doc if max_chars is None else doc[:max_chars], (d,))
            for d in domains for k, doc in enumerate(validation_documents(d, n_docs))]
    return rows_corpus(f"validation split: {' + '.join(domains)} ({n_docs} documents each)", rows, ["domain"])


def _probe_file(file: str) -> Callable[[], CorpusData]:
    return lambda: load_corpus(DATA / file, label_columns=("domain", "expected_path"))


def _validation(*domains: str) -> Callable[[], CorpusData]:
    return lambda: validation_split(domains)


# shown name -> loader; the first is the view's default (20 prompts: instant)
SHIPPED: dict[str, Callable[[], CorpusData]] = {
    "Table 6 probes": _probe_file("table6_probes.tsv"),
    "held-out probes": _probe_file("heldout_probes.tsv"),
    "validation split: story + math": _validation("story", "math"),
    "validation split: story": _validation("story"),
    "validation split: math": _validation("math"),
}


# short names for the command line (`routescope corpus --shipped table6`)
SHIPPED_IDS = dict(zip(("table6", "heldout", "validation", "validation-story", "validation-math"), SHIPPED))


def shipped(name: str) -> CorpusData:
    """A shipped dataset by its name or short name."""
    name = SHIPPED_IDS.get(name, name)
    if name not in SHIPPED:
        raise ValueError(f"no shipped dataset {name!r} (shipped: {', '.join(SHIPPED_IDS)})")
    return SHIPPED[name]()
