"""`routescope export`: routing records of prompts to CSV / Parquet (analysis.columns.EXPORT_SCHEMA).

Prompts from --prompt (repeatable) or --prompts FILE (.txt: one prompt per non-blank line,
prompt_id = its 1-based line number; .tsv: columns prompt_id and prompt, others ignored).
--shard i/n keeps the prompts whose 0-based index in that list satisfies index % n == i, so the
shards 0/n .. n-1/n partition the prompts exactly. Prompts are processed --batch-size at a time:
without generation, prompts of equal token length run as one batch and the rest alone; with
--max-new-tokens N > 0 each prompt is continued with `core_models.generate.generate` (greedy,
KV cache) and its rows cover prompt and generated positions. Rows are streamed to the output
file(s) (`analysis.export.ExportWriter`), which appear only when the export finished.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Sequence

from analysis import columns as C

from . import options as O
from .common import TokenText, load_with_tokenizer, read_text_file

log = logging.getLogger(__name__)

SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def add(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("export", help="export routing records of prompts to CSV / Parquet",
                       description="Export routing records (analysis.columns.EXPORT_SCHEMA) of every prompt.")
    e.add_argument("checkpoint")
    src = e.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeatable)")
    src.add_argument("--prompts", metavar="FILE", help=".txt (one prompt per line) or .tsv (prompt_id, prompt)")
    e.add_argument("--out", action="append", required=True, metavar="FILE",
                   help="output .csv or .parquet (repeat to write both)")
    O.add_ablation_options(e)
    e.add_argument("--max-new-tokens", type=O.nonnegative_int, default=0,
                   help="greedy continuation length (0: prompt only)")
    e.add_argument("--seed", type=O.seed, default=0, help="routing seed (sampled routing)")
    e.add_argument("--batch-size", type=O.positive_int, default=8)
    e.add_argument("--shard", metavar="i/n", help="only prompts with index %% n == i (0-based)")
    e.add_argument("--atm", action="store_true", help="Wiola: merge tokens (ATM) in the prompt pass")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=run)


def read_prompts(path: str | Path) -> list[tuple[str, str]]:
    """(prompt_id, prompt) pairs from a .txt (one per non-blank line, id = line number) or a .tsv
    (columns prompt_id and prompt)."""
    path = Path(path)
    text = read_text_file(path, "prompt file")
    if path.suffix.lower() not in (".txt", ".tsv"):
        raise ValueError(f"{path}: prompt files are .txt (one prompt per line) or .tsv (prompt_id, prompt)")
    lines = [line.removesuffix("\r") for line in text.split("\n")]  # not splitlines: U+2028 & co. are text
    if path.suffix.lower() == ".txt":
        return [(str(n), line) for n, line in enumerate(lines, start=1) if line.strip()]
    rows = [line.split("\t") for line in lines]  # no quoting: a field holds no tab
    header = rows[0] if rows else []
    missing = [c for c in ("prompt_id", "prompt") if c not in header]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; found: {', '.join(header) or 'none'}")
    i_id, i_p = header.index("prompt_id"), header.index("prompt")
    out = []
    for n, row in enumerate(rows[1:], start=2):
        if not any(row):
            continue
        if len(row) != len(header):
            raise ValueError(f"{path}: line {n} has {len(row)} fields, the header has {len(header)}")
        out.append((row[i_id], row[i_p]))
    dup = sorted(i for i, k in Counter(i for i, _ in out).items() if k > 1)
    if dup:
        raise ValueError(f"{path}: duplicate prompt_id(s) {', '.join(dup)}")
    return out


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


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for k in range(0, len(items), size):
        yield items[k:k + size]


def _export_prompt_batch(model, batch, decode, ablation, args, model_name):
    """Prompt-only rows. Prompts of a batch share one forward, right-padded to the longest: under
    causal attention no real position sees the padding, and the padded positions' rows are
    dropped. With sampled routing every prompt runs alone (its Gumbel noise then depends only on
    --seed, not on batching or sharding), and with ATM too (merges could reach into padding)."""
    import torch

    from core_models import tracing
    from analysis.table import ExportMeta, RowMeta, routing_table

    alone = args.routing == "sampled" or args.atm
    groups = [[item] for item in batch] if alone else [list(batch)]
    pad = max(0, getattr(model.config, "pad_id", 0))
    for group in groups:
        T = max(len(ids) for _, ids in group)
        padded = [ids + [pad] * (T - len(ids)) for _, ids in group]
        gen = torch.Generator().manual_seed(args.seed)
        with torch.inference_mode(), tracing() as tr:
            model(torch.tensor(padded), ablation=ablation, routing=args.routing, generator=gen,
                  atm=True if args.atm else None)
        meta = ExportMeta(model=model_name, ablation=ablation.describe(), seed=args.seed,
                          rows=[RowMeta(pid, row, decode(row)) for (pid, _), row in zip(group, padded)])
        df = routing_table(tr, model, meta=meta)
        if any(len(ids) < T for _, ids in group):
            length = df[C.PROMPT_ID].map({pid: len(ids) for pid, ids in group})
            df = df[df[C.POSITION].isna() | (df[C.POSITION] < length)].reset_index(drop=True)
        yield df


def _export_generation(model, pid, ids, decode, ablation, args, model_name):
    from core_models.generate import Sampling, generate
    from analysis.table import ExportMeta, RowMeta, routing_table

    g = generate(model, ids, max_new_tokens=args.max_new_tokens, sampling=Sampling(seed=args.seed), top_n=1,
                 ablation=ablation, routing=args.routing, routing_seed=args.seed, trace_sites=None)
    for note in g.notes:
        log.warning("prompt %s: %s", pid, note)
    meta = ExportMeta(model=model_name, ablation=ablation.describe(), seed=args.seed,
                      rows=[RowMeta(pid, g.ids, decode(g.ids), n_prompt=len(g.prompt_ids))])
    return routing_table(g.trace, model, meta=meta)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from core_models import Ablation
    from analysis.export import ExportWriter, check_output

    for out in args.out:  # before any work: a bad output must not fail a long export at its end
        check_output(out)
    if len({Path(out).resolve() for out in args.out}) < len(args.out):
        raise ValueError(f"--out: the same file is given twice ({', '.join(args.out)})")
    if args.atm and args.max_new_tokens:
        raise ValueError("--atm needs --max-new-tokens 0: token merging cannot run with the KV cache of generation")
    i, n = parse_shard(args.shard)
    prompts = [(str(k + 1), p) for k, p in enumerate(args.prompt)] if args.prompt else read_prompts(args.prompts)
    prompts = shard(prompts, i, n)
    model, tok = load_with_tokenizer(args.checkpoint)
    if not model.routing_layers():
        raise ValueError(f"{args.checkpoint}: family {model.config.family!r} has no routing layers to export")
    ablation = Ablation.parse(args.drop, args.force)
    ablation.validate(model.routing_layers())
    model_name = Path(args.checkpoint).resolve().name
    decode = TokenText(tok)
    encoded = []
    for pid, text in prompts:
        ids = tok.encode(text).ids
        if not ids:
            raise ValueError(f"prompt {pid!r}: encodes to no tokens")
        if not args.max_new_tokens and len(ids) > model.context:
            log.warning("prompt %s: kept the last %d of %d tokens (context)", pid, model.context, len(ids))
            ids = ids[-model.context:]
        encoded.append((pid, ids))
    notes: set[str] = set()
    with ExportWriter(*args.out) as w, tqdm(total=len(encoded), desc="export", unit="prompt",
                                           disable=True if args.quiet else None) as bar:
        for batch in _chunks(encoded, args.batch_size):
            if args.max_new_tokens:
                frames = (_export_generation(model, pid, ids, decode, ablation, args, model_name) for pid, ids in batch)
            else:
                frames = _export_prompt_batch(model, batch, decode, ablation, args, model_name)
            for df in frames:
                w.write(df)
                for note in set(df.attrs.get("notes", [])) - notes:
                    log.warning("%s", note)
                    notes.add(note)
            bar.update(len(batch))
    sys.stderr.write(f"wrote {w.n_rows} rows for {len(encoded)} prompts to {', '.join(args.out)}\n")
    return 0
