"""Table 6 of the PaPaformer paper: the path each parallel layer picks for story and math probes.

Probe files are TSVs with columns prompt_id, domain, expected_path (1-based path a
domain-specialised model should pick), prompt, and optional paper_gumbel_v1 / paper_gumbel_v2 /
paper_share_linear columns with the paper's routes ("2>2>1": one route per parallel layer).

Routes are 1-based like the paper: path j -> j, the combined representation (Gumbel only) ->
n_paths + 1. A Gumbel layer's route is its router's choice; a Share-Linear layer's route is the
path whose output has the highest cosine with the combined output. Both are read at the last
prompt token, or (majority=True) as the most frequent route over the prompt's tokens (ties: the
lower route).

Summary (matching the paper's numbers): path shares and the combined share are fractions of all
(prompt, layer) routes; routing accuracy is the fraction of (prompt, layer) routes equal to the
prompt's expected_path (the combined route never counts as correct). On the paper's own routes
this gives Gumbel v1 48.3 / 50.0 / 1.7 % and accuracy 40.0 % (paper: 48/50/2, 40 %), Gumbel v2
23.3 / 70.0 / 6.7 % and 46.7 % (paper: 23/70/7, 46.5 %), Share-Linear 70 / 30 % and 50 %.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from core_models.runtime import Trace, tracing

from . import columns as C
from .routing import cosine_dominance

REQUIRED = (C.PROMPT_ID, C.DOMAIN, C.EXPECTED_PATH, C.PROMPT)
PAPER_PREFIX = "paper_"
DEFAULT_PROBES = Path(__file__).parent / "data" / "table6_probes.tsv"
PAPER_N_PATHS = 2  # the paper's models: routes 1, 2 = paths, 3 = combined (Gumbel)


def read_probes(path: str | os.PathLike = DEFAULT_PROBES) -> pd.DataFrame:
    """Read and check a probe TSV; ValueError naming missing or unknown columns and bad rows."""
    try:
        df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, quoting=csv.QUOTE_NONE)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: empty probe file; expected a header with {', '.join(REQUIRED)}") from None
    cols = [str(c) for c in df.columns]
    missing = [c for c in REQUIRED if c not in cols]
    unknown = [c for c in cols if c not in REQUIRED and not c.startswith(PAPER_PREFIX)]
    if missing or unknown:
        problems = ([f"missing required column(s) {', '.join(missing)}"] if missing else []) + \
                   ([f"unknown column(s) {', '.join(unknown)}"] if unknown else [])
        raise ValueError(f"{path}: {'; '.join(problems)}. A probe file is a TSV with columns "
                         f"{', '.join(REQUIRED)} and optional paper_* columns; found: {', '.join(cols) or 'none'}")
    if not len(df):
        raise ValueError(f"{path}: no probes (only a header)")
    dup = sorted(set(df[C.PROMPT_ID][df[C.PROMPT_ID].duplicated()]))
    if dup:
        raise ValueError(f"{path}: duplicate prompt_id(s) {', '.join(dup)}")
    bad = [pid for pid, e in zip(df[C.PROMPT_ID], df[C.EXPECTED_PATH]) if not (e.isdigit() and int(e) >= 1)]
    if bad:
        raise ValueError(f"{path}: expected_path must be a 1-based path number; bad in {', '.join(bad)}")
    empty = [pid for pid, p in zip(df[C.PROMPT_ID], df[C.PROMPT]) if not p]
    if empty:
        raise ValueError(f"{path}: empty prompt in {', '.join(empty)}")
    df[C.EXPECTED_PATH] = df[C.EXPECTED_PATH].astype("int64")
    return df


def _check(config: Any) -> None:
    if getattr(config, "family", "") != "papaformer":
        raise ValueError(f"Table 6 routes need a PaPaformer checkpoint (family 'papaformer'), "
                         f"not {getattr(config, 'family', type(config).__name__)!r}")


def layer_routes(trace: Trace, config: Any, *, majority: bool = False, position: int = -1) -> pd.DataFrame:
    """Per batch row and parallel layer: the 1-based route at `position` (or the majority over
    all positions). Share-Linear layers whose cosine is undefined (fused grow) get NA. Pure."""
    _check(config)
    per_token: dict[str, np.ndarray] = {}  # layer -> (B, T) 1-based routes, 0 = undefined
    if config.combiner == "share_linear":
        cos = cosine_dominance(trace)
        for i in range(config.n_parallel_layers):
            layer = f"parallel.{i}"
            c = cos[cos[C.LAYER] == layer]
            if not len(c):
                raise ValueError(f"the trace has no path/combined outputs for {layer}")
            B, T = int(c[C.BATCH].max()) + 1, int(c[C.POSITION].max()) + 1
            dom = c[c[C.DOMINANT]]
            r = np.zeros((B, T), dtype=int)
            r[dom[C.BATCH].to_numpy(), dom[C.POSITION].to_numpy()] = dom[C.OPTION].to_numpy() + 1
            per_token[layer] = r
    else:
        for i in range(config.n_parallel_layers):
            name = f"parallel.{i}.router.choice"
            if name not in trace:
                raise ValueError(f"the trace has no site {name!r}")
            per_token[f"parallel.{i}"] = trace[name].numpy() + 1
    rows = []
    for layer, r in per_token.items():
        for b in range(r.shape[0]):
            if majority:
                vals = r[b][r[b] > 0]
                route = int(np.bincount(vals).argmax()) if len(vals) else 0  # argmax: lowest on ties
            else:
                route = int(r[b, position])
            rows.append((b, layer, pd.NA if route == 0 else route))
    df = pd.DataFrame(rows, columns=[C.BATCH, C.LAYER, C.ROUTE])
    df[C.ROUTE] = df[C.ROUTE].astype("Int64")
    return df


def _sites(config: Any) -> list[str]:
    if config.combiner == "share_linear":
        return [f"parallel.{i}.{s}" for i in range(config.n_parallel_layers)
                for s in ["combined"] + [f"paths.{j}.out" for j in range(config.n_paths)]]
    return [f"parallel.{i}.router.choice" for i in range(config.n_parallel_layers)]


@torch.inference_mode()
def probe_routes(model: Any, tokenizer: Any, probes: pd.DataFrame, *, majority: bool = False) -> pd.DataFrame:
    """Run every probe (alone, deterministic routing) and return one row per (probe, parallel
    layer): prompt_id, domain, expected_path, layer, route, correct. Prompts longer than the
    context keep their last tokens."""
    _check(model.config)
    frames = []
    for pid, domain, expected, prompt in zip(probes[C.PROMPT_ID], probes[C.DOMAIN], probes[C.EXPECTED_PATH],
                                             probes[C.PROMPT]):
        ids = tokenizer.encode(prompt).ids[-model.context:]
        if not ids:
            raise ValueError(f"probe {pid}: the prompt encodes to no tokens")
        with tracing(_sites(model.config)) as tr:
            model(torch.tensor([ids]))
        r = layer_routes(tr, model.config, majority=majority)
        frames.append(r.drop(columns=C.BATCH).assign(**{C.PROMPT_ID: pid, C.DOMAIN: domain,
                                                        C.EXPECTED_PATH: int(expected)}))
    return _with_correct(pd.concat(frames, ignore_index=True))


def _with_correct(df: pd.DataFrame) -> pd.DataFrame:
    df = df[[C.PROMPT_ID, C.DOMAIN, C.EXPECTED_PATH, C.LAYER, C.ROUTE]].reset_index(drop=True)
    df[C.CORRECT] = (df[C.ROUTE] == df[C.EXPECTED_PATH]).astype("boolean")
    return df


def paper_column(config_or_combiner: Any) -> str:
    combiner = getattr(config_or_combiner, "combiner", config_or_combiner)
    return f"{PAPER_PREFIX}{combiner}"


def paper_routes(probes: pd.DataFrame, combiner: str) -> pd.DataFrame | None:
    """The paper's routes for `combiner` in the same shape as `probe_routes`, or None when the
    probe file has no paper column for it. Unparsable cells raise ValueError."""
    col = paper_column(combiner)
    if col not in probes.columns:
        return None
    rows = []
    for pid, domain, expected, cell in zip(probes[C.PROMPT_ID], probes[C.DOMAIN], probes[C.EXPECTED_PATH],
                                           probes[col]):
        parts = cell.split(">") if cell else []
        if not parts or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"probe {pid}: {col} = {cell!r} is not a route like 2>2>1")
        rows += [(pid, domain, int(expected), f"parallel.{i}", int(p)) for i, p in enumerate(parts)]
    df = pd.DataFrame(rows, columns=[C.PROMPT_ID, C.DOMAIN, C.EXPECTED_PATH, C.LAYER, C.ROUTE])
    df[C.ROUTE] = df[C.ROUTE].astype("Int64")
    return _with_correct(df)


def format_routes(routes: Sequence[Any]) -> str:
    """[2, 2, 1] -> "2>2>1" (undefined routes as "?")."""
    return ">".join("?" if r is pd.NA or r is None else str(int(r)) for r in routes)


def table6(routes: pd.DataFrame, probes: pd.DataFrame, paper: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per probe: prompt_id, domain, expected_path, prompt, routes ("2>2>1", layers in
    order) and, when given, the paper's routes beside them."""
    def fmt(df: pd.DataFrame) -> dict[str, str]:
        key = df[C.LAYER].str.split(".").str[-1].astype(int)
        df = df.assign(_k=key).sort_values([C.PROMPT_ID, "_k"], kind="stable")
        return {pid: format_routes(g[C.ROUTE].tolist()) for pid, g in df.groupby(C.PROMPT_ID, sort=False)}

    ours = fmt(routes)
    out = probes[[C.PROMPT_ID, C.DOMAIN, C.EXPECTED_PATH, C.PROMPT]].copy()
    out[C.ROUTES] = [ours.get(p, "") for p in out[C.PROMPT_ID]]
    if paper is not None:
        theirs = fmt(paper)
        out[C.PAPER_ROUTES] = [theirs.get(p, "") for p in out[C.PROMPT_ID]]
    return out.reset_index(drop=True)


def route_summary(routes: pd.DataFrame, n_paths: int, *, combined: bool, source: str = "ours") -> pd.DataFrame:
    """Long table (source, metric, value): share of (prompt, layer) routes per path ("path j"),
    the combined share (Gumbel), routing accuracy and the number of routes counted. Undefined
    (NA) routes are left out of every fraction."""
    r = routes[C.ROUTE].dropna().astype(int)
    n = len(r)
    frac = (lambda x: float(x) / n) if n else (lambda x: float("nan"))
    rows = [(f"path {j}", frac((r == j).sum())) for j in range(1, n_paths + 1)]
    if combined:
        rows.append(("combined", frac((r == n_paths + 1).sum())))
    rows.append(("accuracy", frac(routes.loc[r.index, C.CORRECT].sum())))
    rows.append(("n_routes", float(n)))
    return pd.DataFrame([(source, m, v) for m, v in rows], columns=[C.SOURCE, C.METRIC, C.VALUE])
