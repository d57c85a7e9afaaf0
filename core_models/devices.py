"""Where a model runs: device names resolved against this machine, the dtypes it may run in, and
moving a model there.

`--device auto` takes CUDA when torch sees a GPU, else Apple's MPS, else the CPU. A named device
that is not available is refused with one line (never a silent fall-back to the CPU, which would
make a "GPU" benchmark measure the CPU).

Reduced precision (`bfloat16`, `float16`) applies to the parameters only: the position tables the
models compute at construction (RoPE / SRPE cos and sin) stay float32 buffers, and every family
already runs its norms, rotary, softmaxes and logits in float32. Token inputs, the routing
generator (Gumbel noise is drawn on the CPU, so sampled routes do not depend on the device) and
recorded traces (`runtime.Trace`: CPU, float32) are independent of where the model runs.
"""
from __future__ import annotations

import torch
from torch import nn

DEVICES = ("auto", "cpu", "cuda", "mps")  # what the command line and the app offer
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """"float32" | "bfloat16" | "float16" (or the torch dtype; None = float32)."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype {dtype}: expected one of {', '.join(DTYPES)}")
        return dtype
    name = str(dtype).strip().lower().removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's parameters (all of them live on one device)."""
    return next(model.parameters()).device


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