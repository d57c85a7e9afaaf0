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
that are not UTF-8 (or a lone surrogate from a JSON escape), no text column, a duplicate column
name, more than `MAX_LABEL_COLUMNS` candidate label columns, a record with the wrong number of
fields or an unterminated quote, JSON that is no object, nests too deep or holds a number Python
refuses, a corrupt Parquet file, an empty text, a label column with too many values, more rows or
characters than the limits allow, no rows at all.

Memory is bounded in every format: one row (a line of .txt/.tsv/.jsonl, a record of .csv, the cells
read from a Parquet row) is at most `prompts.MAX_LINE_BYTES` (1 MiB); a Parquet file is read in
batches of `PARQUET_BATCH` rows, only the columns used, after its metadata shows no column chunk
over `MAX_PARQUET_CHUNK` uncompressed and none that must hold a cell over 1 MiB; a label value is at
most `MAX_LABEL_CHARS` characters (a longer one makes its column no label).

`load_corpus` reads the whole input once to check it (and to digest it) before any model runs, so
a bad file changes nothing; the rows are then read again as they are run, so a large file is never
held in memory (uploaded bytes are, within the app's limits).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping, Sequence

from routescope.analysis.runs.prompts import MAX_LINE_BYTES, MAX_PROMPT_FILE_BYTES, iter_lines, open_regular_file
from routescope.analysis.runs.family_table import probe_tables

SUFFIXES = (".txt", ".tsv", ".csv", ".jsonl", ".parquet", ".pq")
TEXT_COLUMNS = ("text", "prompt")  # the text column, in order of preference
ID_COLUMNS = ("prompt_id", "id")
MAX_LABEL_VALUES = 50  # a column with more distinct values is not a label (free text, ids, numbers)
MAX_LABEL_COLUMNS = 256  # candidate label columns of one dataset (each costs a count table per layer)
MAX_LABEL_CHARS = 200  # a longer value is text, not a label (and label values are held while reading)
MAX_PARQUET_CHUNK = MAX_PROMPT_FILE_BYTES  # uncompressed bytes of one column in one row group (decoded whole)
PARQUET_BATCH = 64  # rows per decoded Parquet batch: at most 64 MiB of cells at 1 MiB a row
MISSING = "(missing)"

# the csv module's field limit (128 Ki characters by default) raised to the one-row limit every format
# shares; a process-wide setting, only ever raised here, never lowered
csv.field_size_limit(max(csv.field_size_limit(), MAX_LINE_BYTES))

# the app's limits (the command line has none: it streams); README "Corpus view" states them
APP_MAX_ROWS = 20_000
APP_MAX_CHARS = 10_000_000

DATA = Path(__file__).parents[1] / "data"


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


def shown(text: str) -> str:
    """A name from the data as it may appear in a message: control characters, lone surrogates and
    line separators as escapes (a message is one line, and never drives the terminal)."""
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)


def _check_text(value: str, name: str, where: str, what: str) -> str:
    """`value`, or a ValueError for a lone surrogate (a JSON escape such as \\ud800): not text, and
    nothing downstream (tokenizer, CSV, page) can encode it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name}: {where}: {what} holds a lone surrogate U+{ord(value[e.start]):04X} at character "
                         f"{e.start}, which is not text") from None
    return value


def _check_header(columns: Sequence[Any], name: str) -> list[str]:
    seen: set[str] = set()
    for c in columns:
        _check_text(c, name, "header", f"column name {shown(c)!r}")
        if c in seen:
            raise ValueError(f"{name}: header: column {shown(c)!r} appears twice; column names must be unique")
        seen.add(c)
    return list(columns)


Records = Callable[[Sequence[str]], Iterator[tuple[str, dict[str, Any]]]]  # the columns used -> (where, record)


def _records(source: Any, name: str, suffix: str) -> tuple[list[str], Records]:
    """(columns, a reader of (where, record) given the columns used) of a tabular file; `where`
    names the record in messages."""
    f = _binary(source, name)
    try:
        if suffix in (".parquet", ".pq"):
            return _parquet_records(f, name)
        if suffix == ".jsonl":
            return _jsonl_records(f, name)
        return _delimited_records(f, name, suffix)
    except BaseException:
        f.close()
        raise


def _delimited_records(f: IO[bytes], name: str, suffix: str) -> tuple[list[str], Records]:
    lines = _text_lines(f, name)
    if suffix == ".tsv":
        header = next((t.split("\t") for _, t in lines if t), None)  # the first non-empty line
        if header is None:
            raise ValueError(f"{name}: empty file; expected a header naming a text column ({' or '.join(TEXT_COLUMNS)})")
        _check_header(header, name)

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

        return header, lambda _: tsv()
    # csv: the csv module reads quoted newlines (strict: an unterminated quote is an error, not one
    # giant field); a record, however many lines it spans, is held to the one-row limit
    size = [0]

    def text() -> Iterator[str]:
        for n, t in lines:
            size[0] += (len(t) if t.isascii() else len(t.encode("utf-8"))) + 1
            if size[0] > MAX_LINE_BYTES + 1:
                raise ValueError(f"{name}: the record ending at line {n} is longer than {MAX_LINE_BYTES >> 20} MiB, "
                                 "the limit for one row (an unterminated quote?)")
            yield t + "\n"

    reader = csv.reader(text(), strict=True)

    def record() -> list[str] | None:
        size[0] = 0
        try:
            return next(reader)
        except StopIteration:
            return None
        except csv.Error as e:
            raise ValueError(f"{name}: line {reader.line_num}: {e} (CSV quoting)") from None

    header = record()
    if header is None:
        raise ValueError(f"{name}: empty file; expected a header naming a text column "
                         f"({' or '.join(TEXT_COLUMNS)})")
    _check_header(header, name)

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        with f:
            while (fields := record()) is not None:
                if not any(fields):
                    continue
                if len(fields) != len(header):
                    raise ValueError(f"{name}: line {reader.line_num} has {len(fields)} fields, the header has "
                                     f"{len(header)}")
                yield f"line {reader.line_num}", dict(zip(header, fields))

    return header, lambda _: rows()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) < len(keys):
        raise _DuplicateKey(next(k for k in keys if keys.count(k) > 1))
    return dict(pairs)


class _DuplicateKey(Exception):
    pass


def _jsonl_records(f: IO[bytes], name: str) -> tuple[list[str], Records]:
    lines = _text_lines(f, name)
    first = None
    for n, t in lines:
        if t.strip():
            first = (n, t)
            break
    if first is None:
        raise ValueError(f"{name}: empty file; expected one JSON object per line with a "
                         f"{' or '.join(repr(c) for c in TEXT_COLUMNS)} field")

    def parse(n: int, t: str) -> dict[str, Any]:
        try:
            obj = json.loads(t, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name}: line {n} is not JSON ({e.msg}, column {e.colno})") from None
        except RecursionError:
            raise ValueError(f"{name}: line {n}: JSON nested too deeply to read") from None
        except _DuplicateKey as e:
            raise ValueError(f"{name}: line {n}: key {shown(str(e.args[0]))!r} appears twice in one object") from None
        except ValueError as e:  # e.g. an integer of more digits than Python converts
            raise ValueError(f"{name}: line {n}: a JSON value Python refuses ({str(e).split(':')[0]})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{name}: line {n} is a JSON {type(obj).__name__}, not an object")
        return obj

    head = parse(*first)
    _check_header(list(head), name)

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        with f:
            yield f"line {first[0]}", head
            for n, t in lines:
                if t.strip():
                    yield f"line {n}", parse(n, t)

    return list(head), lambda _: rows()  # columns: the first object's keys (later objects may add labels: not seen)


def _arrow_message(e: BaseException) -> str:
    return shown((str(e).strip().splitlines() or [type(e).__name__])[0][:200])


def _parquet_records(f: IO[bytes], name: str) -> tuple[list[str], Records]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f)
        columns = pf.schema_arrow.names
        md = pf.metadata
    except Exception as e:  # pyarrow's errors name no file; ours does
        raise ValueError(f"{name}: not a readable Parquet file ({_arrow_message(e)})") from None
    _check_header(columns, name)

    def check_sizes(used: Sequence[str]) -> None:
        """From the metadata alone, before any page is decoded: a column chunk larger than
        MAX_PARQUET_CHUNK, or one larger than its rows could be at 1 MiB each (so a cell is)."""
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            size: dict[str, int] = {}
            for i in range(rg.num_columns):
                col = rg.column(i)
                top = col.path_in_schema.split(".")[0]
                if top in used:
                    size[top] = size.get(top, 0) + max(col.total_uncompressed_size, col.total_compressed_size)
            for c, n in size.items():
                where = f"{name}: row group {g + 1} (rows {_first_row(md, g):,}..)"
                if n > MAX_LINE_BYTES * rg.num_rows + 64 * rg.num_rows + (1 << 20):
                    raise ValueError(f"{where}: column {shown(c)!r} holds a cell larger than {MAX_LINE_BYTES >> 20} "
                                     f"MiB ({n:,} bytes in {rg.num_rows:,} rows), the limit for one row")
                if n > MAX_PARQUET_CHUNK:
                    raise ValueError(f"{where}: column {shown(c)!r} is {n:,} bytes uncompressed; at most "
                                     f"{MAX_PARQUET_CHUNK >> 20} MiB per column in one row group (write the file "
                                     "with smaller row groups)")

    def rows(used: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
        used = [c for c in columns if c in set(used)]
        check_sizes(used)
        n = 0
        with f:
            batches = pf.iter_batches(batch_size=PARQUET_BATCH, columns=used)
            while True:
                try:
                    batch = next(batches, None)
                except Exception as e:
                    raise ValueError(f"{name}: rows {n + 1:,}..: not readable Parquet ({_arrow_message(e)})") from None
                if batch is None:
                    return
                sizes = None  # bytes of each row's text and binary cells, before any becomes a Python object
                for c in batch.columns:
                    if pa.types.is_string(c.type) or pa.types.is_binary(c.type) or pa.types.is_large_string(c.type) \
                            or pa.types.is_large_binary(c.type):
                        s = pc.fill_null(pc.binary_length(c), 0).to_numpy(zero_copy_only=False)
                        sizes = s if sizes is None else sizes + s
                if sizes is not None and len(sizes) and sizes.max() > MAX_LINE_BYTES:
                    k = int(sizes.argmax())
                    raise ValueError(f"{name}: row {n + k + 1:,} is {int(sizes[k]):,} bytes, longer than "
                                     f"{MAX_LINE_BYTES >> 20} MiB, the limit for one row")
                try:
                    recs = batch.to_pylist()
                except Exception as e:  # e.g. a string column whose bytes are not UTF-8
                    raise ValueError(f"{name}: rows {n + 1:,}..{n + batch.num_rows:,}: not readable "
                                     f"({_arrow_message(e)})") from None
                for rec in recs:
                    n += 1
                    yield f"row {n}", rec

    return columns, rows


def _first_row(md: Any, g: int) -> int:
    return 1 + sum(md.row_group(i).num_rows for i in range(g))


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
    columns, make = _records(source, name, suffix)
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
    records = make([text_col, *([id_col] if id_col else []), *others])

    def gen():
        for k, (where, rec) in enumerate(records, start=1):
            text = rec.get(text_col)
            if not isinstance(text, str):
                if text is not None:
                    raise ValueError(f"{name}: {where}: {shown(text_col)} is not text ({type(text).__name__})")
                text = ""
            _check_text(text, name, where, shown(text_col))
            rid = _cell(rec.get(id_col)) if id_col else None
            if rid:
                _check_text(rid, name, where, shown(id_col))
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
                v = _cell(rec.get(c)) or MISSING
                if len(v) > MAX_LABEL_CHARS:
                    if label_columns is not None:
                        raise ValueError(f"{name}: {where}: label column {shown(c)!r} holds a value of {len(v):,} "
                                         f"characters; a label is at most {MAX_LABEL_CHARS}")
                    long.add(c)
                    continue
                seen[_check_text(v, name, where, f"label column {shown(c)!r}")] = None
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
            yield CorpusRow(rid, text, tuple(_cell(rec.get(c)) or MISSING for c in labels))

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


# --- shipped datasets -----------------------------------------------------------------------------

VALIDATION_DOCS = 200  # documents per domain of a shipped validation split (the corpus' default)


def validation_split(domains: Sequence[str], n_docs: int = VALIDATION_DOCS, max_chars: int | None = None) -> CorpusData:
    """The fixed validation documents of each domain (`corpora.corpus.validation_documents`), one
    row per document, labelled by its domain."""
    from routescope.corpora.corpus import validation_documents

    rows = [CorpusRow(f"{d}-{k + 1}", doc if max_chars is None else doc[:max_chars], (d,))
            for d in domains for k, doc in enumerate(validation_documents(d, n_docs))]
    return rows_corpus(f"validation split: {' + '.join(domains)} ({n_docs} documents each)", rows, ["domain"])


def _probe_file(path: Any) -> Callable[[], CorpusData]:
    return lambda: load_corpus(path, label_columns=("domain", "expected_path"))


def _validation(*domains: str) -> Callable[[], CorpusData]:
    return lambda: validation_split(domains)


VALIDATIONS: dict[str, Callable[[], CorpusData]] = {
    "validation split: story + math": _validation("story", "math"),
    "validation split: story": _validation("story"),
    "validation split: math": _validation("math"),
}
VALIDATION_IDS = ("validation", "validation-story", "validation-math")


def shipped_datasets() -> dict[str, Callable[[], CorpusData]]:
    """Shown name -> loader: the probe sets that family specs declare (`ProbeTable.sets`, labelled
    by domain and expected path; the first is the views' default: 20 prompts, instant), then the
    validation splits."""
    probes = {f"{name} probes": _probe_file(path) for t in probe_tables().values() for name, path in t.sets.items()}
    return {**probes, **VALIDATIONS}


def shipped_ids() -> dict[str, str]:
    """Short names for the command line (`routescope corpus --shipped NAME`) -> shown names: a probe
    set's name in lower case without spaces or hyphens, then VALIDATION_IDS."""
    names = list(shipped_datasets())
    probes = names[:len(names) - len(VALIDATIONS)]
    short = [re.sub(r"[\s-]", "", n.removesuffix(" probes").lower()) for n in probes]
    return dict(zip([*short, *VALIDATION_IDS], names))


def shipped(name: str) -> CorpusData:
    """A shipped dataset by its name or short name."""
    ids, datasets = shipped_ids(), shipped_datasets()
    name = ids.get(name, name)
    if name not in datasets:
        raise ValueError(f"no shipped dataset {name!r} (shipped: {', '.join(ids)})")
    return datasets[name]()
