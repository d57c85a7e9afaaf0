"""SGLang's expert distribution recorder `per_token` dump ("sglang-per-token"), read as requests.

The layout (sgl-project/sglang `python/sglang/srt/eplb/expert_distribution.py`: `_DetailSinglePassGatherer`,
`_DetailAccumulator.dump`): `torch.save` of {"records": [...], "last_physical_to_logical_map":
[num_layers, num_physical_experts]}, one record per forward pass with `forward_pass_id`, `rank`,
`input_ids` (the pass's tokens, flat over its batch), `positions` (each token's position in its
sequence), `extend_seq_lens`, `forward_mode` and `topk_ids_of_layer` [num_layers, num_tokens, 8]:
physical expert ids, -1 where nothing was written (slots past the model's k: the gatherer keeps 8,
DeepSeek-V3's k; layers without routing).

Where the format allows: the records carry no request id (`rids` is a TODO there), so a request is
rebuilt from positions: a pass whose positions are one run 0, 1, ... starts a request, a pass
continuing the run (position = the request's length) extends it (chunked prefill, then one pass
per decoded token). That holds when the server runs one request at a time
(`--max-running-requests 1`) without prefix-cache hits (`--disable-radix-cache`); a pass holding
several requests, or one that skips positions, is a one-line error naming the pass. Physical ids
are mapped to logical experts with `last_physical_to_logical_map` (the identity without expert
redundancy); slots that are -1 at every position of a request are dropped (k), and so are layers
that are -1 throughout (layers without routing). Row ids are "rank<r>/pass<first forward pass>".
The dump is one pickle-free `torch.save` file (read with weights_only=True) and is read whole.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from routescope.analysis.replay.row import TraceRow


def _load(path: Path) -> dict:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  torch raises many types for a file that is not its format
        raise ValueError(f"{path}: not a torch.save file SGLang's recorder wrote ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise ValueError(f"{path}: not a per_token expert distribution dump (no `records` list; a `stat` dump holds "
                         "only counts and cannot be replayed)")
    return data


def _finish(rid: str, tokens: list[np.ndarray], experts: list[np.ndarray]) -> TraceRow:
    """One rebuilt request: drop the slots and layers that are -1 throughout."""
    e = np.concatenate(experts)  # [T, L, 8]
    written = e >= 0
    slots = np.flatnonzero(written.any(axis=(0, 1)))
    k = int(slots[-1]) + 1 if len(slots) else 0
    layers = written.any(axis=(0, 2))
    return TraceRow(rid, np.concatenate(tokens), e[:, layers, :k])


def read_sglang_per_token(path: Path, **_: int | None) -> Iterator[TraceRow]:
    """Requests rebuilt from a `per_token` dump (module docstring), in the order they ran."""
    data = _load(path)
    p2l = data.get("last_physical_to_logical_map")
    p2l = None if p2l is None else np.asarray(p2l, dtype=np.int64)
    rid, tokens, experts, length = None, [], [], 0
    for i, rec in enumerate(data["records"]):
        where = f"{path}: record {i}"
        try:
            pass_id, rank = int(rec.get("forward_pass_id", i)), int(rec.get("rank", 0))
            where = f"{path}: forward pass {pass_id}"
            ids = np.asarray(rec["input_ids"], dtype=np.int64).reshape(-1)
            pos = np.asarray(rec["positions"], dtype=np.int64).reshape(-1)
            topk = rec["topk_ids_of_layer"]
            topk = (topk.numpy() if isinstance(topk, torch.Tensor) else np.asarray(topk)).astype(np.int64)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"{where}: not a per_token record (input_ids, positions, topk_ids_of_layer)") from None
        if topk.ndim != 3 or topk.shape[1] != len(ids) or len(pos) != len(ids):
            raise ValueError(f"{where}: topk_ids_of_layer of shape {list(topk.shape)} for {len(ids)} tokens and "
                             f"{len(pos)} positions (expected [num_layers, {len(ids)}, slots])")
        if not len(ids):
            continue
        if np.any(pos != pos[0] + np.arange(len(pos))):
            raise ValueError(f"{where}: positions {pos[:8].tolist()}... are not one run: the pass holds several "
                             "requests; the per_token dump is readable only with one request at a time "
                             "(--max-running-requests 1)")
        if p2l is not None:
            if p2l.shape[0] != topk.shape[0] or topk.max() >= p2l.shape[1]:
                raise ValueError(f"{where}: physical expert ids do not fit last_physical_to_logical_map "
                                 f"{list(p2l.shape)}")
            layer = np.arange(topk.shape[0])[:, None, None]
            topk = np.where(topk >= 0, p2l[layer, np.clip(topk, 0, None)], -1)
        if pos[0] == 0:
            if rid is not None:
                yield _finish(rid, tokens, experts)
            rid, tokens, experts, length = f"rank{rank}/pass{pass_id}", [], [], 0
        elif rid is None or pos[0] != length:
            raise ValueError(f"{where}: starts at position {int(pos[0])} but the request before holds {length} "
                             "tokens: requests interleave, or a prefix-cache hit skipped positions "
                             "(serve one request at a time with --disable-radix-cache)")
        tokens.append(ids)
        experts.append(topk.transpose(1, 0, 2))
        length += len(ids)
    if rid is not None:
        yield _finish(rid, tokens, experts)
