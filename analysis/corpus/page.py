"""Corpus tables out of the process: CSV / Parquet bytes and files, and one offline HTML page.

CSV is written by the project's one CSV writer (`export.frame_csv_bytes`: text escaped, formulas
neutralised); Parquet by pyarrow with the frame's own dtypes. One run's files (its tables, page
and JSON) are an output set, replaced whole (`OutputSet`): they are written into a fresh hidden
directory beside the output directory, created exclusively under an unpredictable name, and that
directory is then swapped with the old one in one rename; an interrupted or failed run leaves the
previous set as it was, and a finished one leaves no file of an earlier set. No path is followed
through a symbolic link. `render_page` is the corpus view as one self-contained page: headings, the
figures the app draws (handed in, drawn by the drawer table), the tables (the first PAGE_ROWS rows
of each; the files have all), and every table as JSON ({"columns", "data"}: rows as lists) in
<script type="application/json" id="corpus-data">. plotly.js is embedded once; nothing is fetched. Every string from the data is
escaped for where it goes (`analysis.export.html_safe`), and element ids are generated, never data.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import io
import json
import math
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from routescope.analysis.export.csv_format import frame_csv_bytes
from routescope.analysis.export.output_files import new_temporary
from routescope.analysis.export.table_files import PROVENANCE_KEY, provenance_json
from routescope.analysis.export.html_safe import attr, script_json, text
from routescope.analysis.export.plotly_bundle import script_tag

try:
    import fcntl
except ImportError:  # not on Windows: a killed run's hidden directory is then left for the user
    fcntl = None  # type: ignore[assignment]

FORMATS = ("csv", "parquet")
PAGE_ROWS = 500  # rows of a table shown on the page (its files have all): a 128-expert page stays small

# view name -> (heading, what it shows); compare_<name> views take the heading of <name>
SECTIONS: dict[str, tuple[str, str]] = {
    "summary": ("Dataset and model", "What was run: the checkpoint, the dataset (with its sha256) and the settings."),
    "utilisation": ("Utilisation, dead and overloaded options",
                    "Per routing layer and option: the share of top-k slots it takes (first choices where a layer "
                    "picks one option), the share of first choices and of tokens that pick it anywhere in their top-k. "
                    "Dead: under 1% of the uniform share 1/n; overloaded: over twice the uniform share. Padding "
                    "never counts; tokens whose route is undefined are left out."),
    "label_shares": ("Routes by label",
                     "Per label column and value: the share of its routes taking each option, over every token and "
                     "at each row's last token (how a paper's probe table reads a prompt's route)."),
    "accuracy": ("Accuracy against intended options",
                 "Where a label value maps to an intended option (expected_path: 1-based, route r = option r - 1; "
                 "expected_option: 0-based; or given), the share of its routes that take it, per layer and over all "
                 "layers."),
    "specialisation": ("Token specialisation",
                       "Per layer and option, the tokens most over-represented among those whose first choice it is, "
                       "by input token and by the model's predicted next token: count, the share of the token's "
                       "occurrences routed there, lift = that share / the option's share, and Dunning's G2 with its "
                       "chi-square (1 dof) p-value."),
    "co_routing": ("Co-routing across layers",
                   "Tokens routed to option a at an earlier layer and b at a later one: their share of the tokens "
                   "defined at both, and P(b | a)."),
    "call_values": ("Per-call values (no per-token routes)",
                    "This family routes no token to an option: shown are the values its family exports, per call "
                    "(learned weights, pathway scales: the same for every prompt unless ablated) and per token "
                    "(contribution shares, gates), with mean, standard deviation, range and the share of rows where "
                    "an option was the selected (largest) one."),
}


# --- files ---------------------------------------------------------------------------------------------

def frame_bytes(df: pd.DataFrame, fmt: str, provenance: dict | None = None) -> bytes:
    """A table as CSV (the one CSV writer) or Parquet bytes; `provenance` goes into the Parquet file's
    metadata under the export's key (`analysis.export.table_files.read_provenance` reads it)."""
    if fmt == "csv":
        return frame_csv_bytes(df)
    if fmt == "parquet":
        table = pa.Table.from_pandas(df.rename(columns=str), preserve_index=False)
        if provenance is not None:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                   PROVENANCE_KEY: provenance_json(provenance)})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue()
    raise ValueError(f"unknown table format {fmt!r}; use {', '.join(FORMATS)}")


PAGE, PROVENANCE = "corpus.html", "corpus.json"
_SET_FILE = re.compile(r"(compare_)?[a-z_]+\.(csv|parquet)")  # the tables' names; with PAGE and PROVENANCE: a set


def is_set_file(name: str) -> bool:
    """Whether a file name is one an output set writes (what an existing output directory may hold)."""
    return name in (PAGE, PROVENANCE) or bool(_SET_FILE.fullmatch(name))


def check_out_dir(path: str | os.PathLike) -> Path:
    """The output directory (need not exist; its parent must), or ValueError naming the problem;
    checked before any work. It is replaced whole, so it may hold only an earlier output set's files
    (`is_set_file`), and it is never a symbolic link (none is followed)."""
    p = Path(path)
    if p.name in ("", ".."):  # "." or "..": the set is swapped by name, so name the directory
        p = Path(os.path.abspath(p))
    if p.is_symlink():
        raise ValueError(f"{p}: is a symbolic link{' to nothing' if not p.exists() else ''}; --out is replaced whole "
                         "and no link is followed: give the directory itself")
    if p.exists() and not p.is_dir():
        raise ValueError(f"{p}: exists and is not a directory; --out names a directory for the tables")
    parent = p.parent
    if not parent.is_dir():
        raise ValueError(f"{p}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{p}: cannot write in {parent} (permission denied); the output set is built beside --out")
    if p.exists():
        if not os.access(p, os.R_OK | os.W_OK | os.X_OK):
            raise ValueError(f"{p}: cannot write to the directory (permission denied)")
        foreign = sorted(e.name for e in os.scandir(p) if not (e.is_file(follow_symlinks=False) and is_set_file(e.name)))
        if foreign:
            raise ValueError(f"{p}: holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} that no output set "
                             f"writes (e.g. {foreign[0]!r}); --out is replaced whole: give an empty or new directory")
    return p


def write_file(path: Path, data: bytes) -> None:
    """`data` to a hidden temporary beside `path` (created exclusively under an unpredictable name:
    never an existing file or link), renamed into place (mode: the umask's)."""
    tmp, fd = new_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_PART = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{12}\.part")  # an output set being built beside its directory
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries in one step (Linux renameat2 RENAME_EXCHANGE); False where the
    system has no such call (the caller then renames in two steps)."""
    libc_name = ctypes.util.find_library("c")
    fn = getattr(ctypes.CDLL(libc_name, use_errno=True), "renameat2", None) if libc_name else None
    if fn is None:
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err), str(b))


class OutputSet:
    """Build one run's files in `dir` (a fresh hidden directory beside `out`, mode 0700 while it is
    built), then on a clean exit put it in place of `out` whole; on an error or interrupt delete
    it, leaving `out` as it was. `replaced`: how many files the earlier set had. A directory a
    killed run left is deleted on the next run into the same `out` (its lock is free)."""

    def __init__(self, out: Path) -> None:
        self.out, self.replaced = out, 0
        self.removed_stale = _remove_stale_parts(out)
        for _ in range(100):
            self.dir = out.with_name(f".{out.name}.{secrets.token_hex(6)}.part")
            try:
                os.mkdir(self.dir, 0o700)  # exclusive: fails on anything already there, a link included
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free temporary name beside {out}")
        self._lock = os.open(self.dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
        if fcntl is not None:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def __enter__(self) -> "OutputSet":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._swap()
            else:
                shutil.rmtree(self.dir, ignore_errors=True)
        finally:
            os.close(self._lock)

    def _swap(self) -> None:
        umask = os.umask(0)
        os.umask(umask)
        old = os.lstat(self.out) if os.path.lexists(self.out) else None
        if old is not None and not stat.S_ISDIR(old.st_mode):
            raise ValueError(f"{self.out}: was replaced by something that is not a directory while the run went on")
        os.chmod(self.dir, stat.S_IMODE(old.st_mode) if old is not None else 0o777 & ~umask)
        if old is None:
            os.rename(self.dir, self.out)
            return
        self.replaced = sum(1 for e in os.scandir(self.out) if e.is_file(follow_symlinks=False))
        if not _exchange(self.dir, self.out):  # two renames: `out` is briefly absent, never half-written
            aside = self.dir.with_name(self.dir.name + "-old")
            os.rename(self.out, aside)
            os.rename(self.dir, self.out)
            self.dir = aside
        shutil.rmtree(self.dir, ignore_errors=True)  # the earlier set, now under the hidden name


def _remove_stale_parts(out: Path) -> list[Path]:
    """Hidden output-set directories a killed run left beside `out` (nobody holds their lock)."""
    if fcntl is None:
        return []
    removed = []
    try:
        entries = list(os.scandir(out.parent))
    except OSError:
        return []
    for e in entries:
        m = _PART.fullmatch(e.name.removesuffix("-old"))
        if not m or m["name"] != out.name or not e.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(e.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(e.path)
            removed.append(Path(e.path))
        except OSError:  # a live run's, or not ours to delete
            pass
        finally:
            os.close(fd)
    return removed


def write_tables(tables: Mapping[str, pd.DataFrame], out: Path, formats: Sequence[str] = FORMATS,
                 provenance: dict | None = None) -> list[Path]:
    """Every table as `<name>.<fmt>` in directory `out` (an `OutputSet`'s; Parquet with `provenance`);
    the paths written."""
    written = []
    for name, df in tables.items():
        for fmt in formats:
            path = out / f"{name}.{fmt}"
            try:
                write_file(path, frame_bytes(df, fmt, provenance))
            except OSError as e:
                raise ValueError(f"{path}: cannot write ({e.strerror or e})") from None
            written.append(path)
    return written


# --- the page ------------------------------------------------------------------------------------------

def _fmt(v: Any) -> str:
    if v is None or v is pd.NA or (isinstance(v, (float, np.floating)) and math.isnan(v)):
        return ""
    if isinstance(v, (float, np.floating)):
        return f"{v:.4g}" if abs(v) >= 1e4 or (v and abs(v) < 1e-3) else f"{v:.3f}"
    return str(v)


def html_table(df: pd.DataFrame, rows: int = PAGE_ROWS) -> str:
    """An escaped HTML table of the first `rows` rows (a note says how many more the files have)."""
    helps = df.attrs.get("help", {})  # a column's help as its heading's tooltip
    head = "".join(f'<th title="{attr(helps[c])}">{text(c)}</th>' if c in helps else f"<th>{text(c)}</th>"
                   for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{text(_fmt(v))}</td>" for v in r) + "</tr>"
                   for r in df.head(rows).itertuples(index=False))
    more = f"<p class='more'>{len(df) - rows:,} more rows in the table's CSV / Parquet file.</p>" if len(df) > rows else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _records(df: pd.DataFrame) -> dict:
    """A table as {"columns": [...], "data": [[row], ...]} (column names once, not per row: half the
    bytes of records), floats to 6 significant digits (the files keep full precision)."""
    return json.loads(df.to_json(orient="split", index=False, force_ascii=False, double_precision=6))


_STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}table{border-collapse:collapse;"
          "margin:.5em 0 1.5em;display:block;max-height:520px;overflow:auto}td,th{border:1px solid #ccc;padding:2px 6px;"
          "font-size:12px;text-align:right}th{background:#f3f3f3;position:sticky;top:0}.more,.note{color:#555}")


def render_page(*, title: str, intro: str, pieces: Mapping[str, Mapping[str, Any]], tables: Mapping[str, pd.DataFrame],
                notes: Sequence[str] = (), extra: Sequence[tuple[str, str, str]] = (),
                meta: Mapping[str, Any] | None = None) -> str:
    """The page: `pieces` per view name (figures and tables as the drawer table drew them, in
    order), `tables` (every view's frame, embedded as JSON), `extra` sections (id, heading, HTML)
    after them, `intro` HTML under the title (escaped by its maker). plotly.js is inlined with the
    first figure only. Figures get ids fig-1, fig-2, ...: plotly writes the id into a script."""
    esc = text
    parts, first, n_fig = [], True, 0
    for view, drawn in pieces.items():
        base = view.removeprefix("compare_")
        heading, about = SECTIONS.get(base, (base.replace("_", " ").capitalize(), ""))
        if view.startswith("compare_"):
            heading, about = f"Compared: {heading.lower()}", "Both models side by side, each column named by its " \
                                                             "model, and the difference (the second minus the first)."
        parts.append(f'<h2 id="{attr(view)}">{esc(heading)}</h2><p>{esc(about)}</p>')
        for piece in drawn.values():
            if isinstance(piece, pd.DataFrame):
                parts.append(html_table(piece))
            else:
                n_fig += 1
                if first:
                    parts.append(script_tag())  # plotly.js once, before the first figure
                parts.append(piece.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{n_fig}"))
                first = False
    for sid, heading, body in extra:
        parts.append(f'<h2 id="{attr(sid)}">{esc(heading)}</h2>{body}')
    doc = {"meta": dict(meta or {}), "tables": {k: _records(v) for k, v in tables.items()}}
    data = script_json(doc, ensure_ascii=False, allow_nan=False, default=str)
    note_html = "".join(f"<p class='note'>{esc(n)}</p>" for n in notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title><style>{_STYLE}</style></head><body>
<h1>{esc(title)}</h1>
{intro}
{note_html}
{''.join(parts)}
<script type="application/json" id="corpus-data">{data}</script>
</body></html>
"""
