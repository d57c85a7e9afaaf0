"""`routescope drift`: routing drift over one training run's checkpoints, as tables (CSV and Parquet)
and one offline page.

    routescope drift CK1 CK2 ... CKN (--data FILE | --shipped NAME) --out DIR [--sort step]
        [--max-tokens N] [--batch-size N]

Writes into DIR, replaced whole at the end (`OutputSet`: an interrupted run leaves an earlier set as
it was): saturation, utilisation, events, experts (and label_shares, label_specialisation where the
dataset has labels) as `.csv` and `.parquet`, `drift.html` and `drift.json` (provenance). Fewer than
two checkpoints, checkpoints of different shapes, a step `--sort step` cannot read, or a DIR holding
other files: one line, exit 2, before any model runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tqdm import tqdm

from routescope.analysis import drift as DR
from routescope.analysis.corpus import page as P
from routescope.analysis.corpus import shipped as SH
from routescope.analysis.inputs import datasets as D
from routescope.rendering.drift_figures import page  # plotly only, no Streamlit

from . import options as O

PAGE, PROVENANCE = "drift.html", "drift.json"
TABLES = ("saturation", "utilisation", "events", "experts", "label_shares", "label_specialisation")


def _own(name: str) -> bool:
    stem, _, ext = name.rpartition(".")
    return name in (PAGE, PROVENANCE) or (stem in TABLES and ext in P.FORMATS)


def check_out(path: str) -> Path:
    """DIR, new or holding only an earlier drift run's files (it is replaced whole)."""
    out = Path(path)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"{out}: not a directory; --out names a directory for the tables")
    if not out.resolve().parent.is_dir():
        raise ValueError(f"{out}: directory {out.resolve().parent} does not exist")
    if out.is_dir():
        foreign = sorted(e.name for e in os.scandir(out) if not (e.is_file(follow_symlinks=False) and _own(e.name)))
        if foreign:
            raise ValueError(f"{out}: holds {foreign[0]!r}, which no drift run writes; --out is replaced whole: "
                             "give an empty or new directory")
    return out


def run(args: argparse.Namespace) -> int:
    out = check_out(args.out)
    settings = DR.DriftSettings(max_tokens=args.max_tokens, batch_size=args.batch_size, sort=args.sort)
    DR.order_checkpoints(args.checkpoints, args.sort)  # one line for bad input before the dataset is read
    data = SH.shipped(args.shipped) if args.shipped else D.load_corpus(args.data, text_column=args.text_column)
    with tqdm(total=len(args.checkpoints), desc="drift", unit="checkpoint",
              disable=True if args.quiet else None) as bar:
        def progress(done: int, total: int, name: str) -> None:
            bar.set_postfix_str(name)
            bar.update(done - bar.n)

        result = DR.drift(args.checkpoints, data, settings, placement=O.device_kwargs(args), progress=progress)
    with P.OutputSet(out) as built:
        written = P.write_tables(result.tables, built.dir, provenance=result.provenance)
        P.write_file(built.dir / PAGE, page(result.tables, result.provenance).encode("utf-8"))
        P.write_file(built.dir / PROVENANCE, json.dumps({**result.provenance, "tables": sorted(result.tables)},
                                                        indent=1, ensure_ascii=False, default=str).encode("utf-8"))
    sat = result.tables["saturation"]
    first = sat[sat["checkpoint"] == result.checkpoints[0]]["overlap_final"]
    sys.stderr.write(f"wrote {len(written) + 2} files to {out} ({len(result.checkpoints)} checkpoints, "
                     f"{result.provenance['tokens']:,} tokens; {result.checkpoints[0]} agrees with "
                     f"{result.checkpoints[-1]} on {first.mean():.1%} of top-{result.provenance['top_k']} choices "
                     f"over its layers)\n")
    return 0
