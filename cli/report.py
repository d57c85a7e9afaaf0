"""`routescope report`: one self-contained HTML routing report of a checkpoint with per-token routes,
PaPaformer or MoEP (analysis.report: route shares by domain, Table 6 and held-out accuracy for
PaPaformer, route-selective tokens, the effect of dropping each option on each domain's validation
loss)."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from . import options as O
from .common import load_with_tokenizer


def add(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("report", help="HTML routing report of a PaPaformer or MoEP checkpoint (plotly, offline)",
                       description="Write one self-contained HTML page: route shares by domain, routing accuracy "
                                   "on the Table 6 and held-out probes (PaPaformer), route-selective tokens, and "
                                   "each domain's validation loss with each path, block or expert dropped.")
    r.add_argument("checkpoint")
    r.add_argument("--out", required=True, metavar="FILE.html")
    r.add_argument("--docs", type=O.positive_int, default=100,
                   help="validation documents per domain (default 100: the trainer's validation text)")
    r.add_argument("--seq-len", type=O.positive_int, default=256, help="tokens per validation row (default 256)")
    r.add_argument("--top", type=O.positive_int, default=10, help="route-selective tokens per layer")
    r.add_argument("--min-count", type=O.positive_int, default=5,
                   help="occurrences a token needs to be ranked as route-selective")
    r.set_defaults(func=run)


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


def write_atomically(path: Path, text: str) -> None:
    """Write `text` beside `path` and rename it into place: a failed write leaves `path` as it was.
    The file gets the mode the umask gives new files."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> int:
    from routescope.analysis.report import collect, render_html, route_reader

    out = check_html_output(args.out)
    model, tok = load_with_tokenizer(args.checkpoint)
    route_reader(model)  # a family without per-token routes is refused before any work
    data = collect(model, tok, name=Path(args.checkpoint).resolve().name, n_docs=args.docs, seq_len=args.seq_len,
                   min_count=args.min_count, top=args.top)
    write_atomically(out, render_html(data))
    sys.stderr.write(f"wrote {out}\n")
    return 0
