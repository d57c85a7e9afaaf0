"""`routescope replay`: a serving engine's routing trace against the model as transformers runs it.

    routescope replay CHECKPOINT --trace FILE --out DIR [--trace-format FMT] [--dtype bfloat16]
        [--reference-dtype float32] [--trace-dtype bfloat16] [--tie-ulps 8] [--engine ray]

Writes into DIR (replaced whole: it may hold only an earlier replay's files): agreement, mismatches,
checks, first_divergence and rows as `.csv` and `.parquet`, `replay.html` (the page) and `replay.json`
(provenance and the corpus figures). The trace streams (`analysis.replay.run`): mismatches go to
their files batch by batch. A bad trace, an unknown format or a trace of another model stops the
command with one line naming the row (exit 2), and DIR is left as it was.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from routescope.analysis.corpus.page import OutputSet
from routescope.analysis.replay import output as OUT
from routescope.analysis.replay.compare import ReplaySettings, model_shape
from routescope.analysis.replay.ray_replay import RaySpec, ray_references
from routescope.analysis.replay.run import replay
from routescope.analysis.replay.trace import read_trace
from routescope.rendering.replay_figures import page, summary_line

from . import options as O
from .common import load


def run(args: argparse.Namespace) -> int:
    out = OUT.check_out_dir(args.out)
    settings = ReplaySettings(tie_ulps=args.tie_ulps, trace_dtype=args.trace_dtype, batch_tokens=args.batch_tokens)
    if args.engine == "ray":
        if args.device_map != "none":
            raise ValueError("--device-map: not with --engine ray (each worker loads its own copy)")
        try:
            import ray  # noqa: F401  (ray: an optional extra, imported here only to say it is missing before any work)
        except ImportError:
            raise ValueError("--engine ray needs Ray: pip install 'routescope[distributed]'") from None
    model, tok = load(args.checkpoint, **O.device_kwargs(args))
    shape = model_shape(model)  # SGLang's flat ids are shaped with its layers and k
    rows = read_trace(args.trace, fmt=args.trace_format, n_layers=len(shape.layers), top_k=shape.k)
    first = next(rows, None)
    if first is None:
        raise ValueError(f"{args.trace}: the trace holds no rows")
    model32 = model.float32_copy() if args.reference_dtype == "float32" and args.engine != "ray" else None
    refs = ray_references(RaySpec(args.checkpoint, args.workers, args.dtype, args.reference_dtype == "float32")) \
        if args.engine == "ray" else None
    name = Path(args.checkpoint).resolve().name

    def all_rows():
        yield first
        yield from rows

    with OutputSet(out) as built, tqdm(desc=name, unit="row", disable=True if args.quiet else None) as bar:
        files = OUT.MismatchFiles(built.dir)
        try:
            def progress(done: int, tokens: int) -> None:
                bar.update(done - bar.n)
                bar.set_postfix(tokens=f"{tokens:,}", refresh=False)

            result = replay(model, all_rows(), settings=settings, float32_model=model32, progress=progress, sink=files,
                            references=refs, name=name, trace=str(args.trace))
        finally:
            files.close()
        decode = (lambda i: tok.decode([i])) if tok is not None else None
        written = OUT.write_set(built.dir, result.tables, result.provenance, page(result, decode), skip=("mismatches",))
    replaced = f" (replaced {built.replaced} files of an earlier run)" if built.replaced else ""
    sys.stderr.write(f"{summary_line(result.summary)}\nwrote {len(written) + 2} files to {out}{replaced}\n")
    return 0
