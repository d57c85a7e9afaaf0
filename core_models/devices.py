"""Where a model runs: device names resolved against this machine, the dtypes it may run in, and
moving a model there.

`--device auto` takes CUDA when torch sees a GPU, else Apple's MPS, else the CPU. A named device
that is not available is refused with one line (never a silent fall-back to the CPU, which would
make a "GPU" benchmark measure the CPU).

`--dtype auto` (the default everywhere) loads a model in the dtype its checkpoint stores
(`run_dtype`), and before any weight is read the loader checks that it fits (`require_fits`).

Reduced precision (`bfloat16`, `float16`) applies to the parameters only: the position tables the
models compute at construction (RoPE / SRPE cos and sin) stay float32 buffers, and every family
already runs its norms, rotary, softmaxes and logits in float32. Token inputs, the routing
generator (Gumbel noise is drawn on the CPU, so sampled routes do not depend on the device) and
recorded traces (`trace.Trace`: CPU, float32) are independent of where the model runs.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

DEVICES = ("auto", "cpu", "cuda", "mps")  # what the command line and the app offer
AUTO = "auto"  # the dtype the checkpoint stores (`stored_dtype`), float32 for float16 on the CPU
DTYPES = {AUTO: None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# safetensors' dtype names of the floating dtypes a checkpoint may store
STORED = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def cuda_available() -> bool:
    return torch.cuda.is_available()


def mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """"auto" (or None) -> cuda if available, else mps, else cpu. "cpu", "cuda", "cuda:N", "mps"
    and "meta" (shapes only; tests) are checked against what this machine has; ValueError otherwise."""
    if isinstance(name, torch.device):
        name = str(name)
    name = "auto" if name is None else str(name).strip().lower()
    if name == "auto":
        return torch.device("cuda" if cuda_available() else "mps" if mps_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r}: expected one of {', '.join(DEVICES)} (or cuda:N)") from None
    if dev.type == "cuda":
        if not cuda_available():
            built = "built without CUDA" if torch.version.cuda is None else "sees no CUDA device"
            raise ValueError(f"device {name!r}: not available (torch {torch.__version__} {built}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        if not mps_available():
            raise ValueError(f"device {name!r}: Apple MPS is not available here; use --device cpu")
    elif dev.type not in ("cpu", "meta"):
        raise ValueError(f"device {name!r}: expected one of {', '.join(DEVICES)} (or cuda:N)")
    return dev


DEVICE_MAPS = ("none", "auto")  # --device-map: one device, or accelerate's placement over GPUs, CPU and disk
_SIZE = re.compile(r"\d+(\.\d+)?\s*([KMGT]i?B|B)?", re.IGNORECASE)


def resolve_device_map(name: str | None) -> str | None:
    """"auto" -> "auto" (accelerate places the model); None, "" or "none" -> None (one device)."""
    name = "none" if name is None else str(name).strip().lower()
    if name in ("", "none"):
        return None
    if name != "auto":
        raise ValueError(f"device map {name!r}: expected auto or none")
    return name


def parse_max_memory(spec: str | dict | None) -> dict | None:
    """"cpu=20GiB,0=70GiB" -> {"cpu": "20GiB", 0: "70GiB"}: accelerate's max_memory, per device (a
    GPU by index, "cpu"), in bytes or with a unit. A dict passes through; None stays None."""
    if spec is None or isinstance(spec, dict):
        return spec
    out: dict = {}
    for part in filter(None, (p.strip() for p in str(spec).split(","))):
        where, eq, size = (x.strip() for x in part.partition("="))
        where = where.lower().removeprefix("cuda:")
        if not eq or not (where == "cpu" or where.isdigit()) or not _SIZE.fullmatch(size):
            raise ValueError(f"max memory {part!r}: expected DEVICE=SIZE, DEVICE cpu or a GPU index, SIZE like "
                             "20GiB (e.g. cpu=20GiB,0=70GiB)")
        out[int(where) if where.isdigit() else where] = int(size) if size.isdigit() else size.replace(" ", "")
    if not out:
        raise ValueError(f"max memory {spec!r}: expected DEVICE=SIZE[,DEVICE=SIZE] (e.g. cpu=20GiB,0=70GiB)")
    return out


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """"float32" | "bfloat16" | "float16" (or the torch dtype) -> the torch dtype; "auto" (or None)
    -> None: the loader takes the checkpoint's own (`run_dtype`)."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype {dtype}: expected one of {', '.join(DTYPES)}")
        return dtype
    name = str(dtype).strip().lower().removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def run_dtype(asked: torch.dtype | None, stored: torch.dtype | None, device: torch.device) -> torch.dtype:
    """The dtype a model runs in: the one asked for, else ("auto") the one its checkpoint stores,
    except float16 on the CPU (slow and partly unsupported there: float32, as the shipped float16
    checkpoints always ran) and a checkpoint that says nothing (float32)."""
    if asked is not None:
        return asked
    if stored is None or (stored == torch.float16 and device.type == "cpu"):
        return torch.float32
    return stored


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) and anything odd: None


def available_memory(device: torch.device) -> tuple[int, str] | None:
    """Bytes a model may still take on `device`, and where that figure comes from: the GPU's free
    memory; on the CPU the cgroup's limit less its usage (containers) where that is smaller than the
    kernel's MemAvailable. None where nothing can be read (then nothing is refused)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"free on {device}"
    if device.type != "cpu":
        return None
    found = []
    limit, used = _read_int(Path("/sys/fs/cgroup/memory.max")), _read_int(Path("/sys/fs/cgroup/memory.current"))
    if limit is not None and used is not None:
        found.append((max(0, limit - used), "the cgroup's memory limit less its usage"))
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "MemAvailable"))
    except (OSError, ValueError, IndexError):
        pass
    return min(found) if found else None


class TooLarge(ValueError):
    """A model that would not fit in the memory its device has free (`require_fits`)."""


HEADROOM = 512 * 2**20  # besides the parameters: activations of a short prompt, the interpreter's own growth


def require_fits(n_params: int, dtype: torch.dtype, device: torch.device, where: str) -> None:
    """ValueError in one line, before any weight is read, when `n_params` parameters in `dtype`
    (plus HEADROOM) exceed what `device` has free: both figures and the way out. The process is
    never left to the kernel's out-of-memory killer."""
    if device.type == "meta":
        return
    have = available_memory(device)
    need = n_params * torch.finfo(dtype).bits // 8 + HEADROOM
    if have is None or need <= have[0]:
        return
    name = str(dtype).removeprefix("torch.")
    smaller = "; or load it as bfloat16 (--dtype bfloat16)" if dtype == torch.float32 else ""
    raise TooLarge(f"{where}: needs about {need / 2**30:.1f} GiB as {name} ({n_params / 1e9:.2f}B parameters) "
                     f"but {have[0] / 2**30:.1f} GiB is available on {device} ({have[1]}): use a machine with "
                     f"more memory{smaller}")


def model_device(model: nn.Module) -> torch.device:
    """Where a model's inputs go: the model's own `device` (a RouteScopeLM's under a device map is the
    input embedding's; a transformers model's the first parameter's), else the device of the first
    parameter."""
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else next(model.parameters()).device


def place(model: nn.Module, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> nn.Module:
    """Move every parameter and buffer to `device` and floating parameters to `dtype`; buffers keep
    their dtype (the float32 position tables). Tied parameters stay one Parameter (its data is
    replaced in place). Returns the model."""
    if device is not None:
        model.to(device)
    if dtype is not None:
        for p in model.parameters():  # deduplicated: a tied weight is cast once
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
    return model


def describe(model: nn.Module) -> str:
    """"cpu · float32", "cuda:0 · bfloat16": where and in what the parameters are."""
    p = next(model.parameters())
    return f"{p.device} · {str(p.dtype).removeprefix('torch.')}"


# bfloat16 against float32 (CPU, shipped checkpoints; benchmarks/bench_precision.py measures it, the
# README states it, tests/models/test_devices.py checks it). Routing values (probabilities, weights,
# cosines, shares) have scale 1; logits are compared to the largest |logit| of the prompt.
# Measured (200 corpus prompts): routing values <= 0.0071 and logits <= 0.021 of their scale; 0.1-0.35%
# of routing decisions flip, each a float32 near tie (margin <= 0.0029). MoEP is the exception for
# values and logits: where a near tie flips a hard top-k expert choice, everything downstream of it
# moves (values up to 0.18, logits up to 0.15 of their scale).
BF16_TOL = 0.0625  # 16 units of bfloat16 rounding (2**-8) of the scale: values, logits, decision margins