"""A safetensors file's header (every tensor's name, shape and dtype, no tensor data), and the error a
checkpoint's files raise. Below both loaders: RouteScope's own checkpoints (`checkpoint`) and
transformers directories (`hf.load`) read their headers here."""
from __future__ import annotations

import math
import os

import torch
from safetensors import safe_open

from .devices import STORED

Header = dict[str, tuple[tuple[int, ...], str]]  # tensor name -> (shape, safetensors dtype name)


class CheckpointError(ValueError):
    """A checkpoint directory is incomplete or does not match its config; the message lists what."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(" ".join(message.split("\n")))  # always one line: shown as-is by the CLI and app
        self.problems = problems or []


def read_header(weights: str | os.PathLike) -> Header:
    """Every tensor's name, shape and dtype from the safetensors header; no tensor data is read."""
    try:
        with safe_open(str(weights), framework="pt") as f:
            return {k: (tuple(s.get_shape()), s.get_dtype()) for k in f.keys() for s in (f.get_slice(k),)}
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{weights}: not a readable safetensors file ({e})") from None


def stored_dtype(header: Header) -> torch.dtype | None:
    """The floating dtype most of a checkpoint's parameters are stored in (by count), or None."""
    counts: dict[torch.dtype, int] = {}
    for shape, name in header.values():
        if name in STORED:
            counts[STORED[name]] = counts.get(STORED[name], 0) + math.prod(shape)
    return max(counts, key=counts.get) if counts else None
