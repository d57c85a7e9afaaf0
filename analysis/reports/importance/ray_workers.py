"""The sweep's batches measured by Ray actors (`importance(engine="ray")`): each actor loads the
checkpoint once and runs `measure.measure_batch` per batch, the same computation as one process.

Needs the `distributed` extra; ray is imported inside `on_ray` so the base install never needs it.
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint

from routescope.analysis.corpus.run import Stopped
from routescope.analysis.ray_cluster import checkpoint_files, connect
from routescope.analysis.reports.importance.measure import measure_batch
from routescope.analysis.reports.importance.plan import ImportanceSettings


@dataclass(frozen=True)
class RaySpec:
    """Where Ray workers get the model: the checkpoint directory, loaded by each of `workers` actors
    in `dtype` (the dtype the effects are measured in here)."""

    checkpoint: str | Path
    workers: int
    dtype: str


class _Worker:
    """A Ray actor: the checkpoint (its files, written to a temporary directory) loaded once, then
    `measure_batch` per batch of rows: the same computation as one process, batch by batch."""

    def __init__(self, files: dict[str, bytes], dtype: str) -> None:
        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory(prefix="rs-imp-") as d:
            for name, data in files.items():
                (Path(d) / name).write_bytes(data)
            self.model, _ = load_checkpoint(d, dtype=dtype)

    def measure(self, rows: np.ndarray, x: torch.Tensor, lengths: torch.Tensor, ablations: list[Ablation],
                settings: ImportanceSettings, fast: bool, reuse: bool) -> tuple[np.ndarray, np.ndarray, list]:
        with torch.inference_mode():
            fast = fast and self.model.can_resume
            base, effects = measure_batch(self.model, x, lengths, ablations, settings, fast, None,
                                           reuse=fast and reuse)
        return rows, base, effects


def on_ray(spec: RaySpec, todo: list, ablations: Sequence[Ablation], settings: ImportanceSettings, fast: bool,
            stop: Callable[[], bool] | None, reuse: bool = False):
    """(rows, unablated NLL per row, effects) of each batch in `todo`, in the order Ray actors finish
    them (`spec.workers` actors, each with the checkpoint loaded once; a local cluster is started, and
    stopped after, unless Ray is running or RAY_ADDRESS names one). `stop()` is asked while waiting;
    True ends with `Stopped` and the batches in flight are dropped."""
    import ray  # optional heavy dependency (the distributed extra)
    from ray.util import ActorPool  # with ray: the distributed extra

    started, tmp = connect(spec.workers, 1)
    actors: list = []
    try:
        worker = ray.remote(num_cpus=1)(_Worker)
        files = ray.put(checkpoint_files(spec.checkpoint))
        ablations_ref, settings_ref = ray.put(list(ablations)), ray.put(settings)
        actors = [worker.remote(files, spec.dtype) for _ in range(min(spec.workers, len(todo)))]
        pool = ActorPool(actors)
        for batch in todo:
            pool.submit(lambda a, b: a.measure.remote(*b, ablations_ref, settings_ref, fast, reuse), batch)
        while pool.has_next():
            if stop is not None and stop():
                raise Stopped()
            try:
                yield pool.get_next_unordered(timeout=0.5)
            except TimeoutError:
                continue
    finally:
        for a in actors:
            ray.kill(a)
        if started:
            ray.shutdown()
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
