"""Read a routing trace, one request (`TraceRow`) at a time, whatever engine wrote it.

Formats (`FORMATS`; layouts and their sources in docs/replay.md, "Trace formats"):
- "vllm": JSON lines of vLLM request outputs with `routed_experts` (`engine_formats`);
- "sglang": JSON lines of SGLang completions with `sgl_ext.routed_experts`, base64 int32 (`engine_formats`);
- "sglang-per-token": SGLang's expert distribution recorder `per_token` dump (`engine_formats`);
- "table": a long table, Parquet or CSV, `row, position, token_id, layer, k, expert`, or
  `routescope export`'s own routing table (`table_format`).

Every reader streams: JSON lines line by line, Parquet by record batches, CSV in chunks, so a trace
of any size is read in memory bounded by its largest request (the `per_token` dump, one
`torch.save` file, is read whole). Bad input raises a one-line ValueError naming the file and the
row. A row's experts[i] is the routing of token_ids[row.start + i] (`row.TraceRow`).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from routescope.analysis.replay import engine_formats, table_format
from routescope.analysis.replay.row import TraceRow

__all__ = ["FORMATS", "TraceRow", "read_trace", "sniff_format"]

FORMATS = ("vllm", "sglang", "sglang-per-token", "table")


def sniff_format(path: str | Path) -> str:
    """The trace format of `path` from its name and first record (one of `FORMATS`)."""
    path = Path(path)
    if path.suffix.lower() in (".parquet", ".pq", ".csv"):
        return "table"
    if path.suffix.lower() in (".pt", ".pth"):
        return "sglang-per-token"
    fmt = engine_formats.sniff_json(path)
    if fmt is None:
        raise ValueError(f"{path}: unknown trace format (expected one of {', '.join(FORMATS)}; "
                         "name it with --trace-format)")
    return fmt


def read_trace(path: str | Path, *, fmt: str | None = None, n_layers: int | None = None,
               top_k: int | None = None) -> Iterator[TraceRow]:
    """Yield the trace's requests in file order; `fmt` None sniffs it (`sniff_format`).

    n_layers, top_k: the model's routing-layer count and k. SGLang's base64 routing is a flat run
    of int32 ids, shaped with these (a record's own `num_layers` / `top_k`, if any, win); the other
    formats carry their shape and ignore them. File and format errors raise at once, a bad row
    when the iteration reaches it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such trace file")
    fmt = sniff_format(path) if fmt is None else fmt
    if fmt == "table":
        return table_format.read_table(path)
    if fmt in engine_formats.READERS:
        return engine_formats.READERS[fmt](path, n_layers=n_layers, top_k=top_k)
    raise ValueError(f"{path}: unknown trace format {fmt!r} (expected one of {', '.join(FORMATS)})")
