"""`routescope export | routes | attribute`: argument parsers and handlers.

`cli.py` wires these in with `add_commands(subparsers)`. Handlers raise ValueError with a clear
message for every user error (bad file, bad spec, unknown token); `main()` prints it without a
traceback. Heavy imports happen inside the handlers so `routescope --help` stays fast.

export: prompts from --prompt (repeatable) or --prompts FILE (.txt: one prompt per non-blank
line, prompt_id = its 1-based line number; .tsv: columns prompt_id and prompt, others ignored).
--shard i/n keeps the prompts whose 0-based index in that list satisfies index % n == i, so the
shards 0/n .. n-1/n partition the prompts exactly. Prompts are processed --batch-size at a time:
without generation, prompts of equal token length run as one batch and the rest alone; with
--max-new-tokens N > 0 each prompt is continued with `core_models.generate.generate` (greedy,
KV cache) and its rows cover prompt and generated positions. Rows are streamed to the output
file(s) (`analysis.export.ExportWriter`), which appear only when the export finished.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from . import cliargs as A
from . import columns as C

log = logging.getLogger(__name__)

SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


# --- parsers -----------------------------------------------------------------------------------

def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register export, routes and attribute on the `routescope` sub-command parser."""
    e = subparsers.add_parser("export", help="export routing records of prompts to CSV / Parquet",
                              description="Export routing records (analysis.columns.EXPORT_SCHEMA) of every prompt.")
    e.add_argument("checkpoint")
    src = e.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeatable)")
    src.add_argument("--prompts", metavar="FILE", help=".txt (one prompt per line) or .tsv (prompt_id, prompt)")
    e.add_argument("--out", action="append", required=True, metavar="FILE",
                   help="output .csv or .parquet (repeat to write both)")
    e.add_argument("--drop", action="append", default=[], help="OPTION or LAYER:OPTION, repeatable")
    e.add_argument("--force", action="append", default=[], help="LAYER:OPTION, repeatable")
    e.add_argument("--max-new-tokens", type=A.nonnegative_int, default=0,
                   help="greedy continuation length (0: prompt only)")
    e.add_argument("--seed", type=A.seed, default=0, help="routing seed (sampled routing)")
    e.add_argument("--routing", choices=("deterministic", "sampled"), default="deterministic")
    e.add_argument("--batch-size", type=A.positive_int, default=8)
    e.add_argument("--shard", metavar="i/n", help="only prompts with index %% n == i (0-based)")
    e.add_argument("--atm", action="store_true", help="Wiola: merge tokens (ATM) in the prompt pass")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=cmd_export)

    r = subparsers.add_parser("routes", help="Table 6: path chosen per parallel layer for story/math probes",
                              description="Route the PaPaformer Table 6 probes and compare with the paper.")
    r.add_argument("checkpoint")
    r.add_argument("--probes", metavar="FILE", help="probe TSV (default: the paper's Table 6 probes)")
    r.add_argument("--majority", action="store_true", help="majority route over the prompt's tokens "
                                                           "(default: route at the last prompt token)")
    r.add_argument("--json", action="store_true")
    r.add_argument("--batch-size", type=A.positive_int, default=32, help="probes per forward (padded batches)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_routes)

    a = subparsers.add_parser("attribute", help="attribute a next-token log-prob to tokens or routing options")
    a.add_argument("checkpoint")
    a.add_argument("--prompt", required=True, metavar="TEXT")
    a.add_argument("--position", type=int, default=-1, help="position whose next token is explained (default: last)")
    tok = a.add_mutually_exclusive_group()
    tok.add_argument("--token", metavar="TEXT", help="target token text (one token; default: the model's top-1)")
    tok.add_argument("--token-id", type=int, metavar="ID", help="target token id")
    a.add_argument("--method", choices=("ig", "ablation", "shapley"), default="ig")
    a.add_argument("--baseline", choices=("pad", "zeros"), default="pad", help="ig baseline embedding")
    a.add_argument("--n-steps", type=A.positive_int, default=64, help="ig integration steps")
    a.add_argument("--n-samples", type=A.positive_int, default=25, help="shapley permutations")
    a.add_argument("--scope", choices=("layer", "global"), default="layer",
                   help="paths per (layer, option) or per option index across layers")
    a.add_argument("--seed", type=A.seed, default=0)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_attribute)


# --- shared helpers ----------------------------------------------------------------------------

def _load(path: str):
    from core_models.checkpoint import load_checkpoint
    return load_checkpoint(path)


def _need_tokenizer(tok: Any, checkpoint: str) -> None:
    if tok is None:
        raise ValueError(f"{checkpoint}: no tokenizer.json; text prompts need a tokenizer")


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of a user's file (a leading byte order mark dropped); ValueError naming the
    file for a directory, a missing or unreadable file, and bytes that are not UTF-8 (with their
    line and byte offset)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, not a {what}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such {what}") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read the {what} ({e.strerror})") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}: line {line} (byte offset {e.start}) is not UTF-8 text ({e.reason}); "
                         f"save the {what} as UTF-8") from None


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


class _Decoder:
    """Token id -> text, cached."""

    def __init__(self, tok: Any) -> None:
        self.tok, self.cache = tok, {}

    def __call__(self, ids: Sequence[int]) -> list[str]:
        return [self.cache.setdefault(i, self.tok.decode([i])) for i in ids]


# --- export ------------------------------------------------------------------------------------

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


def cmd_export(args: argparse.Namespace) -> int:
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
    model, tok = _load(args.checkpoint)
    _need_tokenizer(tok, args.checkpoint)
    if not model.routing_layers():
        raise ValueError(f"{args.checkpoint}: family {model.config.family!r} has no routing layers to export")
    ablation = Ablation.parse(args.drop, args.force)
    ablation.validate(model.routing_layers())
    model_name = Path(args.checkpoint).resolve().name
    decode = _Decoder(tok)
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


# --- routes (Table 6) --------------------------------------------------------------------------

@dataclass
class _ProbeScan:
    """What a first pass over a probe file learns: every row checked, the count, the widest cell per
    column (the text table's layout), the paper's route tally."""

    n: int = 0
    widest: dict[str, str] = field(default_factory=dict)
    max_expected: int = 1
    paper: Any = None  # domain.RouteTally of the paper column for this combiner, if the file has one
    stamp: tuple[int, int] = (0, 0)  # (size, mtime_ns): the file must not change between passes


def _file_stamp(path: str | Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _scan_probes(source: str | Path, model: Any, tok: Any) -> _ProbeScan:
    """Pass 1 of `routes`: check every probe before any is run (file rules of domain.iter_probes,
    expected_path within the checkpoint's paths, paper routes parse, prompts encode to tokens)."""
    import numpy as np

    from analysis import domain as D

    cfg, name = model.config, D.probe_source_name(source)
    scan = _ProbeScan(stamp=_file_stamp(source) if Path(source).is_file() else (0, 0))  # else iter_probes says why
    col = D.paper_column(cfg)
    for p in D.iter_probes(source):
        problem = D.expected_path_error(p.expected_path, cfg.n_paths)
        if problem:
            raise ValueError(f"{name}: line {p.line}: {problem}")
        if not tok.encode(p.prompt).ids:
            raise ValueError(f"{name}: line {p.line}: probe {p.prompt_id}: the prompt encodes to no tokens")
        cells = {"prompt_id": p.prompt_id, "domain": p.domain, "prompt": p.prompt}
        if col in p.cells:
            route = D.parse_route(p.cells[col])
            if route is None:
                raise ValueError(f"{name}: line {p.line}: {col} = {p.cells[col]!r} is not a route like 2>2>1")
            if scan.paper is None:
                scan.paper = D.RouteTally()
            scan.paper.add(np.array([route]), np.array([p.expected_path]))
            cells["paper"] = D.format_routes(route)
        for k, v in cells.items():
            if len(v) > len(scan.widest.get(k, "")):
                scan.widest[k] = v
        scan.max_expected = max(scan.max_expected, p.expected_path)
        scan.n += 1
    return scan


def _probe_rows(source: str | Path, scan: _ProbeScan, routes: Any) -> Iterator[tuple[Any, list[int]]]:
    """Pass 3: the probes again, each with its routes (0 = undefined), checking the file is unchanged."""
    from analysis import domain as D

    if _file_stamp(source) != scan.stamp:
        raise ValueError(f"{source}: the probe file changed while the probes ran; run routes again")
    for k, p in enumerate(D.iter_probes(source)):
        yield p, routes[k].tolist()


def _table_widths(scan: _ProbeScan, routes: Any, has_paper: bool) -> dict[str, int]:
    """Column widths of the routes table: pandas' layout of the widest cell of each column, so
    every chunk of rows prints aligned as the table printed whole."""
    import numpy as np
    import pandas as pd

    chars = np.array([1] + [len(str(v)) for v in range(1, int(routes.max(initial=0)) + 1)])  # 0 prints "?"
    ours = "9" * int(chars[routes].sum(axis=1).max() + routes.shape[1] - 1)
    widest = {"prompt_id": scan.widest["prompt_id"], "domain": scan.widest["domain"],
              "expected": pd.array([scan.max_expected], dtype="int64"), "ours": ours,
              **({"paper": scan.widest["paper"]} if has_paper else {}), "prompt": scan.widest["prompt"]}
    return {c: len(pd.DataFrame({c: v if c == "expected" else [v]}).to_string(index=False).splitlines()[0])
            for c, v in widest.items()}


def _write_table(rows: Iterable[tuple[Any, list[int]]], widths: dict[str, int], paper_col: str | None,
                 chunk: int = 1024) -> None:
    """The routes table, `chunk` rows at a time, laid out as pandas prints it whole."""
    import pandas as pd

    from analysis import domain as D

    def flush(buf: list, header: bool) -> None:
        df = pd.DataFrame(buf, columns=list(widths)).astype({"expected": "int64"})
        sys.stdout.write(df.to_string(index=False, header=header, col_space=widths) + "\n")

    buf, first = [], True
    for p, r in rows:
        paper = [D.format_routes(D.parse_route(p.cells[paper_col]))] if paper_col else []
        buf.append([p.prompt_id, p.domain, p.expected_path, D.format_routes([x or None for x in r]), *paper, p.prompt])
        if len(buf) == chunk:
            flush(buf, first)
            buf, first = [], False
    if buf:
        flush(buf, first)


def _dump_json_streamed(doc: dict, key: str, items: Iterable[Any]) -> None:
    """json.dump(doc with doc[key] = list(items), sys.stdout, indent=1, ensure_ascii=False), writing
    the items one by one. doc[key] must hold None as a placeholder."""
    text = json.dumps(doc, ensure_ascii=False, indent=1, allow_nan=False)
    slot = f"\n {json.dumps(key)}: null"  # unique: quotes inside strings are escaped
    head, _, tail = text.partition(slot)
    sys.stdout.write(head + slot.removesuffix("null") + "[")
    n = 0
    for item in items:
        body = json.dumps(item, ensure_ascii=False, indent=1, allow_nan=False).replace("\n", "\n  ")
        sys.stdout.write(("," if n else "") + "\n  " + body)
        n += 1
    sys.stdout.write(("\n ]" if n else "]") + tail + "\n")


def cmd_routes(args: argparse.Namespace) -> int:
    """Three passes over the probe file, so memory does not grow with it beyond a few bytes per
    probe: check every row, route them (batched, with a progress bar), print the table."""
    import numpy as np
    import pandas as pd
    from tqdm import tqdm

    from analysis import domain as D

    source = args.probes or D.DEFAULT_PROBES
    model, tok = _load(args.checkpoint)
    _need_tokenizer(tok, args.checkpoint)
    cfg = model.config
    D._check(cfg)
    scan = _scan_probes(source, model, tok)
    routes = np.zeros((scan.n, cfg.n_parallel_layers), dtype=np.min_scalar_type(cfg.n_paths + 1))
    tally, k = D.RouteTally(), 0
    with tqdm(total=scan.n, desc="routes", unit="probe", disable=True if args.quiet else None) as bar:
        for chunk, r in D.stream_routes(model, tok, D.iter_probes(source), majority=args.majority,
                                        batch_size=args.batch_size):
            routes[k:k + len(chunk)] = r
            tally.add(r, np.array([p.expected_path for p in chunk]))
            k += len(chunk)
            bar.update(len(chunk))
    combined = cfg.combiner != "share_linear"
    summ = tally.summary(cfg.n_paths, combined=combined)
    if scan.paper is not None:
        summ = pd.concat([summ, scan.paper.summary(D.PAPER_N_PATHS, combined=combined, source="paper")],
                         ignore_index=True)
    paper_col = D.paper_column(cfg) if scan.paper is not None else None
    rows = _probe_rows(source, scan, routes)
    if args.json:
        def item(p, r):
            paper = {"paper": D.format_routes(D.parse_route(p.cells[paper_col]))} if paper_col else {}
            return {"prompt_id": p.prompt_id, "domain": p.domain, "expected_path": p.expected_path, "prompt": p.prompt,
                    "routes": [x or None for x in r], "route": D.format_routes([x or None for x in r]), **paper}

        doc = {"checkpoint": args.checkpoint, "combiner": cfg.combiner, "n_parallel_layers": cfg.n_parallel_layers,
               "route_at": "majority" if args.majority else "last prompt token", "prompts": None,
               **{src: {m: (None if pd.isna(v) else float(v)) for m, v in zip(g[C.METRIC], g[C.VALUE])}
                  for src, g in summ.groupby(C.SOURCE, sort=False)}}
        _dump_json_streamed(doc, "prompts", (item(p, r) for p, r in rows))
        return 0
    at = "majority over tokens" if args.majority else "last prompt token"
    k = cfg.n_paths
    legend = (f"routes 1..{k} = paths, {k + 1} = combined" if combined
              else f"route = the path (1..{k}) whose output has the highest cosine with the combined output")
    sys.stdout.write(f"Table 6 routes: {cfg.combiner}, {cfg.n_parallel_layers} parallel layers, route at the {at}\n"
                     f"({legend})\n")
    if paper_col and k != D.PAPER_N_PATHS:
        sys.stdout.write(f"note: the paper's models have {D.PAPER_N_PATHS} paths (3 = combined); this one has {k}\n")
    sys.stdout.write("\n")
    _write_table(rows, _table_widths(scan, routes, paper_col is not None), paper_col)
    sys.stdout.write("\n")
    for src, g in summ.groupby(C.SOURCE, sort=False):
        vals = dict(zip(g[C.METRIC], g[C.VALUE]))
        shares = "  ".join(f"{m} {vals[m]:.1%}" for m in vals if m.startswith("path") or m == "combined")
        sys.stdout.write(f"{src:>5}: {shares}  accuracy {vals['accuracy']:.1%}  ({int(vals['n_routes'])} routes)\n")
    return 0


# --- attribute ---------------------------------------------------------------------------------

def _target_id(tok: Any, args: argparse.Namespace) -> int | None:
    if args.token_id is not None:
        return args.token_id
    if args.token is None:
        return None
    ids = tok.encode(args.token).ids
    if len(ids) != 1:
        raise ValueError(f"--token {args.token!r} encodes to {len(ids)} tokens {ids}; give one token "
                         f"(or --token-id)")
    return ids[0]


def cmd_attribute(args: argparse.Namespace) -> int:
    from analysis.attribution import PathAttribution, TokenAttribution

    model, tok = _load(args.checkpoint)
    _need_tokenizer(tok, args.checkpoint)
    ids = tok.encode(args.prompt).ids[-model.context:]
    if not ids:
        raise ValueError("--prompt encodes to no tokens")
    target = _target_id(tok, args)
    if args.method == "ig":
        res = TokenAttribution(model).attribute(ids, args.position, target, n_steps=args.n_steps,
                                                baseline=args.baseline)
        df = res.frame(tok)
        head = {"target_position": res.target_position, "target_token": tok.decode([res.target_token]),
                "target_token_id": res.target_token, "log_prob": res.target_log_prob,
                "baseline_log_prob": res.baseline_log_prob, "convergence_delta": res.convergence_delta,
                "baseline": res.baseline, "n_steps": res.n_steps}
    else:
        df = PathAttribution(model).attribute(ids, args.position, target, method=args.method, scope=args.scope,
                                              n_samples=args.n_samples, seed=args.seed)
        t = int(df["token_id"].iloc[0])
        head = {"target_position": int(df["position"].iloc[0]), "target_token": tok.decode([t]),
                "target_token_id": t, "log_prob": float(df["full_log_prob"].iloc[0]), "method": args.method,
                "scope": args.scope}
        df = df.drop(columns=["position", "token_id"])
    if args.json:
        json.dump({**head, "rows": json.loads(df.to_json(orient="records"))}, sys.stdout, ensure_ascii=False, indent=1)
        sys.stdout.write("\n")
    else:
        for k, v in head.items():
            sys.stdout.write(f"{k}: {v!r}\n" if isinstance(v, str) else f"{k}: {v}\n")
        sys.stdout.write("\n" + df.to_string(index=False) + "\n")
    return 0
