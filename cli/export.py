"""`routescope export`: routing records of prompts to CSV / Parquet (analysis.export.columns.EXPORT_SCHEMA).

Prompts from --prompt (repeatable) or --prompts FILE (.txt: one prompt per non-blank line,
prompt_id = its 1-based line number; .tsv: columns prompt_id and prompt, others ignored;
analysis.inputs.prompts). --shard i/n keeps the prompts whose 0-based index in that list satisfies
index % n == i, so the shards 0/n .. n-1/n partition the prompts exactly. The rows are made by
analysis.export.batch (batches of --batch-size; --max-new-tokens N > 0 continues each prompt) and
streamed to the output file(s) (`analysis.export.table_files.ExportWriter`), which appear only when the export
finished; Parquet files record the export's provenance.

--engine ray (the `distributed` extra) runs the same rows on a Ray cluster instead of this process:
--out is then a directory (or fsspec URL) that receives a partitioned Parquet dataset, and
--prompts may also be .jsonl or .parquet, local or any fsspec URL (analysis.export.ray_prompts).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from routescope.analysis.export import batch as B
from routescope.analysis.export import ray_export
from routescope.analysis.export.run_table import TokenText
from routescope.analysis.export.output_files import check_output
from routescope.analysis.export.table_files import ExportWriter

from . import options as O
from .common import load_with_tokenizer

SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(spec: str | None) -> tuple[int, int]:
    """"i/n" -> (i, n) with 0 <= i < n; None -> (0, 1)."""
    if spec is None:
        return 0, 1
    m = SHARD.match(spec)
    if not m or int(m[2]) < 1 or int(m[1]) >= int(m[2]):
        raise ValueError(f"--shard {spec!r}: expected i/n with 0 <= i < n, e.g. 0/4")
    return int(m[1]), int(m[2])


def shard(items: Sequence[Any], i: int, n: int) -> list[Any]:
    """Items whose 0-based index % n == i."""
    return [x for k, x in enumerate(items) if k % n == i]


def job_of(args: argparse.Namespace):
    """The analysis.export.batch.ExportJob of the command line."""
    return B.ExportJob(max_new_tokens=args.max_new_tokens, routing=args.routing, seed=args.seed,
                       options=tuple(args.option), drop=tuple(args.drop), force=tuple(args.force),
                       modes=tuple(args.mode), batch_size=args.batch_size)


def run(args: argparse.Namespace) -> int:
    if args.engine == "ray":
        return run_ray(args, job_of(args))
    prompts = args.prompt_pairs  # read first, before this module loaded torch (cli.parsers.read_export_prompts)
    job = job_of(args)
    for out in args.out:  # before any work: a bad output must not fail a long export at its end
        check_output(out)
    if len({Path(out).resolve() for out in args.out}) < len(args.out):
        raise ValueError(f"--out: the same file is given twice ({', '.join(args.out)})")
    i, n = parse_shard(args.shard)
    prompts = shard(prompts, i, n)
    model, tok = load_with_tokenizer(args.checkpoint, **O.device_kwargs(args))
    if not model.routing_layers():
        raise ValueError(f"{args.checkpoint}: {model.config.label} has no routing layers to export")
    job.model_options(model)  # a run option the family does not take is refused before any work
    encoded = B.encode_prompts(tok, prompts, model.context, job)
    ablation = job.ablation(model, run_ids=lambda: [ids for _, ids in encoded])  # top N: over these prompts
    name, notes = B.model_name(args.checkpoint), B.NoteLog()
    with ExportWriter(*args.out, provenance=B.provenance(args.checkpoint, model, job)) as w, \
            tqdm(total=len(encoded), desc="export", unit="prompt", disable=True if args.quiet else None) as bar:
        for batch, frames in B.export_batches(model, encoded, TokenText(tok), ablation, job, name):
            for df in frames:
                w.write(df)
                notes(df)
            bar.update(len(batch))
    for tmp in w.removed_temporaries:
        sys.stderr.write(f"note: removed {tmp}, left by an export that was killed\n")
    replaced = {str(p) for p in w.replaced}
    outs = ", ".join(f"{o} (replaced the existing file)" if str(Path(o)) in replaced else o for o in args.out)
    sys.stderr.write(f"wrote {w.n_rows} rows for {len(encoded)} prompt{'' if len(encoded) == 1 else 's'} to {outs}\n")
    return 0


def run_ray(args: argparse.Namespace, job) -> int:
    """--engine ray: analysis.export.ray_export.export_ray over a Ray cluster (RAY_ADDRESS) or a local one."""
    if args.shard:
        raise ValueError("--shard: not with --engine ray (Ray partitions the prompts itself; see --partition-size)")
    if len(args.out) != 1:
        raise ValueError(f"--out: --engine ray writes one Parquet dataset directory, got {len(args.out)} outputs")
    if args.device_map != "none":
        raise ValueError("--device-map: not with --engine ray (each worker loads its own copy on --device)")
    try:
        import ray  # noqa: F401  (ray: an optional extra, imported here only to say it is missing before any work)
    except ImportError:
        raise ValueError("--engine ray needs Ray: pip install 'routescope[distributed]'") from None
    source = ray_export.PromptSource(texts=tuple(args.prompt)) if args.prompt else \
        ray_export.PromptSource(path=args.prompts)
    summary = ray_export.export_ray(args.checkpoint, source, args.out[0], job, workers=args.workers,
                                     partition_size=args.partition_size, threads=args.threads_per_worker,
                                     device=args.device, dtype=args.dtype, progress=not args.quiet)
    sys.stderr.write(summary.describe() + "\n")
    return 0
