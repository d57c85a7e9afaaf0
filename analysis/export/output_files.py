"""Where an export writes: the output path checked before any work (`check_output`, its format by
suffix), hidden temporary files beside the target, locked while in use and renamed into place when
done (`new_temporary`), and the removal of those a killed run left (`remove_stale_temporaries`).
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets

try:
    import fcntl
except ImportError:  # not on Windows: temporaries are still cleaned on errors and interrupts, not after a kill
    fcntl = None  # type: ignore[assignment]
from pathlib import Path
from typing import Iterator

CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")


def export_format(path: str | os.PathLike) -> str:
    """"csv" or "parquet" from the file suffix; ValueError otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix in CSV_SUFFIXES:
        return "csv"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise ValueError(f"{path}: unknown export format {suffix or '(no suffix)'!r}; use .csv or .parquet")


def check_output(path: str | os.PathLike) -> Path:
    """ValueError unless `path` can take an export: a known suffix, not a directory, inside an
    existing directory this process may write to. Checked before any work, so a long export never
    fails at its end; directories are never created."""
    p = Path(path)
    parent = p.parent
    if p.is_dir():
        raise ValueError(f"{p}: is a directory; give a file name, e.g. {p / 'routes.csv'}")
    export_format(p)
    if p.exists() and not p.is_file():
        raise ValueError(f"{p}: exists and is not a regular file")
    if not parent.exists():
        raise ValueError(f"{p}: directory {parent} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{p}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{p}: cannot write to directory {parent} (permission denied)")
    return p


_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{12}\.tmp")  # ".<target name>.<12 hex>.tmp", beside the target


def temporary_name(path: Path) -> Path:
    """A fresh name for a hidden temporary file beside `path` (`.<name>.<12 hex digits>.tmp`)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def new_temporary(path: Path) -> tuple[Path, int]:
    """Create an empty hidden temporary file beside `path`, with the mode any new file gets there
    (0o666 & ~umask; tempfile.mkstemp would make it 0o600, so the renamed output does too), and
    hold an exclusive lock on it: (its path, the locked descriptor). While the descriptor is open
    the file is in use; the lock goes with the process however it ends (SIGKILL included), which
    is how `remove_stale_temporaries` tells a live writer's file from one a killed run left."""
    for _ in range(100):
        tmp = temporary_name(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a brand-new file: nobody else holds it
        return tmp, fd
    raise FileExistsError(f"no free temporary name beside {path}")


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files an interrupted run left beside `path` (`new_temporary`'s names
    for this target whose lock nobody holds: their writer is gone); the deleted paths. A file
    another process is still writing is left alone. Without file locks (no fcntl) nothing is
    deleted."""
    path = Path(path)
    if fcntl is None:
        return []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return []
    removed = []
    for entry in entries:
        m = _TEMPORARY.fullmatch(entry.name)
        if not m or m["name"] != path.name or not entry.is_file(follow_symlinks=False):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(fd), os.stat(entry.path, follow_symlinks=False)):  # not renamed meanwhile
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:  # locked (a live writer), gone, or not ours to delete
            pass
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def naming(target: Path) -> Iterator[None]:
    """Report an OS error while writing `target` (or its temporary file) as a ValueError naming target."""
    try:
        yield
    except OSError as e:
        raise ValueError(f"{target}: cannot write ({e.strerror or e})") from None
