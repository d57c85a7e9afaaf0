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

import io
import os
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, NamedTuple, Sequence

import numpy as np
import pandas as pd
import torch

from routescope.core_models.ablation import Ablation
from routescope.core_models.papaformer import Papaformer, parallel_layer
from routescope.core_models.trace import Trace, tracing

from routescope.analysis.export import columns as C
from routescope.analysis.families.papaformer import papaformer_reader
from routescope.analysis.runs.views import RouteReader
from routescope.analysis.inputs.files import MAX_LINE_BYTES, iter_lines, open_regular_file

REQUIRED = (C.PROMPT_ID, C.DOMAIN, C.EXPECTED_PATH, C.PROMPT)
PAPER_PREFIX = "paper_"
DEFAULT_PROBES = Path(__file__).parents[1] / "data" / "table6_probes.tsv"
HELDOUT_PROBES = Path(__file__).parents[1] / "data" / "heldout_probes.tsv"
PROBE_SETS = {"Table 6": DEFAULT_PROBES, "held-out": HELDOUT_PROBES}  # the PaPaformer spec's probe sets
ROUTE_AT = {"last": False, "majority": True}  # route_at label -> probe_routes(majority=...)
PAPER_READING = "paper's routes"
PROBE_SET, ROUTE_AT_COL = C.PROBE_SET, C.ROUTE_AT  # accuracy table columns
PAPER_N_PATHS = 2  # the paper's models: routes 1, 2 = paths, 3 = combined (Gumbel)


class Probe(NamedTuple):
    """One row of a probe file."""

    line: int  # 1-based line number in the file
    prompt_id: str
    domain: str
    expected_path: int
    prompt: str
    cells: dict[str, str]  # every column of the row by header name (paper_* columns included)


def probe_source_name(source: str | os.PathLike | IO) -> str:
    """How messages name a probe source: its path, or "the probe file" for an unnamed stream."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else "the probe file"


def _probe_lines(source: str | os.PathLike | IO, name: str) -> Iterator[tuple[int, str]]:
    """(line number, text without its line end) of a path or an open text/binary stream, a line at
    a time (`analysis.inputs.files.iter_lines`: a line over MAX_LINE_BYTES is refused after reading that
    much; bytes are decoded as UTF-8 line by line, so a bad byte is reported with its line and byte
    offset). A path that is not a regular file (a FIFO, a device) is refused without waiting on it."""
    if isinstance(source, (str, os.PathLike)):
        with open_regular_file(source, "probe file") as f:
            yield from iter_lines(f, name, "probe file")
        return
    if isinstance(source, (io.RawIOBase, io.BufferedIOBase)):
        yield from iter_lines(source, name, "probe file")
        return
    offset = 0
    for n, raw in enumerate(source, start=1):  # any other iterable of lines (text or bytes)
        if len(raw) > MAX_LINE_BYTES + 2:
            raise ValueError(f"{name}: line {n} is longer than {MAX_LINE_BYTES >> 20} MiB, the limit for one line "
                             f"of a probe file")
        if isinstance(raw, bytes):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{name}: line {n} (byte offset {offset + e.start}) is not UTF-8 text "
                                 f"({e.reason}); save the probe file as UTF-8") from None
            offset += len(raw)
        else:
            text = raw
        if n == 1:
            text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark
        yield n, text.removesuffix("\n").removesuffix("\r")


def _probe_header(fields: list[str], name: str) -> list[str]:
    missing = [c for c in REQUIRED if c not in fields]
    unknown = [c for c in fields if c not in REQUIRED and not c.startswith(PAPER_PREFIX)]
    repeated = sorted({c for c in fields if fields.count(c) > 1})
    if missing or unknown or repeated:
        problems = ([f"missing required column(s) {', '.join(missing)}"] if missing else []) + \
                   ([f"unknown column(s) {', '.join(unknown)}"] if unknown else []) + \
                   ([f"repeated column(s) {', '.join(repeated)}"] if repeated else [])
        raise ValueError(f"{name}: {'; '.join(problems)}. A probe file is a TSV with columns "
                         f"{', '.join(REQUIRED)} and optional paper_* columns; found: {', '.join(fields) or 'none'}")
    return fields


def iter_probes(source: str | os.PathLike | IO = DEFAULT_PROBES) -> Iterator[Probe]:
    """Read a probe TSV strictly, one row at a time (memory: the prompt_ids seen, for duplicates).

    The first non-empty line is the header: the REQUIRED columns, optional paper_* columns, nothing
    else. Every other non-empty line must have exactly the header's number of tab-separated fields
    (no quoting: a prompt holds no tab or newline). ValueError names the file, the line and the
    problem: bytes that are not UTF-8 (with the byte offset), a wrong number of fields, an
    expected_path that is not a 1-based number in ASCII digits, an empty prompt_id or prompt, a
    duplicate prompt_id, no header, no rows."""
    name = probe_source_name(source)
    header: list[str] | None = None
    seen: dict[str, int] = {}  # prompt_id -> line
    for n, text in _probe_lines(source, name):
        if not text:
            continue
        fields = text.split("\t")
        if header is None:
            header = _probe_header(fields, name)
            continue
        if len(fields) != len(header):
            raise ValueError(f"{name}: line {n} has {len(fields)} tab-separated fields, the header has "
                             f"{len(header)} ({', '.join(header)})")
        cells = dict(zip(header, fields))
        pid, expected, prompt = cells[C.PROMPT_ID], cells[C.EXPECTED_PATH], cells[C.PROMPT]
        if not pid:
            raise ValueError(f"{name}: line {n}: empty prompt_id")
        if pid in seen:
            raise ValueError(f"{name}: line {n}: duplicate prompt_id {pid!r} (first on line {seen[pid]})")
        if not (expected.isascii() and expected.isdigit() and int(expected) >= 1):
            raise ValueError(f"{name}: line {n}: expected_path {expected!r} is not a 1-based path number")
        if not prompt:
            raise ValueError(f"{name}: line {n}: empty prompt")
        seen[pid] = n
        yield Probe(n, pid, cells[C.DOMAIN], int(expected), prompt, cells)
    if header is None:
        raise ValueError(f"{name}: empty probe file; expected a header with {', '.join(REQUIRED)}")
    if not seen:
        raise ValueError(f"{name}: no probes (only a header)")


def read_probes(path: str | os.PathLike | IO = DEFAULT_PROBES) -> pd.DataFrame:
    """The whole probe file (`iter_probes` rules) as a table: text columns, expected_path int64."""
    rows = list(iter_probes(path))
    df = pd.DataFrame([r.cells for r in rows], columns=list(rows[0].cells), dtype=str)
    df[C.EXPECTED_PATH] = df[C.EXPECTED_PATH].astype("int64")
    return df


def expected_path_error(value: int, n_paths: int) -> str | None:
    """Why `value` cannot be a probe's expected path on a model with n_paths paths, or None."""
    if 1 <= value <= n_paths:
        return None
    return f"expected_path {value} is out of range 1..{n_paths} (the checkpoint has {n_paths} paths)"


def require_table6(model: Any) -> RouteReader:
    """The model's `RouteReader` if Table 6 routes are defined for it (a PaPaformer's parallel
    layers: this is the family's own analysis module), else ValueError."""
    if not isinstance(model, Papaformer):
        raise ValueError(f"Table 6 routes need a PaPaformer checkpoint (family 'papaformer'), "
                         f"not {model.config.label!r}")
    return papaformer_reader(model)


def prompt_routes(per_token: np.ndarray, lengths: Sequence[int], *, majority: bool = False) -> np.ndarray:
    """(L, B, T) token routes -> (B, L): the route at each row's last real token (row b has
    lengths[b] real tokens, then padding), or the most frequent defined route over its real
    tokens (ties: the lower route). 0 = undefined."""
    L, B, _ = per_token.shape
    out = np.zeros((B, L), dtype=np.int64)
    for b, n in enumerate(lengths):
        if not majority:
            out[b] = per_token[:, b, n - 1]
            continue
        for layer in range(L):
            vals = per_token[layer, b, :n]
            vals = vals[vals > 0]
            out[b, layer] = np.bincount(vals).argmax() if len(vals) else 0  # argmax: lowest on ties
    return out


def layer_routes(trace: Trace, model: Any, *, majority: bool = False, position: int = -1) -> pd.DataFrame:
    """Per batch row and parallel layer: the 1-based route at `position` (or the majority over
    all positions). Share-Linear layers whose cosine is undefined (fused grow) get NA. Pure."""
    reader = require_table6(model)
    per_token = reader.routes(trace)  # (L, B, T)
    L, B, T = per_token.shape
    if not majority:  # the route at `position` is the route at the last token of a row cut there
        per_token, T = per_token[:, :, : range(T)[position] + 1], range(T)[position] + 1
    routes = prompt_routes(per_token, [T] * B, majority=majority)  # (B, L)
    df = pd.DataFrame({C.BATCH: np.tile(np.arange(B), L), C.LAYER: np.repeat(reader.layers, B),
                       C.ROUTE: routes.T.ravel()})
    df[C.ROUTE] = df[C.ROUTE].astype("Int64").mask(df[C.ROUTE] == 0)
    return df


def encode_probe(tokenizer: Any, probe_id: str, prompt: str, context: int) -> list[int]:
    """Token ids of a probe's prompt; prompts longer than the context keep their last tokens."""
    ids = tokenizer.encode(prompt).ids[-context:]
    if not ids:
        raise ValueError(f"probe {probe_id}: the prompt encodes to no tokens")
    return ids


@torch.inference_mode()
def batch_routes(model: Any, batch: Sequence[Sequence[int]], *, majority: bool = False,
                 ablation: Ablation | None = None) -> np.ndarray:
    """(B, n_parallel_layers) 1-based routes (0 = undefined) of prompts run as one right-padded
    batch with deterministic routing, under `ablation` if given (a dropped path is never a route:
    Gumbel routers do not pick it). Under causal attention no real token sees the padding, and
    padded positions are never read, so each row's routes are those of its prompt run alone (up to
    float rounding of the batched kernels)."""
    reader = require_table6(model)
    lengths = [len(ids) for ids in batch]
    T, pad = max(lengths), max(0, model.config.pad_id)
    x = torch.tensor([list(ids) + [pad] * (T - len(ids)) for ids in batch], device=model.device)  # (B, T)
    with tracing(reader.sites) as tr:
        model(x, ablation=ablation)
    return prompt_routes(reader.routes(tr), lengths, majority=majority)


def stream_routes(model: Any, tokenizer: Any, probes: Iterable[Probe], *, majority: bool = False,
                  batch_size: int = 32, chunk_size: int = 1024, ablation: Ablation | None = None
                  ) -> Iterator[tuple[list[Probe], np.ndarray]]:
    """Route probes read lazily, `chunk_size` at a time: yields (probes of the chunk, their routes
    (n, n_parallel_layers), 0 = undefined) in input order. Within a chunk prompts run in batches
    of `batch_size` after sorting by token length, so batches carry little padding. Memory holds
    one chunk. `ablation`: as `batch_routes`."""
    chunk: list[Probe] = []
    for probe in probes:
        chunk.append(probe)
        if len(chunk) == chunk_size:
            yield chunk, _chunk_routes(model, tokenizer, chunk, majority, batch_size, ablation)
            chunk = []
    if chunk:
        yield chunk, _chunk_routes(model, tokenizer, chunk, majority, batch_size, ablation)


def _chunk_routes(model, tokenizer, chunk: list[Probe], majority: bool, batch_size: int,
                  ablation: Ablation | None = None) -> np.ndarray:
    ids = [encode_probe(tokenizer, p.prompt_id, p.prompt, model.context) for p in chunk]
    order = sorted(range(len(ids)), key=lambda k: len(ids[k]))
    out = np.zeros((len(ids), len(require_table6(model).layers)), dtype=np.int64)
    for k in range(0, len(order), batch_size):
        rows = order[k:k + batch_size]
        out[rows] = batch_routes(model, [ids[r] for r in rows], majority=majority, ablation=ablation)
    return out


def probe_routes(model: Any, tokenizer: Any, probes: pd.DataFrame, *, majority: bool = False,
                 batch_size: int = 32, ablation: Ablation | None = None) -> pd.DataFrame:
    """Route every probe (deterministic routing, under `ablation` if given; batched as
    `stream_routes`) and return one row per (probe, parallel layer): prompt_id, domain,
    expected_path, layer, route, correct. Prompts longer than the context keep their last tokens."""
    reader = require_table6(model)
    rows = [Probe(0, pid, domain, int(expected), prompt, {}) for pid, domain, expected, prompt in
            zip(probes[C.PROMPT_ID], probes[C.DOMAIN], probes[C.EXPECTED_PATH], probes[C.PROMPT])]
    for p in rows:
        problem = expected_path_error(p.expected_path, model.config.n_paths)
        if problem:
            raise ValueError(f"probe {p.prompt_id}: {problem}")
    if ablation is not None:
        ablation.validate(model.routing_layers())  # a bad ablation names itself, not a probe
    routes = np.concatenate([r for _, r in stream_routes(model, tokenizer, rows, majority=majority,
                                                         batch_size=batch_size, ablation=ablation)])  # (N, L)
    N, L = routes.shape
    df = pd.DataFrame({C.PROMPT_ID: np.repeat([p.prompt_id for p in rows], L),
                       C.DOMAIN: np.repeat([p.domain for p in rows], L),
                       C.EXPECTED_PATH: np.repeat([p.expected_path for p in rows], L).astype("int64"),
                       C.LAYER: np.tile(reader.layers, N),
                       C.ROUTE: pd.array(routes.ravel(), dtype="Int64")})
    df[C.ROUTE] = df[C.ROUTE].mask(df[C.ROUTE] == 0)
    return _with_correct(df)


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
        route = parse_route(cell)
        if route is None:
            raise ValueError(f"probe {pid}: {col} = {cell!r} is not a route like 2>2>1")
        rows += [(pid, domain, int(expected), parallel_layer(i), r) for i, r in enumerate(route)]
    df = pd.DataFrame(rows, columns=[C.PROMPT_ID, C.DOMAIN, C.EXPECTED_PATH, C.LAYER, C.ROUTE])
    df[C.ROUTE] = df[C.ROUTE].astype("Int64")
    return _with_correct(df)


def parse_route(cell: str) -> list[int] | None:
    """"2>2>1" -> [2, 2, 1] (ASCII digits, spaces around them allowed); None if it is no route."""
    parts = [p.strip() for p in cell.split(">")] if cell else []
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


def format_routes(routes: Sequence[Any]) -> str:
    """[2, 2, 1] -> "2>2>1" (undefined routes as "?")."""
    return ">".join("?" if r is pd.NA or r is None else str(int(r)) for r in routes)


def table6(routes: pd.DataFrame, probes: pd.DataFrame, paper: pd.DataFrame | None = None,
           ablation: Ablation | None = None) -> pd.DataFrame:
    """One row per probe: prompt_id, domain, expected_path, prompt, routes ("2>2>1", layers in
    order), when given the paper's routes beside them, and when given the ablation our routes were
    taken under (column `ablation`, `Ablation.describe()`: "none" for an empty one; the paper's
    routes are always unablated)."""
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
    if ablation is not None:
        out[C.ABLATION] = ablation.describe()
    return out.reset_index(drop=True)


def table6_summary(config: Any, *, ours: "pd.DataFrame | RouteTally | None" = None,
                   paper: "pd.DataFrame | RouteTally | None" = None) -> pd.DataFrame:
    """The Table 6 summary (source, metric, value) of our routes (source "ours", counted on the
    checkpoint's paths) and the paper's (source "paper", on the paper's PAPER_N_PATHS), whichever
    are given: a `probe_routes` / `paper_routes` table or a `RouteTally`. The combined share is a
    row when the model has a combined route (`config.has_combined_route`). The one summary the app,
    `routescope routes`, the report and the checkpoint table show."""
    def summary(routes: Any, n_paths: int, source: str) -> pd.DataFrame:
        tally = routes if isinstance(routes, RouteTally) else RouteTally.of(routes)
        return tally.summary(n_paths, combined=config.has_combined_route, source=source)

    parts = [summary(r, n, src) for r, n, src in ((ours, config.n_paths, "ours"), (paper, PAPER_N_PATHS, "paper"))
             if r is not None]
    return pd.concat(parts, ignore_index=True) if parts else \
        pd.DataFrame(columns=[C.SOURCE, C.METRIC, C.VALUE])


def route_summary(routes: pd.DataFrame, n_paths: int, *, combined: bool, source: str = "ours") -> pd.DataFrame:
    """Long table (source, metric, value): share of (prompt, layer) routes per route number ("route j",
    1-based as the paper numbers them: route j = path j - 1),
    the combined share (Gumbel), routing accuracy and the number of routes counted. Undefined
    (NA) routes are left out of every fraction."""
    return RouteTally.of(routes).summary(n_paths, combined=combined, source=source)


class RouteTally:
    """Running counts behind `route_summary`, so a summary over any number of probes needs no table
    of their routes: (prompt, layer) routes per value and routes equal to the prompt's expected path."""

    def __init__(self) -> None:
        self.per_route = np.zeros(1, dtype=np.int64)  # [k] = number of routes k (0 = undefined)
        self.n_correct = 0

    @classmethod
    def of(cls, routes: pd.DataFrame) -> "RouteTally":
        """The counts of a `probe_routes` / `paper_routes` table (NA routes count as undefined)."""
        tally = cls()
        tally.add(routes[C.ROUTE].fillna(0).to_numpy(dtype=np.int64)[:, None], routes[C.EXPECTED_PATH].to_numpy())
        return tally

    def add(self, routes: np.ndarray, expected: np.ndarray) -> None:
        """routes (n, layers), 1-based, 0 = undefined; expected (n,) 1-based expected paths."""
        counts = np.bincount(routes.ravel(), minlength=len(self.per_route))
        counts[: len(self.per_route)] += self.per_route
        self.per_route = counts
        self.n_correct += int((routes == np.asarray(expected)[:, None]).sum())  # 0 never equals a path

    def summary(self, n_paths: int, *, combined: bool, source: str = "ours") -> pd.DataFrame:
        n = int(self.per_route[1:].sum())
        count = lambda k: int(self.per_route[k]) if k < len(self.per_route) else 0  # noqa: E731
        frac = (lambda x: float(x) / n) if n else (lambda x: float("nan"))
        rows = [(f"route {j}", frac(count(j))) for j in range(1, n_paths + 1)]
        if combined:
            rows.append(("combined", frac(count(n_paths + 1))))
        rows.append(("accuracy", frac(self.n_correct)))
        rows.append(("n_routes", float(n)))
        return pd.DataFrame([(source, m, v) for m, v in rows], columns=[C.SOURCE, C.METRIC, C.VALUE])


# --- the report's probe section (the PaPaformer's `family_table.ProbeTable`) ---------------------------

def accuracy_table(config: Any, *, probe_set: str, route_at: str, ours: pd.DataFrame | None = None,
                   paper: pd.DataFrame | None = None) -> pd.DataFrame:
    """`table6_summary` of our routes or the paper's, with the probe set and the reading (last /
    majority / the paper's routes) as columns."""
    df = table6_summary(config, ours=ours, paper=paper)
    df.insert(0, ROUTE_AT_COL, route_at)
    df.insert(0, PROBE_SET, probe_set)
    return df


def probe_intended(source: Any = DEFAULT_PROBES) -> dict[str, dict[str, int]]:
    """{"domain": {domain: option}} from a probe file: the option (expected_path - 1) its probes of
    that domain expect most often."""
    probes = read_probes(source)
    out = {}
    for dom, g in probes.groupby(C.DOMAIN, sort=False):
        out[str(dom)] = int(g[C.EXPECTED_PATH].mode().min()) - 1
    return {C.DOMAIN: out}


def probe_accuracy(model: Any, tokenizer: Any, sets: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Routing accuracy of each probe set at the last prompt token and by majority over its tokens,
    and of the paper's printed routes where the file has them: the long accuracy table (probe_set,
    route_at, source, metric, value) and the per-probe tables ("Table 6, last" -> `table6`)."""
    cfg, acc, tables = model.config, [], {}
    for set_name, source in sets.items():
        probes = read_probes(source)
        paper = paper_routes(probes, cfg.combiner)
        for at, majority in ROUTE_AT.items():
            ours = probe_routes(model, tokenizer, probes, majority=majority)
            acc.append(accuracy_table(cfg, ours=ours, probe_set=set_name, route_at=at))
            tables[f"{set_name}, {at}"] = table6(ours, probes, paper)
        if paper is not None:  # the paper printed one route per layer: no last / majority reading
            acc.append(accuracy_table(cfg, paper=paper, probe_set=set_name, route_at=PAPER_READING))
    accuracy = pd.concat(acc, ignore_index=True) if acc else \
        pd.DataFrame(columns=[PROBE_SET, ROUTE_AT_COL, C.SOURCE, C.METRIC, C.VALUE])
    return accuracy, tables


REPORT_NOTE = ("Accuracy = share of (prompt, layer) routes equal to the prompt's expected path (the combined "
               "route never counts as correct); \"paper\" = the routes printed in the paper's Table 6 (its models "
               "have 2 paths).")
