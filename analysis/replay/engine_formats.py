"""Readers of the serving engines' routing traces, JSON lines read one line at a time.

Layouts and sources (docs/replay.md, "Trace formats", has them with examples):

vLLM ("vllm"). `CompletionOutput.routed_experts` is an array [seq_len, num_layers, top_k] of expert
ids (vllm-project/vllm PR #28284 "Rollout Router Replay", `vllm/outputs.py`). The capturer records
a row for every token fed through the model and the last sampled token never is, so seq_len =
len(prompt_token_ids) + len(token_ids) - 1 (vllm `examples/rl/routed_experts_e2e.py` asserts
exactly that). A line is one `RequestOutput` as JSON,
    {"request_id", "prompt_token_ids", "outputs": [{"index", "token_ids", "routed_experts"}]},
or one output flattened into the line ({"request_id", "prompt_token_ids", "token_ids",
"routed_experts"}), or an OpenAI completions response with token ids ({"id", "prompt_token_ids",
"choices": [{"index", "token_ids", "routed_experts"}]}). Later vLLM (PR #39917, docs
"Routed Experts Replay") splits the array: `prompt_routed_experts` [prompt_len, L, k] beside the
request's outputs and `routed_experts` [gen_len, L, k] per output; then the two are joined and cover
prompt + output. An array is nested JSON lists, or a base64 string of an `.npy` file.
Requests with several outputs give one row each: "<request_id>/<index>".

SGLang ("sglang"). `routed_experts` is base64 of little-endian int32 expert ids, logical shape
[num_tokens, num_layers, top_k], flat (sgl-project/sglang PR #12162; `routed_experts_capturer.py`).
It covers positions [routed_experts_start_len, seqlen - 1) of prompt + output
(`python/sglang/srt/managers/io_struct.py`, `GenerateReqInput.routed_experts_start_len`). A line
is a native `/generate` response ({"output_ids", "meta_info": {"id", "routed_experts",
"routed_experts_start_len"?}}) or an OpenAI completion / chat response whose `sglext` (older:
`sgl_ext`) holds `routed_experts`, at the response level (`serving_chat.py`) or in a choice; the
request's prompt ids go in the line as `input_ids` or `prompt_token_ids` (the responses do not
echo them), the output ids as `output_ids` / `token_ids` (or `meta_info.output_token_logprobs`,
(logprob, token_id, ...) tuples). The flat ids are shaped with the model's layer count and k
(`read_trace(n_layers=, top_k=)`) unless the line gives `num_layers` / `top_k`.

Every reader yields `TraceRow`s whose token_ids are the tokens the routing covers (plus, for
SGLang's start, the context before it), so a sound row has T' == T - start.
"""
from __future__ import annotations

import base64
import binascii
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from routescope.analysis.replay.row import TraceRow
from routescope.analysis.replay.sglang_dump import read_sglang_per_token

SGLANG_EXT = ("sglext", "sgl_ext")  # SGLang's OpenAI extension field, new and old spelling


def _lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(1-based line number, parsed object) of each non-blank line of a JSON lines file."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n}: not JSON ({e.msg}; a truncated line?)") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}: line {n}: expected a JSON object, got {type(rec).__name__}")
            yield n, rec


def _sglang_ext(rec: dict) -> dict | None:
    """The record's SGLang extension holding routed_experts (response level, meta_info or a choice)."""
    for holder in [rec, rec.get("meta_info")] + [c for c in rec.get("choices") or [] if isinstance(c, dict)]:
        if not isinstance(holder, dict):
            continue
        for key in SGLANG_EXT:
            if isinstance(holder.get(key), dict) and "routed_experts" in holder[key]:
                return holder[key]
        if holder is rec.get("meta_info") and "routed_experts" in holder:
            return holder
    return None


def sniff_json(path: Path) -> str | None:
    """"vllm" or "sglang" from the first record of a JSON lines file; None when neither (or not
    text); a first line that is not JSON is its one-line ValueError."""
    try:
        for _, rec in _lines(path):
            if _sglang_ext(rec) is not None:
                return "sglang"
            holders = [rec] + [o for o in (rec.get("outputs") or rec.get("choices") or []) if isinstance(o, dict)]
            if any("routed_experts" in h for h in holders):
                return "vllm"
            return None
    except UnicodeDecodeError:
        return None
    return None


def _ids(value, where: str, what: str) -> np.ndarray:
    """[n] int64 token ids from a JSON list of integers."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{where}: {what} must be a list of integer token ids")
    return np.asarray(value, dtype=np.int64).reshape(-1)


def _b64(data: str, where: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: routed_experts is not valid base64 (truncated?)") from None


def _experts3(value, where: str, what: str = "routed_experts") -> np.ndarray:
    """[T', L, k] int64 from nested JSON lists, or from base64 of an .npy file."""
    if isinstance(value, str):
        try:
            value = np.load(io.BytesIO(_b64(value, where)), allow_pickle=False)
        except (ValueError, OSError, EOFError):
            raise ValueError(f"{where}: {what} is a string but not base64 of an .npy array (truncated?)") from None
    try:
        a = np.asarray(value)
        if a.dtype.kind not in "iu" and a.size:
            raise TypeError
        a = a.astype(np.int64)
    except (ValueError, TypeError):
        raise ValueError(f"{where}: {what} is not a rectangular array of integers") from None
    if a.size == 0:
        return np.zeros((0,) + (a.shape[1:] if a.ndim == 3 else (0, 0)), dtype=np.int64)
    if a.ndim != 3:
        raise ValueError(f"{where}: {what} of shape {list(a.shape)}, expected [seq_len, num_layers, top_k]")
    return a


def read_vllm(path: Path, **_: int | None) -> Iterator[TraceRow]:
    """vLLM request outputs with `routed_experts`, one JSON object a line (module docstring)."""
    for n, rec in _lines(path):
        rid = str(rec.get("request_id", rec.get("id", f"line{n}")))
        where = f"{path}: line {n} (row {rid!r})"
        prompt = _ids(rec.get("prompt_token_ids"), where, "prompt_token_ids")
        split = rec.get("prompt_routed_experts")
        head = None if split is None else _experts3(split, where, "prompt_routed_experts")
        key = "outputs" if "outputs" in rec else "choices" if "choices" in rec else None
        outputs = rec[key] if key else [rec]
        if not isinstance(outputs, list) or not outputs:
            raise ValueError(f"{where}: `{key}` must be a non-empty list")
        for i, out in enumerate(outputs):
            idx = out.get("index", i) if isinstance(out, dict) else i
            row = rid if len(outputs) == 1 else f"{rid}/{idx}"
            w = f"{path}: line {n} (row {row!r})"
            if not isinstance(out, dict) or out.get("routed_experts") is None:
                raise ValueError(f"{w}: no routed_experts (was the engine started with enable_return_routed_experts?)")
            tokens = np.concatenate([prompt, _ids(out.get("token_ids"), w, "token_ids")])
            e = _experts3(out["routed_experts"], w)
            if head is None:  # one array: the last sampled token is never fed through the model
                yield TraceRow(row, tokens[:max(len(tokens) - 1, 0)], e)
            else:
                if e.size and head.size and e.shape[1:] != head.shape[1:]:
                    raise ValueError(f"{w}: prompt_routed_experts {list(head.shape)} and routed_experts "
                                     f"{list(e.shape)} differ in layers or k")
                yield TraceRow(row, tokens, np.concatenate([head, e]) if e.size or head.size else e)


def shape_flat(flat: np.ndarray, expected: int, n_layers: int | None, top_k: int | None, where: str) -> np.ndarray:
    """SGLang's flat ids -> [T', L, k], with the model's (L, k): read as positions of L x k ids when
    that gives `expected` positions or one more or fewer (the off-by-one the checks report); else as
    `expected` positions of another layer count when it divides so (a trace of another model: the
    checks report the layer count); else as positions of L x k ids (a length fault); ValueError when
    nothing fits or L, k are unknown. The flat buffer cannot say which reading is meant: these are
    the likelier faults first."""
    if n_layers is None or top_k is None:
        raise ValueError(f"{where}: SGLang's routed_experts is flat; give the model's layer count and top-k "
                         "(read_trace(n_layers=..., top_k=...)) or num_layers / top_k in the line")
    per = n_layers * top_k
    if flat.size % per == 0 and abs(flat.size // per - expected) <= 1:  # sound, or off by one position
        return flat.reshape(-1, n_layers, top_k)
    if expected > 0 and flat.size % expected == 0 and (flat.size // expected) % top_k == 0:
        return flat.reshape(expected, flat.size // expected // top_k, top_k)
    if flat.size % per == 0:
        return flat.reshape(-1, n_layers, top_k)
    raise ValueError(f"{where}: routed_experts holds {flat.size} ids: neither {expected} positions nor a whole number "
                     f"of positions of {n_layers} layers x top-{top_k} (truncated, or a trace of another model?)")


def _sglang_output_ids(rec: dict, choice: dict | None, where: str) -> np.ndarray:
    for holder in ([choice] if choice else []) + [rec]:
        for key in ("output_ids", "token_ids", "output_token_ids"):
            if key in holder:
                return _ids(holder[key], where, key)
    meta = rec.get("meta_info") or {}
    if isinstance(meta.get("output_token_logprobs"), list):
        try:
            return np.asarray([int(t[1]) for t in meta["output_token_logprobs"]], dtype=np.int64)
        except (TypeError, ValueError, IndexError):
            raise ValueError(f"{where}: meta_info.output_token_logprobs is not (logprob, token_id, ...) tuples") from None
    raise ValueError(f"{where}: no output token ids (output_ids, token_ids or meta_info.output_token_logprobs)")


def read_sglang(path: Path, *, n_layers: int | None = None, top_k: int | None = None) -> Iterator[TraceRow]:
    """SGLang responses with base64 `routed_experts`, one JSON object a line (module docstring)."""
    for n, rec in _lines(path):
        meta = rec.get("meta_info") if isinstance(rec.get("meta_info"), dict) else {}
        rid = str(meta.get("id", rec.get("id", rec.get("rid", f"line{n}"))))
        where = f"{path}: line {n} (row {rid!r})"
        ext = _sglang_ext(rec)
        if ext is None or ext.get("routed_experts") is None:
            raise ValueError(f"{where}: no routed_experts (request it with return_routed_experts and start the "
                             "server with --enable-return-routed-experts)")
        prompt_key = next((k for k in ("input_ids", "prompt_token_ids") if k in rec or k in meta), None)
        if prompt_key is None:
            raise ValueError(f"{where}: no prompt token ids: add the request's input_ids to the line")
        prompt = _ids(rec[prompt_key] if prompt_key in rec else meta[prompt_key], where, prompt_key)
        choices = [c for c in rec.get("choices") or [] if isinstance(c, dict)]
        if len(choices) > 1:
            raise ValueError(f"{where}: {len(choices)} choices share one routed_experts; write one line per choice")
        tokens = np.concatenate([prompt, _sglang_output_ids(rec, choices[0] if choices else None, where)])
        start = next((int(h[k]) for h in (ext, meta, rec) for k in ("routed_experts_start_len",) if h.get(k) is not None), 0)
        covered = max(len(tokens) - 1, 0)  # [start, seqlen - 1): the last sampled token is never run
        if not 0 <= start <= covered:
            raise ValueError(f"{where}: routed_experts_start_len = {start} is outside 0..{covered}")
        data = ext["routed_experts"]
        if not isinstance(data, str):
            raise ValueError(f"{where}: routed_experts must be a base64 string")
        raw = _b64(data, where)
        if len(raw) % 4:
            raise ValueError(f"{where}: routed_experts holds {len(raw)} bytes, not whole int32 ids (truncated?)")
        flat = np.frombuffer(raw, dtype="<i4").astype(np.int64)
        L, k = rec.get("num_layers", n_layers), rec.get("top_k", top_k)
        yield TraceRow(rid, tokens[:covered], shape_flat(flat, covered - start, L, k, where), None, start)


READERS: dict[str, Callable[..., Iterator[TraceRow]]] = {
    "vllm": read_vllm, "sglang": read_sglang, "sglang-per-token": read_sglang_per_token}
