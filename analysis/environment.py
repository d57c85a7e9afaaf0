"""The contract between `routescope app` (or any launcher) and the Streamlit process, in one place:
the environment variables the explorer reads, and how the command line sets them."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

ENV_ROOTS = "ROUTESCOPE_CHECKPOINTS"  # checkpoint roots besides the shipped one, separated by os.pathsep
ENV_DEVICE = "ROUTESCOPE_DEVICE"  # where the app runs models: auto, cpu, cuda, mps (`--device`)
ENV_DTYPE = "ROUTESCOPE_DTYPE"  # auto (as stored), float32, bfloat16, float16 (`--dtype`)
ENV_DEVICE_MAP = "ROUTESCOPE_DEVICE_MAP"  # none (one device) or auto (accelerate's placement; `--device-map`)
ENV_MAX_MEMORY = "ROUTESCOPE_MAX_MEMORY"  # with auto: "cpu=20GiB,0=70GiB" (`--max-memory`)
ENV_THREADS = "ROUTESCOPE_THREADS"  # torch CPU threads of the app process (default 1)
ENV_MAX_UPLOAD_MB = "ROUTESCOPE_MAX_UPLOAD_MB"  # largest checkpoint upload the app accepts (default 100)


def extra_roots(env: Mapping[str, str] = os.environ) -> list[str]:
    return [p for p in env.get(ENV_ROOTS, "").split(os.pathsep) if p]


def device_setting(env: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(device, dtype) the app loads models with: "auto" and "auto" unless the environment says."""
    return env.get(ENV_DEVICE, "auto"), env.get(ENV_DTYPE, "auto")


def placement_setting(env: Mapping[str, str] = os.environ) -> tuple[str, str | None]:
    """(device map, max memory) the app loads transformers models with: "none" and None unless set."""
    return env.get(ENV_DEVICE_MAP, "none"), env.get(ENV_MAX_MEMORY) or None


def app_threads(env: Mapping[str, str] = os.environ) -> int:
    return int(env.get(ENV_THREADS, "1"))


def max_upload_bytes(env: Mapping[str, str] = os.environ) -> int:
    return int(float(env.get(ENV_MAX_UPLOAD_MB, "100")) * 2**20)


def app_environment(device: str, dtype: str, roots: Sequence[str] = (),
                    env: Mapping[str, str] = os.environ, device_map: str = "none",
                    max_memory: str | None = None) -> dict[str, str]:
    """The environment `routescope app` starts Streamlit with: `env` plus the device, dtype, device
    map and the checkpoint roots given on the command line (before any the environment already names)."""
    out = dict(env, **{ENV_DEVICE: device, ENV_DTYPE: dtype, ENV_DEVICE_MAP: device_map})
    if max_memory:
        out[ENV_MAX_MEMORY] = max_memory
    if roots:
        out[ENV_ROOTS] = os.pathsep.join([*roots, *extra_roots(env)])
    return out
