"""Opening a transformers directory: its checks (`check_hf_directory`) and the loader (`load_hf`:
dtype, memory refusal, device maps)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from ..devices import DTYPES, TooLarge, require_fits, run_dtype
from ..weights import read_header, stored_dtype
from .config import DEFAULT_DTYPE_LOCK, HFConfig, _transformers_version, build_causal_lm, causal_lm_class
from .layout import UnsupportedMoE, moe_layout
from .model import HFModel
from .quirks import REFUSED

WEIGHT_SUFFIXES = (".safetensors",)
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

def check_hf_directory(path: str | os.PathLike, d: dict) -> None:
    """ValueError unless `path` holds a loadable HF model directory: a model_type not refused, safetensors
    weights (pickled ones are refused without being opened). Whether its routing can be followed is
    decided at load, from the model transformers builds (`moe_layout`)."""
    path = Path(path)
    model_type = d.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError(f"{path / 'config.json'}: model_type must be a string")
    if model_type in REFUSED:
        raise ValueError(f"{path}: model_type {model_type!r} is refused: {REFUSED[model_type]}")
    files = [p.name for p in path.iterdir() if p.is_file()]
    if not any(f.endswith(WEIGHT_SUFFIXES) for f in files):
        pickled = [f for f in files if f.endswith(PICKLED_SUFFIXES)]
        if pickled:
            raise ValueError(f"{path}: only pickle-based weights ({', '.join(sorted(pickled)[:3])}); they are refused "
                             "(unpickling runs code): convert them to safetensors")
        raise ValueError(f"{path}: no *.safetensors weights")


# --- loading ---------------------------------------------------------------------------------------

def _stored_dtype(path: Path, d: dict) -> torch.dtype | None:
    """The dtype a transformers directory stores: its config's `dtype` (`torch_dtype` before
    transformers 5), else the first safetensors file's tensors."""
    named = d.get("dtype", d.get("torch_dtype"))
    if isinstance(named, str) and DTYPES.get(named.removeprefix("torch.")) is not None:
        return DTYPES[named.removeprefix("torch.")]
    files = sorted(Path(path).glob("*.safetensors"))
    return stored_dtype(read_header(files[0])) if files else None


def _load_report_problem(info: dict) -> str | None:
    """transformers' load report (missing, unexpected, mismatched tensors, errors) as one line, or None."""
    parts = []
    for key, what in (("missing_keys", "missing"), ("unexpected_keys", "unexpected"), ("mismatched_keys", "mismatched"),
                      ("error_msgs", "error"), ("conversion_errors", "conversion error")):
        found = sorted(str(k[0] if isinstance(k, tuple) else k) for k in (info.get(key) or ()))
        if found:
            parts.append(f"{len(found)} {what} ({', '.join(found[:3])}{', ...' if len(found) > 3 else ''})")
    return "; ".join(parts) or None


def load_hf(path: str | os.PathLike, d: dict, *, device: torch.device, dtype: torch.dtype | None,
            device_map: str | None = None, max_memory: dict | None = None) -> HFModel:
    """The transformers model in directory `path` (config dict `d`), from local files only, safetensors
    only (`check_hf_directory` ran first), wrapped and instrumented. `dtype` None: as stored
    (`devices.run_dtype`). Refused before any weight is read when it does not fit (`require_fits`).

    `device_map="auto"`: accelerate spreads the model over the GPUs, then the CPU, then disk (a
    temporary offload folder, removed with the model), within `max_memory` ({"cpu": "20GiB", 0:
    "70GiB"}: accelerate's own argument) where given; no memory refusal then, since what does not fit
    goes to disk. Inputs go to the embedding's device (`HFModel.device`)."""
    check_hf_directory(path, d)
    if device_map not in (None, "auto"):
        raise ValueError(f"device_map {device_map!r}: expected 'auto' (or none)")
    if device_map is not None and device.type == "meta":
        raise ValueError("device_map 'auto' places weights; it does not apply to the meta device")
    try:
        # transformers is optional (the hf extra): imported when an HF model is used
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ValueError(f"{path}: a Hugging Face transformers model ({d.get('model_type')}) needs the hf extra: "
                         "pip install -c constraints.txt -c constraints-hf.txt -e '.[hf]'") from None

    # before transformers lists its ~900 names; a type filed under another task (Mistral-4) by `architectures`
    causal_lm = causal_lm_class(d.get("model_type"), d.get("architectures"))
    if causal_lm is None:
        if "auto_map" in d:
            raise ValueError(f"{path}: model_type {d.get('model_type')!r} needs the directory's own code (auto_map in "
                             "config.json); RouteScope never runs a model directory's code")
        raise ValueError(f"{path}: model_type {d.get('model_type')!r} is not a causal language model this "
                         f"transformers ({_transformers_version()}) knows")
    for weights in sorted(Path(path).glob("*.safetensors")):  # a truncated or oversized file, named in one line
        read_header(weights)
    config = HFConfig.from_hf_dict(d)
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # its load report and progress bar go to stderr; RouteScope reports its own
    hf_logging.disable_progress_bar()
    try:
        with torch.device("meta"):  # shapes only: refuse a routing RouteScope cannot follow before reading weights
            hf = build_causal_lm(config.transformers_config())
        moe_layout(hf)
        dtype = run_dtype(dtype, _stored_dtype(Path(path), d), device)
        if device_map is None:
            require_fits(sum(p.numel() for p in hf.parameters()), dtype, device, str(path))
        offload = _offload_folder() if device_map is not None else None
        if device.type != "meta":
            with DEFAULT_DTYPE_LOCK:  # torch's default dtype is switched for the build (config.py)
                hf, info = causal_lm.from_pretrained(
                    str(path), local_files_only=True, use_safetensors=True,
                    trust_remote_code=False,  # never run the directory's code
                    dtype=dtype, output_loading_info=True,
                    # straight onto the device (no float copy through the CPU first), or spread by accelerate
                    **({"device_map": None if device.type == "cpu" else device} if device_map is None else
                       {"device_map": device_map, "max_memory": max_memory, "offload_folder": offload.name}),
                    ignore_mismatched_sizes=True)  # refused below, by name
            problem = _load_report_problem(info)  # transformers fills a missing tensor with random values
            if problem is not None:
                hf = None
    except TooLarge:
        raise
    except UnsupportedMoE as e:
        raise ValueError(f"{path}: model_type {config.model_type!r} is a mixture of experts RouteScope cannot "
                         f"follow: {e}") from None
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, AttributeError, SafetensorError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        first = first if len(first) <= 300 else first[:300] + "…"
        raise ValueError(f"{path}: transformers could not load the model ({first})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    if hf is None:
        raise ValueError(f"{path}: the weights do not match the model: {problem}")
    model = HFModel(config, hf).eval()
    if offload is not None:
        model._offload = offload  # the offloaded weights' folder lives (and is removed) with the model
    return model



def _offload_folder() -> Any:
    """A temporary folder for the weights accelerate offloads to disk, removed when it is collected
    or at exit (an interrupted run leaves at most this folder, under the system's temp dir)."""
    return tempfile.TemporaryDirectory(prefix="routescope-offload-")

