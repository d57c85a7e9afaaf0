"""A Ray cluster for the engines that run on one (`routescope export --engine ray`, the importance sweep's
Ray workers): connecting to it or starting a local one, and the checkpoint's files shipped to actors.

Needs the `distributed` extra; ray is imported inside the functions, so the base install never needs it.
"""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from routescope.core_models.checkpoint import checkpoint_files as _files

LOCAL_OBJECT_STORE = 512 * 2**20  # bytes; prompts and per-partition summaries are all that travel


def checkpoint_files(checkpoint: str | Path) -> dict[str, bytes]:
    """The checkpoint's files by name, for the object store: cluster nodes then need no copy of it."""
    return {f.name: f.read_bytes() for f in _files(checkpoint)}


def connect(workers: int, threads: int) -> tuple[bool, str | None]:
    """Connect to Ray: the running instance, the cluster in RAY_ADDRESS, or a local cluster with
    `workers * threads + 1` logical CPUs, no dashboard, a bounded object store and its session files
    in a temporary directory. Returns (whether this call started Ray, the temporary session
    directory it made): the caller shuts Ray down and removes the directory when it started them."""
    import ray  # optional heavy dependency (the distributed extra)

    if ray.is_initialized():
        return False, None
    quiet = dict(logging_level=logging.WARNING, log_to_driver=True)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**quiet)  # the cluster in RAY_ADDRESS
        return True, None
    tmp = tempfile.mkdtemp(prefix="rs-ray-")  # short: Ray's socket paths live under it
    cpus = workers * threads + 1  # the actors, and one for reading and grouping the prompts
    ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE, _temp_dir=tmp, **quiet)
    return True, tmp
