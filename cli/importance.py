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

from . import options as O
from .common import load_with_tokenizer


def add(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("importance", help="causal importance of every expert over a dataset (tables, offline page, "
                                          "pruned checkpoint)",
                       description="Drop each routing option alone over a dataset, teacher-forced: the change in "
                                   "next-token NLL (with a bootstrap interval), KL, top-1 flips and usage, beside a "
                                   "random-expert control, cheap proxies and pruning curves.")
    c.add_argument("checkpoint")
    c.add_argument("--data", required=True, metavar="FILE", help=".txt (one text per line), or .tsv / .csv / .jsonl "
                                                                  "/ .parquet with a text (or prompt) column")
    c.add_argument("--out", required=True, metavar="DIR", help="directory for the tables and importance.html (made "
                                                                "if missing)")
    c.add_argument("--text-column", metavar="NAME", help="the text column (default: text, else prompt)")
    c.add_argument("--layers", metavar="LAYER,LAYER", help="routing layers to measure (default: all)")
    c.add_argument("--options", metavar="N,N", help="options (experts) to measure, 0-based (default: all)")
    c.add_argument("--max-tokens", type=O.positive_int, default=None,
                   help="tokens taken from the dataset in row order (default: all)")
    c.add_argument("--batch-size", type=O.positive_int, default=8, help="rows per forward")
    c.add_argument("--draws", type=O.positive_int, default=8, help="random draws of the control and of the random "
                                                                   "pruning ranking")
    c.add_argument("--method", choices=("fast", "naive"), default="fast",
                   help="fast: prefix reuse and many ablations per forward where the model allows; naive: one full "
                        "forward per ablation (the same numbers)")
    c.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="ray: chunks of the sweep on Ray workers (a local cluster, or the one in RAY_ADDRESS); the "
                        "same numbers as one process")
    c.add_argument("--workers", type=O.positive_int, default=2, help="Ray workers (--engine ray)")
    c.add_argument("--model-dtype", action="store_true",
                   help="measure in the dtype the model runs in (default: a float32 copy: in bfloat16 rounding alone "
                        "moves log p by about as much as a single expert's effect)")
    c.add_argument("--prune", type=O.positive_int, metavar="N",
                   help="write a checkpoint without the N least important experts of every MoE layer (--prune-out)")
    c.add_argument("--prune-out", metavar="DIR", help="the pruned checkpoint's directory (new or empty)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    O.add_device_options(c)
    c.set_defaults(func=run)


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
    from tqdm import tqdm

    from routescope.analysis.inputs import datasets as D
    from routescope.analysis.corpus import page as P
    from routescope.analysis.reports import importance as I
    from routescope.analysis.reports import prune as PR
    from routescope.analysis.export.batch import weights_sha256

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
    from routescope.rendering.importance_report import page  # plotly only, no Streamlit

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
    from routescope.analysis.corpus.run import encode_head

    first = next(iter(data))
    return encode_head(tok, first.text, min(64, context)) or [0]
