"""Prompt lists for the export: (prompt_id, prompt) pairs from the text of a prompt file.

.txt: one prompt per line; blank (whitespace-only) lines are skipped; prompt_id = the 1-based line
number. Lines end at "\\n" only (a trailing "\\r" is dropped), never at U+2028 and the other
characters `str.splitlines` breaks on: they are text. .tsv: a header naming the columns prompt_id
and prompt (others ignored), one record per line, no quoting; blank lines skipped; ids unique.

Both engines of `routescope export` parse prompt files here, so a prompt keeps its id whichever
engine ran it (the Ray engine reads the bytes with Ray Data, then calls `parse_prompts`).
"""
from __future__ import annotations

from collections import Counter

TEXT_SUFFIXES = (".txt", ".tsv")


class TokenText:
    """Token id -> its decoded text, cached (the export's `token` column)."""

    def __init__(self, tok) -> None:
        self.tok, self.cache = tok, {}

    def __call__(self, ids) -> list[str]:
        return [self.cache.setdefault(i, self.tok.decode([i])) for i in ids]


def decode_text(data: bytes, where: object, what: str = "prompt file") -> str:
    """UTF-8 text of a file's bytes (a leading byte order mark dropped); ValueError naming `where`
    with the line and byte offset of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{where}: line {line} (byte offset {e.start}) is not UTF-8 text ({e.reason}); "
                         f"save the {what} as UTF-8") from None


def parse_prompts(text: str, where: object, suffix: str) -> list[tuple[str, str]]:
    """(prompt_id, prompt) pairs of a .txt or .tsv prompt file's text (module doc)."""
    suffix = suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        raise ValueError(f"{where}: prompt files are .txt (one prompt per line) or .tsv (prompt_id, prompt)")
    lines = [line.removesuffix("\r") for line in text.split("\n")]  # not splitlines: U+2028 & co. are text
    if suffix == ".txt":
        return [(str(n), line) for n, line in enumerate(lines, start=1) if line.strip()]
    rows = [line.split("\t") for line in lines]  # no quoting: a field holds no tab
    header = rows[0] if rows else []
    missing = [c for c in ("prompt_id", "prompt") if c not in header]
    if missing:
        raise ValueError(f"{where}: missing column(s) {', '.join(missing)}; found: {', '.join(header) or 'none'}")
    i_id, i_p = header.index("prompt_id"), header.index("prompt")
    out = []
    for n, row in enumerate(rows[1:], start=2):
        if not any(row):
            continue
        if len(row) != len(header):
            raise ValueError(f"{where}: line {n} has {len(row)} fields, the header has {len(header)}")
        out.append((row[i_id], row[i_p]))
    check_unique_ids([pid for pid, _ in out], where)
    return out


def check_unique_ids(ids: list[str], where: object) -> None:
    dup = sorted(i for i, k in Counter(ids).items() if k > 1)
    if dup:
        shown = ", ".join(dup[:10]) + (f" and {len(dup) - 10} more" if len(dup) > 10 else "")
        raise ValueError(f"{where}: duplicate prompt_id(s) {shown}")
