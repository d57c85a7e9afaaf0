"""Readers of the serving engines' routing traces, JSON lines read one line at a time.

vLLM ("vllm"; vllm-project/vllm PR #28284 "Rollout Router Replay", `vllm/outputs.py`):
`CompletionOutput.routed_experts` is an array [seq_len, num_layers, top_k] of expert ids. The
capturer records one row per token fed through the model, and the last sampled token never is,
so seq_len = len(prompt_token_ids) + len(token_ids) - 1. A line is a `RequestOutput` as JSON:
    {"request_id": str, "prompt_token_ids": [int],
     "outputs": [{"index": int, "token_ids": [int], "routed_experts": [[[int]]]}]}
(one row per output: `request_id`, or `request_id/index` when a request has several outputs), or
one output flattened into the line: {"request_id", "prompt_token_ids", "token_ids", "routed_experts"}.

SGLang ("sglang"; sgl-project/sglang PR #12162, `python/sglang/srt/managers/io_struct.py`):
`routed_experts` is base64 of int32 expert ids in C order, logical shape [num_tokens, num_layers,
top_k]; the response covers positions [routed_experts_start_len, seqlen - 1) of prompt + output.
See docs/replay.md "Trace formats" for the line layouts read.

SGLang's expert distribution recorder `per_token` dump ("sglang-per-token"): see `read_sglang_per_token`.

Every reader yields `TraceRow`s whose token_ids are the tokens the routing covers, so a sound row has
as many positions as token ids (`checks.check_row` reports any difference).
"""
from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from routescope.analysis.replay.row import TraceRow


def _lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(1-based line number, parsed object) of each non-blank line of a JSON lines file."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}: line {n}: expected a JSON object, got {type(rec).__name__}")
            yield n, rec


def sniff_json(path: Path) -> str | None:
    """"vllm" or "sglang" from the first record of a JSON lines file; None when neither."""
    try:
        for _, rec in _lines(path):
            if "routed_experts" in rec or any(isinstance(o, dict) and "routed_experts" in o
                                              for o in rec.get("outputs") or []):
                return "vllm"
            if any(isinstance(rec.get(k), dict) and "routed_experts" in rec[k] for k in ("sgl_ext", "meta_info")):
                return "sglang"
            if isinstance(rec.get("choices"), list) and rec["choices"] and isinstance(rec["choices"][0], dict) \
                    and isinstance(rec["choices"][0].get("sgl_ext"), dict):
                return "sglang"
            return None
    except (ValueError, UnicodeDecodeError):
        return None
    return None


def _ids(value, where: str) -> np.ndarray:
    """[n] int64 token ids from a JSON list of integers."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{where}: token ids must be a list of integers")
    return np.asarray(value, dtype=np.int64).reshape(-1)


def _experts3(value, where: str) -> np.ndarray:
    """[T', L, k] int64 from a nested JSON list (or list of lists of lists)."""
    try:
        a = np.asarray(value, dtype=np.int64)
    except (ValueError, TypeError):
        raise ValueError(f"{where}: routed_experts is not a rectangular array of integers") from None
    if a.ndim != 3 and not (a.ndim == 1 and a.size == 0):
        raise ValueError(f"{where}: routed_experts of shape {list(a.shape)}, expected [seq_len, num_layers, top_k]")
    return a.reshape(0, 0, 0) if a.ndim == 1 else a


def read_vllm(path: Path, **_: int | None) -> Iterator[TraceRow]:
    """vLLM request outputs with `routed_experts`, one JSON object a line (module docstring)."""
    for n, rec in _lines(path):
        rid = str(rec.get("request_id", f"line{n}"))
        where = f"{path}: line {n} (row {rid!r})"
        prompt = _ids(rec.get("prompt_token_ids"), where)
        outputs = rec["outputs"] if "outputs" in rec else [rec]
        if not isinstance(outputs, list) or not outputs:
            raise ValueError(f"{where}: `outputs` must be a non-empty list")
        for i, out in enumerate(outputs):
            row = rid if len(outputs) == 1 else f"{rid}/{out.get('index', i) if isinstance(out, dict) else i}"
            w = where if len(outputs) == 1 else f"{path}: line {n} (row {row!r})"
            if not isinstance(out, dict) or "routed_experts" not in out or out["routed_experts"] is None:
                raise ValueError(f"{w}: no routed_experts (was the engine started with enable_return_routed_experts?)")
            tokens = np.concatenate([prompt, _ids(out.get("token_ids"), w)])
            # the last sampled token is never fed through the model: no routing row for it
            yield TraceRow(row, tokens[:max(len(tokens) - 1, 0)], _experts3(out["routed_experts"], w))


def decode_base64_experts(data: str, *, n_layers: int | None, top_k: int | None, where: str) -> np.ndarray:
    """SGLang's base64 int32 routing -> [T', L, k] int64.

    L and k come from the record (`num_layers` / `top_k`) when it gives them, else the buffer is
    returned as [T' * L * k, 1, 1] ... no: both must be known; callers pass the model's when the
    record has none."""
    if not isinstance(data, str):
        raise ValueError(f"{where}: routed_experts must be a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: routed_experts is not valid base64 (truncated?)") from None
    if len(raw) % 4:
        raise ValueError(f"{where}: routed_experts holds {len(raw)} bytes, not a whole number of int32 ids (truncated?)")
    flat = np.frombuffer(raw, dtype="<i4").astype(np.int64)
    if n_layers is None or top_k is None:
        raise ValueError(f"{where}: the record does not give num_layers and top_k for routed_experts")
    if flat.size % (n_layers * top_k):
        raise ValueError(f"{where}: routed_experts holds {flat.size} ids, not a multiple of "
                         f"num_layers x top_k = {n_layers} x {top_k}")
    return flat.reshape(-1, n_layers, top_k)


READERS: dict[str, Callable[..., Iterator[TraceRow]]] = {"vllm": read_vllm}
