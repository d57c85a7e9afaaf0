"""The sweep's cache of measured rows: per-row sums kept in a safetensors file named by what they
depend on, so an interrupted sweep resumes where it stopped and a changed one starts afresh.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from routescope.analysis.reports.importance.measure import Sums


def cache_key(parts: dict) -> str:
    """A short digest of everything the sums depend on (weights, data, settings, ablations)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def load_cache(path: Path | None, key: str, n_ablations: int, n_rows: int) -> Sums:
    """The sums kept under `key` at `path`; empty ones when there are none, or they are for another key,
    shape or unreadable."""
    fresh = Sums.empty(n_ablations, n_rows)
    if path is None or not path.is_file():
        return fresh
    try:
        with safe_open(str(path), "numpy") as f:
            if (f.metadata() or {}).get("key") != key:
                return fresh
        t = load_file(str(path))
        s = Sums(t["d_nll"], t["kl"], t["flips"], t["base_nll"], t["done"].astype(bool))
        return s if s.d_nll.shape == (n_ablations, n_rows) else fresh
    except (OSError, SafetensorError, KeyError, ValueError):
        return fresh  # unreadable: measured again


def save_cache(path: Path | None, key: str, s: Sums) -> None:
    """Keep `s` under `key` at `path` (None: nowhere), whole or not at all (a temporary renamed)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file({"d_nll": s.d_nll, "kl": s.kl, "flips": s.flips, "base_nll": s.base_nll,
                   "done": s.done.astype(np.uint8)}, str(tmp), metadata={"key": key})
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
