"""`routescope importance`: which experts matter on a dataset, as tables (CSV and Parquet), one
offline page, and optionally a pruned checkpoint.

    routescope importance CHECKPOINT --data FILE --out DIR [--layers L,L] [--options 0,3]
        [--method estimate|exact|both] [--confirm N] [--sweep fast|naive]
        [--max-tokens N] [--engine ray] [--prune N --prune-out DIR] [--holdout 0.5] [--in-sample-curve]
        [--merge N [--merge-out DIR]]

Writes into DIR (made if missing; files of the same names are replaced): importance, control,
control_summary, proxies, proxy_agreement, estimate_agreement (--method both), pruning, pruning_curve
(and merge_curve with --merge) as
`.csv` and `.parquet`,
`importance.html` (the page) and `importance.json` (provenance). The dataset, the layers and
options, and --prune are checked before the sweep: bad input is one line (exit 2) and nothing is
written. --prune and --merge rank the experts on part of the rows and judge on the others (--holdout):
under 20 rows they are refused. Measured rows are kept in DIR/.importance-cache while the sweep runs: an interrupted run
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
from routescope.analysis.reports.importance.holdout import split_rows
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
    if args.merge_out is not None and args.merge is None:
        raise ValueError("--merge-out DIR writes the model with --merge N experts merged: give --merge N")
    settings = I.ImportanceSettings(layers=_list(args.layers, "layers"), options=_list(args.options, "options", True),
                                    max_tokens=args.max_tokens, batch_size=args.batch_size, control_draws=args.draws,
                                    prune_draws=args.draws, method=args.method, sweep=args.sweep,
                                    confirm=args.confirm, float32=not args.model_dtype,
                                    holdout=args.holdout, in_sample_curve=args.in_sample_curve,
                                    merge_max=args.merge or 0)
    out = P.check_out_dir(args.out)
    prune_out = PR.check_prune_out(args.prune_out) if args.prune is not None else None
    merge_out = PR.check_prune_out(args.merge_out, "--merge-out") if args.merge_out is not None else None
    if prune_out is not None and merge_out is not None and prune_out.resolve() == merge_out.resolve():
        raise ValueError("--prune-out and --merge-out name the same directory")
    judge = "--prune" if args.prune is not None else "--merge" if args.merge is not None else None
    if judge and (settings.layers or settings.options):
        raise ValueError(f"{judge} ranks every expert of every layer: leave out --layers and --options")
    data = D.load_corpus(args.data, text_column=args.text_column)
    model, tok = load_with_tokenizer(args.checkpoint, **O.device_kwargs(args))
    I.scope_of(model, settings.layers, settings.options)  # bad layers / options: one line before any work
    if args.prune is not None:
        PR.check_prunable(model, args.prune)
    if args.merge is not None:
        PR.check_mergeable(model, args.merge)
    split = None
    if judge:  # ranked on some rows, judged on the others: too few rows is one line before any work
        try:
            split = split_rows(len(I.tokens_of(data, tok, model.context, settings.max_tokens).ids), settings.holdout,
                               settings.seed)
        except ValueError as e:
            raise ValueError(f"{judge}: {e}") from None
    name = Path(args.checkpoint).resolve().name
    out.mkdir(exist_ok=True)
    # rows x passes, fractional within a batch (a report per forward): shown whole
    fmt = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total} rows x passes [{elapsed}<{remaining}]"
    with tqdm(total=1, desc=name, bar_format=fmt, disable=True if args.quiet else None) as bar:
        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        def phase(what: str) -> None:
            bar.set_description_str(f"{name}: {what}")

        result = I.importance(model, tok, data, settings, name=name, weights_sha256=weights_sha256(args.checkpoint),
                              cache_dir=out / ".importance-cache", progress=progress, engine=args.engine,
                              checkpoint=args.checkpoint, workers=args.workers, phase=phase)
    written = P.write_tables(result.tables, out)
    P.write_file(out / "importance.html", page(result.tables, result.provenance, result.notes).encode("utf-8"))
    doc = {**result.provenance, "tables": sorted(result.tables), "notes": result.notes}
    P.write_file(out / "importance.json", json.dumps(doc, indent=1, ensure_ascii=False, default=str).encode("utf-8"))
    msg = f"wrote {len(written) + 2} files to {out} ({result.provenance['rows']:,} rows, " \
          f"{result.provenance['tokens']:,} tokens, {len(result['importance']):,} options)"
    hold = result.provenance["holdout"]
    prompt = _prompt(tok, data, model.context)
    if args.prune is not None:
        order = hold["causal_order"]  # ranked on the ranking rows only
        drop = {l: sorted(os_[:args.prune]) for l, os_ in order.items()}
        losses = I.dataset_loss(model, tok, data, settings, I.pruning_ablation(order, args.prune), rows=split.heldout)
        diff = PR.write_pruned(model, Path(args.checkpoint) / "tokenizer.json", drop, prune_out, model_name=name,
                               provenance=result.provenance, losses=losses, prompt_ids=prompt)
        msg += f"; pruned checkpoint in {prune_out} (held-out loss {losses[0]:.4f} -> {losses[1]:.4f}, logits " \
               f"within {diff:.2g})"
    if merge_out is not None:
        into = {l: {int(d): t for d, t in p.items()} for l, p in hold["merge"]["plans"][str(args.merge)].items()}
        curve = result["merge_curve"].set_index(["strategy", "n_removed"])["loss"]
        losses = (float(curve[("merge", 0)]), float(curve[("merge", args.merge)]))
        merged = model.merged_copy(into, hold["merge"]["usage"])
        diff = PR.write_pruned(merged, Path(args.checkpoint) / "tokenizer.json", {l: sorted(p) for l, p in into.items()},
                               merge_out, model_name=name, provenance=result.provenance, losses=losses,
                               prompt_ids=prompt, into=into)
        msg += f"; merged checkpoint in {merge_out} (held-out loss {losses[0]:.4f} -> {losses[1]:.4f}, logits " \
               f"within {diff:.2g})"
    sys.stderr.write(msg + "\n")
    return 0


def _prompt(tok, data, context: int) -> list[int]:
    """The test prompt of the pruned checkpoint: the dataset's first row (up to 64 tokens)."""
    first = next(iter(data))
    return encode_head(tok, first.text, min(64, context)) or [0]
