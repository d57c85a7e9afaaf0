"""Corpus tables out of the process: CSV / Parquet bytes and files, and one offline HTML page.

CSV is written by the project's one CSV writer (`export.frame_csv_bytes`: text escaped, formulas
neutralised); Parquet by pyarrow with the frame's own dtypes. `write_tables` writes every table
of a run into a directory, each file through a temporary beside it renamed into place, so a
failed run leaves no half-written file. `render_page` is the corpus view as one self-contained
page: headings, the figures the app draws (handed in, drawn by the drawer table), the tables (the
first PAGE_ROWS rows of each; the files have all), and every table as JSON in
<script type="application/json" id="corpus-data">. plotly.js is embedded once; nothing is fetched.
"""
from __future__ import annotations

import html
import io
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from .export import frame_csv_bytes

FORMATS = ("csv", "parquet")
PAGE_ROWS = 2000

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
                     "at each row's last token (the reading of the PaPaformer paper's Table 6)."),
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
    metadata under the export's key (`analysis.export.read_provenance` reads it)."""
    if fmt == "csv":
        return frame_csv_bytes(df)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        from .export import PROVENANCE_KEY, _provenance_json

        table = pa.Table.from_pandas(df.rename(columns=str), preserve_index=False)
        if provenance is not None:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                   PROVENANCE_KEY: _provenance_json(provenance)})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue()
    raise ValueError(f"unknown table format {fmt!r}; use {', '.join(FORMATS)}")


def check_out_dir(path: str | os.PathLike) -> Path:
    """The output directory (made if its parent exists), or ValueError naming the problem; checked
    before any work."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{p}: exists and is not a directory; --out names a directory for the tables")
    if not p.exists():
        if not p.parent.is_dir():
            raise ValueError(f"{p}: directory {p.parent} does not exist")
        if not os.access(p.parent, os.W_OK | os.X_OK):
            raise ValueError(f"{p}: cannot create it in {p.parent} (permission denied)")
    elif not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(f"{p}: cannot write to the directory (permission denied)")
    return p


def write_file(path: Path, data: bytes) -> None:
    """`data` to a hidden temporary beside `path`, renamed into place (mode: the umask's)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_tables(tables: Mapping[str, pd.DataFrame], out: Path, formats: Sequence[str] = FORMATS,
                 provenance: dict | None = None) -> list[Path]:
    """Every table as `<name>.<fmt>` in `out` (made if missing, Parquet with `provenance`); the paths written."""
    out.mkdir(exist_ok=True)
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
    head = "".join(f'<th title="{html.escape(helps[c])}">{html.escape(str(c))}</th>' if c in helps
                   else f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in r) + "</tr>"
                   for r in df.head(rows).itertuples(index=False))
    more = f"<p class='more'>{len(df) - rows:,} more rows in the table's CSV / Parquet file.</p>" if len(df) > rows else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _records(df: pd.DataFrame) -> list[dict]:
    return json.loads(df.to_json(orient="records", force_ascii=False))


_STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}table{border-collapse:collapse;"
          "margin:.5em 0 1.5em;display:block;max-height:520px;overflow:auto}td,th{border:1px solid #ccc;padding:2px 6px;"
          "font-size:12px;text-align:right}th{background:#f3f3f3;position:sticky;top:0}.more,.note{color:#555}")


def render_page(*, title: str, intro: str, pieces: Mapping[str, Mapping[str, Any]], tables: Mapping[str, pd.DataFrame],
                notes: Sequence[str] = (), extra: Sequence[tuple[str, str, str]] = (),
                meta: Mapping[str, Any] | None = None) -> str:
    """The page: `pieces` per view name (figures and tables as the drawer table drew them, in
    order), `tables` (every view's frame, embedded as JSON), `extra` sections (id, heading, HTML)
    after them, `intro` HTML under the title. plotly.js is inlined with the first figure only."""
    esc = html.escape
    parts, first = [], True
    for view, drawn in pieces.items():
        base = view.removeprefix("compare_")
        heading, text = SECTIONS.get(base, (base.replace("_", " ").capitalize(), ""))
        if view.startswith("compare_"):
            heading, text = f"Compared: {heading.lower()}", "Both models side by side, each column named by its " \
                                                             "model, and the difference (the second minus the first)."
        parts.append(f'<h2 id="{esc(view)}">{esc(heading)}</h2><p>{esc(text)}</p>')
        for name, piece in drawn.items():
            if isinstance(piece, pd.DataFrame):
                parts.append(html_table(piece))
            else:
                parts.append(piece.to_html(full_html=False, include_plotlyjs=first, div_id=f"fig-{name}"))
                first = False
    for sid, heading, body in extra:
        parts.append(f'<h2 id="{esc(sid)}">{esc(heading)}</h2>{body}')
    doc = {"meta": dict(meta or {}), "tables": {k: _records(v) for k, v in tables.items()}}
    data = json.dumps(doc, ensure_ascii=False, allow_nan=False, default=str).replace("</", "<\\/")
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
