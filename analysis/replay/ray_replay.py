"""`routescope replay --engine ray`: the reference forwards on Ray actors (each loads the checkpoint once,
in the replay's dtype and, where asked, a float32 copy), the checks and the comparison in this process,
in trace order. At most `2 * workers` batches are in flight: the trace still streams.

Needs the `distributed` extra; ray is imported inside `ray_references`, so the base install never needs it.
"""
from __future__ import annotations

import shutil
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from routescope.core_models.checkpoint import load_checkpoint

from routescope.analysis.ray_cluster import checkpoint_files, connect
from routescope.analysis.replay.compare import Reference, Shape, reference_routes
from routescope.analysis.replay.run import Batch, References


@dataclass(frozen=True)
class RaySpec:
    """checkpoint: its directory; dtype: as `load_checkpoint` takes it; float32: a float32 reference too."""

    checkpoint: str | Path
    workers: int
    dtype: str
    float32: bool


class _Worker:
    """A Ray actor: the checkpoint (its files, written to a temporary directory) loaded once."""

    def __init__(self, files: dict[str, bytes], dtype: str, float32: bool) -> None:
        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory(prefix="rs-replay-") as d:
            for name, data in files.items():
                (Path(d) / name).write_bytes(data)
            self.model, _ = load_checkpoint(d, dtype=dtype)
        self.model32 = self.model.float32_copy() if float32 else None

    def references(self, shape: Shape, ids: list[np.ndarray]) -> tuple[list[Reference], list[np.ndarray] | None]:
        r32 = [r.ids for r in reference_routes(self.model32, shape, ids)] if self.model32 is not None else None
        return reference_routes(self.model, shape, ids), r32


def ray_references(spec: RaySpec):
    """A `replay(references=...)` argument: given the model's shape, `References` computed by
    `spec.workers` actors (a local cluster is started, and stopped after, unless Ray is running or
    RAY_ADDRESS names one), batches yielded in the order they came."""
    def for_shape(shape: Shape) -> References:
        def refs(batches: Iterator[Batch]):
            import ray  # optional heavy dependency (the distributed extra)

            started, tmp = connect(spec.workers, 1)
            actors: list = []
            try:
                worker = ray.remote(num_cpus=1)(_Worker)
                files = ray.put(checkpoint_files(spec.checkpoint))
                actors = [worker.remote(files, spec.dtype, spec.float32) for _ in range(spec.workers)]
                flight: deque = deque()
                for n, batch in enumerate(batches):
                    ids = [row.token_ids for row, _ in batch if len(row.token_ids)]
                    flight.append((batch, actors[n % len(actors)].references.remote(shape, ids) if ids else None))
                    while len(flight) >= 2 * len(actors):
                        yield _done(ray, *flight.popleft())
                while flight:
                    yield _done(ray, *flight.popleft())
            finally:
                for a in actors:
                    ray.kill(a)
                if started:
                    ray.shutdown()
                    if tmp:
                        shutil.rmtree(tmp, ignore_errors=True)
        return refs
    return for_shape


def _done(ray, batch: Batch, ref):
    if ref is None:
        return batch, [], None
    refs, r32 = ray.get(ref)
    return batch, refs, r32
