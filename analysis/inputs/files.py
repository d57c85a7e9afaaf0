"""Opening an input file and reading it line by line within the limits every reader shares, and how a
name or text from a file appears in a message (one line, nothing that drives the terminal).

A path that is not a regular file (a directory, a named pipe, a device, a socket) is refused without
waiting on it: a FIFO with no writer would block forever. A line is read a line at a time, never
whole, so one longer than `MAX_LINE_BYTES` is refused after reading that much.
"""
from __future__ import annotations

import os
import stat
from typing import BinaryIO, Iterator

MAX_LINE_BYTES = 1 << 20  # 1 MiB per line of a prompt, probe or dataset file (and per dataset row)
MAX_PROMPT_FILE_BYTES = 64 << 20  # 64 MiB per prompt file (the single-process export holds its prompts)


def size_text(n: int) -> str:
    """A byte count as a message shows it: whole MiB as such, else bytes."""
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n:,} bytes"


def shown(text: str) -> str:
    """A name from the data as it may appear in a message: control characters, lone surrogates and
    line separators as escapes (a message is one line, and never drives the terminal)."""
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)


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
            raise ValueError(f"{path}: the {what} is {st.st_size:,} bytes; the limit is {size_text(max_bytes)}")
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
            raise ValueError(f"{where}: line {n} is longer than {size_text(max_line)}, the limit for one line of a "
                             f"{what}")
        if max_bytes is not None and offset + len(raw) > max_bytes:
            raise ValueError(f"{where}: the {what} is larger than {size_text(max_bytes)}, the limit")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where}: line {n} (byte offset {offset + e.start}) is not UTF-8 text ({e.reason}); "
                             f"save the {what} as UTF-8") from None
        offset += len(raw)
        yield n, (text.removeprefix("\ufeff") if n == 1 else text)
