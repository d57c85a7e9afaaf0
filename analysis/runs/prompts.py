"""Prompt lists for the export: (prompt_id, prompt) pairs from the text of a prompt file, and the
one rule for what counts as a prompt (the CLI and the app both ask `prompt_problem`).

.txt: one prompt per line; blank (whitespace-only) lines are skipped; prompt_id = the 1-based line
number. Lines end at "\\n" only (a trailing "\\r" is dropped), never at U+2028 and the other
characters `str.splitlines` breaks on: they are text. .tsv: a header naming the columns prompt_id
and prompt (others ignored), one record per line, no quoting; blank lines skipped; ids unique; a
record whose prompt is blank is refused (a blank prompt is no prompt, as on the command line).

Limits (`MAX_LINE_BYTES`, `MAX_PROMPT_FILE_BYTES`): a prompt file is read line by line, never
whole, so a line longer than 1 MiB is refused after reading that much (no model here reads a
prompt that long: the export keeps the last `context` tokens), and a file larger than 64 MiB is
refused before any of it is read (the single-process export holds every prompt; for more, split the
file or use `--engine ray` with .jsonl/.parquet). A path that is not a regular file (a directory,
a named pipe, a device, a socket) is refused without waiting on it: a FIFO with no writer would
block forever.

Both engines of `routescope export` parse prompt files here, so a prompt keeps its id whichever
engine ran it (the Ray engine reads the bytes with Ray Data, then calls `parse_prompts`).
"""
from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

TEXT_SUFFIXES = (".txt", ".tsv")
MAX_LINE_BYTES = 1 << 20  # 1 MiB per line of a prompt or probe file
MAX_PROMPT_FILE_BYTES = 64 << 20  # 64 MiB per prompt file (the single-process export holds its prompts)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n:,} bytes"


class TokenText:
    """Token id -> its decoded text, cached (the export's `token` column)."""

    def __init__(self, tok) -> None:
        self.tok, self.cache = tok, {}

    def __call__(self, ids) -> list[str]:
        return [self.cache.setdefault(i, self.tok.decode([i])) for i in ids]


def text_problem(text: str, what: str = "the prompt") -> str | None:
    """Why `text` is not text, or None: a lone surrogate (undecodable bytes in a command-line
    argument arrive as U+DC80..DCFF; the tokenizer and every output refuse them)."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            if "\udc80" <= ch <= "\udcff":  # os.fsdecode's surrogateescape of byte 0x80..0xff
                return f"{what} is not UTF-8 text (byte 0x{ord(ch) - 0xdc00:02x} at character {i}); pass it in UTF-8"
            return f"{what} holds a lone surrogate U+{ord(ch):04X} at character {i}, which is not text"
    return None


def prompt_problem(text: object) -> str | None:
    """Why `text` cannot be a prompt, or None: not a string, blank (empty or whitespace only), or
    not text (`text_problem`). The one rule of the CLI (generate, export --prompt, attribute) and
    the app."""
    if not isinstance(text, str):
        return f"the prompt must be text, got {type(text).__name__}"
    if not text.strip():
        return "the prompt is empty (only whitespace): give some text for the model to continue"
    return text_problem(text)


def check_prompt(text: object, where: str = "") -> str:
    """`text` if it is a prompt (`prompt_problem`), else ValueError("<where>: <problem>")."""
    problem = prompt_problem(text)
    if problem:
        raise ValueError(f"{where}: {problem}" if where else problem)
    return text  # type: ignore[return-value]


def decode_text(data: bytes, where: object, what: str = "prompt file") -> str:
    """UTF-8 text of a file's bytes (a leading byte order mark dropped); ValueError naming `where`
    with the line and byte offset of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{where}: line {line} (byte offset {e.start}) is not UTF-8 text ({e.reason}); "
                         f"save the {what} as UTF-8") from None


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular_file(path: str | os.PathLike, what: str, max_bytes: int | None = None) -> BinaryIO:
    """`path` opened for reading in binary, or ValueError naming it: missing, unreadable, not a
    regular file, or (max_bytes) larger than that. Opened without blocking, then checked on the
    open descriptor: a FIFO is refused at once (no writer is waited for), and a path swapped
    between a check and the open cannot slip through."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a {what}") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read the {what} ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
            raise ValueError(f"{path}: is {kind}, not a {what}" if kind.startswith("a ") else
                             f"{path}: is {kind}; give the {what} as a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise ValueError(f"{path}: the {what} is {st.st_size:,} bytes; the limit is {_size(max_bytes)}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def iter_lines(f: BinaryIO, where: object, what: str, *, max_line: int = MAX_LINE_BYTES,
               max_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its line end) of a binary stream, read a line at a time
    and never more than `max_line` + 2 bytes at once: a longer line is refused after reading that
    much, and so is a stream that grows past `max_bytes`. Lines end at b"\\n" (a trailing "\\r" is
    dropped); a leading UTF-8 byte order mark is dropped; bytes that are not UTF-8 are refused
    with their line and byte offset."""
    offset, n = 0, 0
    while True:
        raw = f.readline(max_line + 2)  # + "\r\n": a line of exactly max_line bytes still fits
        if not raw:
            return
        n += 1
        body = raw.removesuffix(b"\n").removesuffix(b"\r")
        if len(body) > max_line:
            raise ValueError(f"{where}: line {n} is longer than {_size(max_line)}, the limit for one line of a {what}")
        if max_bytes is not None and offset + len(raw) > max_bytes:
            raise ValueError(f"{where}: the {what} is larger than {_size(max_bytes)}, the limit")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where}: line {n} (byte offset {offset + e.start}) is not UTF-8 text ({e.reason}); "
                             f"save the {what} as UTF-8") from None
        offset += len(raw)
        yield n, (text.removeprefix("\ufeff") if n == 1 else text)


def read_prompt_file(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(prompt_id, prompt) pairs of a .txt or .tsv prompt file (module doc), read line by line
    within the limits; ValueError naming the file and line for anything it refuses."""
    suffix = Path(path).suffix
    try:
        f = open_regular_file(path, "prompt file", MAX_PROMPT_FILE_BYTES)
    except ValueError as e:
        if "the limit is" in str(e):
            raise ValueError(f"{e} (split it, or give .jsonl/.parquet files to --engine ray)") from None
        raise
    with f:
        _check_suffix(path, suffix)
        return list(parse_prompt_lines(iter_lines(f, path, "prompt file", max_bytes=MAX_PROMPT_FILE_BYTES),
                                       path, suffix))


def _check_suffix(where: object, suffix: str) -> None:
    if suffix.lower() not in TEXT_SUFFIXES:
        raise ValueError(f"{where}: prompt files are .txt (one prompt per line) or .tsv (prompt_id, prompt)")


def parse_prompts(text: str, where: object, suffix: str) -> list[tuple[str, str]]:
    """(prompt_id, prompt) pairs of a .txt or .tsv prompt file's text (module doc); lines over
    MAX_LINE_BYTES are refused as when the file is read line by line."""
    _check_suffix(where, suffix)
    lines = [line.removesuffix("\r") for line in text.split("\n")]  # not splitlines: U+2028 & co. are text
    if lines and lines[-1] == "":
        lines.pop()  # the end of the last line, not a line
    for n, line in enumerate(lines, start=1):
        if len(line) > MAX_LINE_BYTES and len(line.encode("utf-8")) > MAX_LINE_BYTES:
            raise ValueError(f"{where}: line {n} is longer than {_size(MAX_LINE_BYTES)}, the limit for one line "
                             f"of a prompt file")
    return list(parse_prompt_lines(enumerate(lines, start=1), where, suffix))


def parse_prompt_lines(lines: Iterable[tuple[int, str]], where: object, suffix: str) -> Iterator[tuple[str, str]]:
    """(prompt_id, prompt) pairs of numbered lines (`iter_lines`) of a .txt or .tsv prompt file."""
    suffix = suffix.lower()
    _check_suffix(where, suffix)
    if suffix == ".txt":
        for n, line in lines:
            if line.strip():
                yield str(n), line
        return
    header: list[str] | None = None
    i_id = i_p = 0
    seen: set[str] = set()
    for n, line in lines:
        row = line.split("\t")  # no quoting: a field holds no tab
        if header is None:
            header = row
            missing = [c for c in ("prompt_id", "prompt") if c not in header]
            if missing:
                raise ValueError(f"{where}: missing column(s) {', '.join(missing)}; found: {', '.join(header) or 'none'}")
            i_id, i_p = header.index("prompt_id"), header.index("prompt")
            continue
        if not any(row):
            continue
        if len(row) != len(header):
            raise ValueError(f"{where}: line {n} has {len(row)} fields, the header has {len(header)}")
        if not row[i_p].strip():
            raise ValueError(f"{where}: line {n}: the prompt is empty (only whitespace)")
        if row[i_id] in seen:
            raise ValueError(f"{where}: duplicate prompt_id(s) {row[i_id]} (again on line {n})")
        seen.add(row[i_id])
        yield row[i_id], row[i_p]
    if header is None:
        raise ValueError(f"{where}: missing column(s) prompt_id, prompt; found: none")


def check_unique_ids(ids: list[str], where: object) -> None:
    dup = sorted(i for i, k in Counter(ids).items() if k > 1)
    if dup:
        shown = ", ".join(dup[:10]) + (f" and {len(dup) - 10} more" if len(dup) > 10 else "")
        raise ValueError(f"{where}: duplicate prompt_id(s) {shown}")
