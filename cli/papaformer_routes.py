"""`routescope routes` on a PaPaformer checkpoint (the PaPaformer spec's `ProbeTable.command`):
Table 6, the path chosen per parallel layer for story/math probes, next to the paper's routes.
Three passes over the probe file, so memory does not grow with it beyond a few bytes per probe:
check every row, route them (batched, with a progress bar), print the table."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pandas as pd
from tqdm import tqdm

from routescope.analysis.export import columns as C
from routescope.analysis.runs import domain as D

from .common import write_json_streamed


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
    if _file_stamp(source) != scan.stamp:
        raise ValueError(f"{source}: the probe file changed while the probes ran; run routes again")
    for k, p in enumerate(D.iter_probes(source)):
        yield p, routes[k].tolist()


def _table_widths(scan: _ProbeScan, routes: Any, has_paper: bool) -> dict[str, int]:
    """Column widths of the routes table: pandas' layout of the widest cell of each column, so
    every chunk of rows prints aligned as the table printed whole."""
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


def run(args: argparse.Namespace, model: Any, tok: Any) -> int:
    """Three passes over the probe file, so memory does not grow with it beyond a few bytes per
    probe: check every row, route them (batched, with a progress bar), print the table."""
    source = args.probes or D.DEFAULT_PROBES
    cfg = model.config
    D.require_table6(model)
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
    combined = cfg.has_combined_route
    summ = D.table6_summary(cfg, ours=tally, paper=scan.paper)
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
        write_json_streamed(doc, "prompts", (item(p, r) for p, r in rows))
        return 0
    at = "majority over tokens" if args.majority else "last prompt token"
    k = cfg.n_paths
    legend = (f"routes numbered from 1 as in the paper: route j = path j - 1 (paths count from 0), "
              f"{k + 1} = combined" if combined
              else "route j = path j - 1 (numbered from 1 as in the paper), the path whose output has the highest "
                   "cosine with the combined output")
    sys.stdout.write(f"Table 6 routes: {cfg.combiner}, {cfg.n_parallel_layers} parallel layers, route at the {at}\n"
                     f"({legend})\n")
    if paper_col and k != D.PAPER_N_PATHS:
        sys.stdout.write(f"note: the paper's models have {D.PAPER_N_PATHS} paths (3 = combined); this one has {k}\n")
    sys.stdout.write("\n")
    _write_table(rows, _table_widths(scan, routes, paper_col is not None), paper_col)
    sys.stdout.write("\n")
    for src, g in summ.groupby(C.SOURCE, sort=False):
        vals = dict(zip(g[C.METRIC], g[C.VALUE]))
        shares = "  ".join(f"{m} {vals[m]:.1%}" for m in vals if m.startswith("route") or m == "combined")
        sys.stdout.write(f"{src:>5}: {shares}  accuracy {vals['accuracy']:.1%}  ({int(vals['n_routes'])} routes)\n")
    return 0
