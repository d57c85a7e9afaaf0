"""Prompts: the one rule for what counts as a prompt (the CLI and the app both ask `prompt_problem`),
and prompt files as (prompt_id, prompt) pairs.

.txt: one prompt per line; blank (whitespace-only) lines are skipped; prompt_id = the 1-based line
number. Lines end at "\\n" only (a trailing "\\r" is dropped), never at U+2028 and the other
characters `str.splitlines` breaks on: they are text. .tsv: a header naming the columns prompt_id
and prompt (others ignored), one record per line, no quoting; blank lines skipped; ids unique; a
record whose prompt is blank is refused (a blank prompt is no prompt, as on the command line).

Limits (`files.MAX_LINE_BYTES`, `files.MAX_PROMPT_FILE_BYTES`): a prompt file is read line by line,
never whole, so a line longer than 1 MiB is refused after reading that much (no model here reads a
prompt that long: the export keeps the last `context` tokens), and a file larger than 64 MiB is
refused before any of it is read (the single-process export holds every prompt; for more, split the
file or use `--engine ray` with .jsonl/.parquet). A path that is not a regular file is refused
without waiting on it (`files.open_regular_file`).

Both engines of `routescope export` parse prompt files here, so a prompt keeps its id whichever
engine ran it (the Ray engine reads the bytes with Ray Data, then calls `parse_prompt_bytes`).
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator

from routescope.analysis.inputs.files import (MAX_LINE_BYTES, MAX_PROMPT_FILE_BYTES, decode_text, iter_lines,
                                              open_regular_file, size_text)

TEXT_SUFFIXES = (".txt", ".tsv")


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
            raise ValueError(f"{where}: line {n} is longer than {size_text(MAX_LINE_BYTES)}, the limit for one line "
                             f"of a prompt file")
    return list(parse_prompt_lines(enumerate(lines, start=1), where, suffix))


def parse_prompt_bytes(data: bytes, where: object, suffix: str) -> list[tuple[str, str]]:
    """(prompt_id, prompt) pairs of a .txt or .tsv prompt file's bytes (`decode_text`, then
    `parse_prompts`): what the Ray export calls on each file Ray Data read."""
    return parse_prompts(decode_text(data, where), where, suffix)


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
