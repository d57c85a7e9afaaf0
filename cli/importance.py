"""`routescope importance`: which experts matter on a dataset, as tables (CSV and Parquet), one
offline page, and optionally a pruned checkpoint.

    routescope importance CHECKPOINT --data FILE --out DIR [--layers L,L] [--options 0,3]
        [--max-tokens N] [--engine ray] [--prune N --prune-out DIR]

Writes into DIR (made if missing; files of the same names are replaced): importance, control,
control_summary, proxies, proxy_agreement, pruning and pruning_curve as `.csv` and `.parquet`,
`importance.html` (the page) and `importance.json` (provenance). The dataset, the layers and
options, and --prune are checked before the sweep: bad input is one line (exit 2) and nothing is
written. Measured rows are kept in DIR/.importance-cache while the sweep runs: an interrupted run
writes no table, and the same command again resumes where it stopped.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from routescope.analysis.corpus import page as P
from routescope.analysis.corpus.run import encode_head
from routescope.analysis.export.batch import weights_sha256
from routescope.analysis.inputs import datasets as D
from routescope.analysis.reports import importance as I
from routescope.analysis.reports import prune as PR
from routescope.rendering.importance_report import page  # plotly only, no Streamlit

from . import options as O
from .common import load_with_tokenizer


def _list(spec: str | None, what: str, as_int: bool = False):
    if spec is None:
        return None
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise ValueError(f"--{what} {spec!r}: empty")
    if as_int:
        bad = [s for s in items if not s.isascii() or not s.isdigit()]
        if bad:
            raise ValueError(f"--{what}: {bad[0]!r} is not an option number (0-based)")
        return tuple(int(s) for s in items)
    return tuple(items)


def run(args: argparse.Namespace) -> int:
    if (args.prune is None) != (args.prune_out is None):
        raise ValueError("--prune N and --prune-out DIR go together")
    settings = I.ImportanceSettings(layers=_list(args.layers, "layers"), options=_list(args.options, "options", True),
                                    max_tokens=args.max_tokens, batch_size=args.batch_size, control_draws=args.draws,
                                    prune_draws=args.draws, method=args.method, float32=not args.model_dtype)
    out = P.check_out_dir(args.out)
    prune_out = PR.check_prune_out(args.prune_out) if args.prune is not None else None
    if args.prune is not None and (settings.layers or settings.options):
        raise ValueError("--prune ranks every expert of every layer: leave out --layers and --options")
    data = D.load_corpus(args.data, text_column=args.text_column)
    model, tok = load_with_tokenizer(args.checkpoint, **O.device_kwargs(args))
    I.scope_of(model, settings.layers, settings.options)  # bad layers / options: one line before any work
    if args.prune is not None:
        PR.check_prunable(model, args.prune)
    name = Path(args.checkpoint).resolve().name
    out.mkdir(exist_ok=True)
    with tqdm(total=1, desc=name, unit="row", disable=True if args.quiet else None) as bar:
        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        result = I.importance(model, tok, data, settings, name=name, weights_sha256=weights_sha256(args.checkpoint),
                              cache_dir=out / ".importance-cache", progress=progress, engine=args.engine,
                              checkpoint=args.checkpoint, workers=args.workers)
    written = P.write_tables(result.tables, out)
    P.write_file(out / "importance.html", page(result.tables, result.provenance, result.notes).encode("utf-8"))
    doc = {**result.provenance, "tables": sorted(result.tables), "notes": result.notes}
    P.write_file(out / "importance.json", json.dumps(doc, indent=1, ensure_ascii=False, default=str).encode("utf-8"))
    msg = f"wrote {len(written) + 2} files to {out} ({result.provenance['rows']:,} rows, " \
          f"{result.provenance['tokens']:,} tokens, {len(result['importance']):,} options)"
    if args.prune is not None:
        scope = I.scope_of(model, None, None)
        order = I.ranked(result["importance"], scope, "delta_nll")
        drop = {l: sorted(os_[:args.prune]) for l, os_ in order.items()}
        base, loss = I.dataset_loss(model, tok, data, settings, I.pruning_ablation(order, args.prune))
        diff = PR.write_pruned(model, Path(args.checkpoint) / "tokenizer.json", drop, prune_out, model_name=name,
                               provenance=result.provenance, loss=loss, prompt_ids=_prompt(tok, data, model.context))
        msg += f"; pruned checkpoint in {prune_out} (loss {base:.4f} -> {loss:.4f}, logits within {diff:.2g})"
    sys.stderr.write(msg + "\n")
    return 0


def _prompt(tok, data, context: int) -> list[int]:
    """The test prompt of the pruned checkpoint: the dataset's first row (up to 64 tokens)."""
    first = next(iter(data))
    return encode_head(tok, first.text, min(64, context)) or [0]
