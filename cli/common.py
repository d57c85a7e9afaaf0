"""Helpers shared by the command modules: loading a checkpoint, JSON out."""
from __future__ import annotations

import json
import math
import sys
from typing import Any, Iterable

from routescope.core_models.checkpoint import load_checkpoint, require_tokenizer


def load(path: str, device: str = "cpu", dtype: str = "auto", **placement: Any) -> tuple[Any, Any]:
    """(model, tokenizer or None) of a checkpoint directory on `device` ("auto": CUDA, then MPS,
    else CPU) in `dtype` (`placement`: device_map, max_memory); errors name the file and field, or
    the unavailable device."""
    return load_checkpoint(path, device=device, dtype=dtype, **placement)


def load_with_tokenizer(path: str, device: str = "cpu", dtype: str = "auto", **placement: Any) -> tuple[Any, Any]:
    """`load`, and a ValueError if the checkpoint has no tokenizer (text prompts need one)."""
    model, tok = load(path, device, dtype, **placement)
    return model, require_tokenizer(tok, path)


def finite_json(obj):
    """`obj` with each NaN/Infinity float as None (null): JSON has no such numbers, and json.dump
    would write bare NaN, which strict parsers reject. Dump the result with allow_nan=False."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def write_json(doc: Any, *, indent: int | None = 1) -> None:
    """`doc` to stdout as strict JSON (non-finite numbers as null), then a newline."""
    json.dump(finite_json(doc), sys.stdout, ensure_ascii=False, indent=indent, allow_nan=False)
    sys.stdout.write("\n")


def write_json_streamed(doc: dict, key: str, items: Iterable[Any]) -> None:
    """write_json(doc with doc[key] = list(items)), writing the items one by one. doc[key] must
    hold None as a placeholder."""
    text = json.dumps(finite_json(doc), ensure_ascii=False, indent=1, allow_nan=False)
    slot = f"\n {json.dumps(key)}: null"  # unique: quotes inside strings are escaped
    head, _, tail = text.partition(slot)
    sys.stdout.write(head + slot.removesuffix("null") + "[")
    n = 0
    for item in items:
        body = json.dumps(finite_json(item), ensure_ascii=False, indent=1, allow_nan=False).replace("\n", "\n  ")
        sys.stdout.write(("," if n else "") + "\n  " + body)
        n += 1
    sys.stdout.write(("\n ]" if n else "]") + tail + "\n")
