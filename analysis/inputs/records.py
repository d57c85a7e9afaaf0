"""Dataset files as records: each tabular format (.tsv, .csv, .jsonl, .parquet) read strictly and
streamed, one record at a time, as {column: cell} with where it came from (`datasets` holds the
formats' rules, the limits and the errors; it reads .txt files itself, a line per row).

Memory is bounded in every format: one row (a line of .tsv/.jsonl, a record of .csv, the cells read
from a Parquet row) is at most `files.MAX_LINE_BYTES` (1 MiB); a Parquet file is read in batches of
`PARQUET_BATCH` rows, only the columns used, after its metadata shows no column chunk over
`MAX_PARQUET_CHUNK` uncompressed and none that must hold a cell over 1 MiB.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from routescope.analysis.inputs.files import MAX_LINE_BYTES, MAX_PROMPT_FILE_BYTES, iter_lines, open_regular_file, shown

SUFFIXES = (".txt", ".tsv", ".csv", ".jsonl", ".parquet", ".pq")
TEXT_COLUMNS = ("text", "prompt")  # the text column, in order of preference
MAX_PARQUET_CHUNK = MAX_PROMPT_FILE_BYTES  # uncompressed bytes of one column in one row group (decoded whole)
PARQUET_BATCH = 64  # rows per decoded Parquet batch: at most 64 MiB of cells at 1 MiB a row

# the csv module's field limit (128 Ki characters by default) raised to the one-row limit every format
# shares; a process-wide setting, only ever raised here, never lowered
csv.field_size_limit(max(csv.field_size_limit(), MAX_LINE_BYTES))


def dataset_suffix(name: str) -> str:
    suffix = Path(name).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{name}: unknown dataset format {suffix or '(no suffix)'!r}; use "
                         f"{', '.join(SUFFIXES[:-1])} (one prompt per line, or a text column and label columns)")
    return suffix


def open_binary(source: Any, name: str) -> IO[bytes]:
    """Uploaded bytes, or the file opened as the prompt readers open theirs (a directory, FIFO,
    device or socket refused without waiting on it)."""
    if isinstance(source, bytes):
        return io.BytesIO(source)
    return open_regular_file(source, "dataset file")


def text_lines(f: IO[bytes], name: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its line end); a bad byte is named with its line and
    offset, a line over the prompt readers' 1 MiB limit refused."""
    return iter_lines(f, name, "dataset")


def check_text(value: str, name: str, where: str, what: str) -> str:
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
        check_text(c, name, "header", f"column name {shown(c)!r}")
        if c in seen:
            raise ValueError(f"{name}: header: column {shown(c)!r} appears twice; column names must be unique")
        seen.add(c)
    return list(columns)


Records = Callable[[Sequence[str]], Iterator[tuple[str, dict[str, Any]]]]  # the columns used -> (where, record)


def records(source: Any, name: str, suffix: str) -> tuple[list[str], Records]:
    """(columns, a reader of (where, record) given the columns used) of a tabular file; `where`
    names the record in messages."""
    f = open_binary(source, name)
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
    lines = text_lines(f, name)
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
    lines = text_lines(f, name)
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


def cell(v: Any) -> str | None:
    """A label or id cell as text (None: missing)."""
    if v is None or v == "":
        return None
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False, sort_keys=True)
    return str(v)
