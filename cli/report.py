"""`routescope report`: one self-contained HTML routing report of any checkpoint: the corpus view's
page over each domain's validation split (analysis.reports.report: utilisation, routes by domain, token
specialisation, co-routing, or per-call values for a family without per-token routes), routing
accuracy on the probe prompts the family's spec declares, the effect of dropping each option on each
domain's validation loss)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from routescope.analysis.export.output_files import new_temporary, remove_stale_temporaries
from routescope.analysis.reports.report import collect
from routescope.rendering.corpus_report import report_page  # the drawer table (plotly, no Streamlit)

from .common import load_with_tokenizer


def check_html_output(path: str) -> Path:
    """The output path, or ValueError naming the problem (checked before any work)."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p}: is a directory; give a file name, e.g. {p / 'report.html'}")
    if p.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"{p}: the report is an HTML page; give a name ending in .html")
    if p.exists() and not p.is_file():
        raise ValueError(f"{p}: exists and is not a regular file")
    parent = p.parent
    if not parent.is_dir():
        raise ValueError(f"{p}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{p}: cannot write to directory {parent} (permission denied)")
    return p


def write_atomically(path: Path, text: str) -> bool:
    """Write `text` to a hidden temporary file beside `path` and rename it into place: a failed or
    interrupted write leaves `path` as it was, and temporaries a killed run left are deleted first
    (analysis.export.output_files's temporaries). The file gets the mode the umask gives new files. Whether an
    existing file was replaced."""
    remove_stale_temporaries(path)
    tmp, lock = new_temporary(path)
    try:
        with os.fdopen(os.dup(lock), "w", encoding="utf-8") as f:  # the file created, never a name looked up again
            f.write(text)
        existed = path.exists()
        os.replace(tmp, path)
        return existed
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(lock)


def run(args: argparse.Namespace) -> int:
    out = check_html_output(args.out)
    model, tok = load_with_tokenizer(args.checkpoint)
    data = collect(model, tok, name=Path(args.checkpoint).resolve().name, n_docs=args.docs, seq_len=args.seq_len,
                   min_count=args.min_count, top=args.top)
    for tmp in remove_stale_temporaries(out):
        sys.stderr.write(f"note: removed {tmp}, left by a report that was killed\n")
    replaced = write_atomically(out, report_page(data))
    sys.stderr.write(f"wrote {out}{' (replaced the existing file)' if replaced else ''}\n")
    return 0
