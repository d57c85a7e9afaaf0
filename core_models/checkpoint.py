"""Checkpoint directories: config.json, model.safetensors, tokenizer.json, README.md.

Safetensors only; nothing is ever unpickled. Writes go to a temporary sibling directory that is
renamed into place, so a failed save never leaves a half-written checkpoint.

Loading refuses a bad checkpoint before it costs memory: the config is checked field by field
(context is bounded there) and the tokenizer against its vocab_size; the parameter count the config
implies (closed form) is compared with the number of values in the file; then the model is built with
its parameters on the meta device and compared tensor by tensor with the safetensors header (names,
shapes, storage dtypes; no tensor data read). Only then are the parameters allocated and filled, each
tensor checked for NaN/Inf.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_model
from tokenizers import Tokenizer
from torch import nn
from torch.overrides import TorchFunctionMode

from .base import RouteScopeLM
from .config import BaseConfig, ConfigError, json_kind
from .devices import (parse_max_memory, place, require_fits, resolve_device, resolve_device_map, resolve_dtype,
                      run_dtype)
from .hf import HFConfig, check_hf_directory, is_hf_config, load_hf
from .registry import build_model, config_from_dict, param_count
from .weights import CheckpointError, Header, read_header, stored_dtype

CONFIG, WEIGHTS, TOKENIZER, CARD = "config.json", "model.safetensors", "tokenizer.json", "README.md"

FLOAT_STORAGE = ("F16", "BF16", "F32")  # safetensors dtypes a floating tensor may be stored in
DTYPE_NAMES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
               torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
               torch.bool: "BOOL"}  # torch dtype -> safetensors' name
MAX_CONFIG_BYTES = 2**20  # a config is a few hundred bytes
SHOWN_PROBLEMS = 6  # the message lists this many; CheckpointError.problems has them all

def _listing(problems: list[str]) -> str:
    more = len(problems) - SHOWN_PROBLEMS
    return "; ".join(problems[:SHOWN_PROBLEMS]) + (f"; and {more} more" if more > 0 else "")


def write_routescope_files(model: RouteScopeLM, path: Path, dtype: torch.dtype) -> None:
    """RouteScope's own checkpoint layout: config.json and model.safetensors in the storage dtype."""
    (path / CONFIG).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    # a copy in the storage dtype (every tensor is overwritten: no init); save_model drops the
    # duplicate names of tied weights
    clone = build_model(model.config, init=False)
    clone.load_state_dict(model.state_dict())
    save_model(clone.to(dtype), str(path / WEIGHTS), metadata={"family": model.config.family})


def save_checkpoint(model: RouteScopeLM, path: str | os.PathLike, *, tokenizer=None, card: str | None = None,
                    dtype: torch.dtype = torch.float16, overwrite: bool = True) -> Path:
    path = Path(path)
    if path.exists() and not overwrite:
        raise CheckpointError(f"{path} exists (pass overwrite=True to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
    try:
        own = getattr(model, "write_checkpoint_files", None)  # transformers models: save_pretrained
        if own is not None:
            own(tmp, dtype)
        else:
            write_routescope_files(model, tmp, dtype)
        if tokenizer is not None:
            tokenizer.save(str(tmp / TOKENIZER))
        if card is not None:
            (tmp / CARD).write_text(card)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def require_tokenizer(tokenizer: "Tokenizer | None", source: str | os.PathLike = "this checkpoint") -> "Tokenizer":
    """`tokenizer`, or the one ValueError every command and the app give for a checkpoint without
    its tokenizer.json: text prompts need one."""
    if tokenizer is None:
        raise ValueError(f"{source} has no {TOKENIZER}: text prompts need a tokenizer "
                         "(import the checkpoint again with --tokenizer)")
    return tokenizer


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The weight files of a checkpoint directory: its model.safetensors, or a transformers model's
    *.safetensors (possibly sharded)."""
    p = Path(path)
    if (p / WEIGHTS).is_file():
        return [p / WEIGHTS]
    return sorted(f for f in p.glob("*.safetensors") if f.is_file())


def checkpoint_files(path: str | os.PathLike) -> list[Path]:
    """Every file a copy of the checkpoint needs: config, weights (and a shard index), tokenizer
    files, transformers' generation config. Never a pickle."""
    p = Path(path)
    keep = [CONFIG, TOKENIZER, "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
            "model.safetensors.index.json"]
    return [p / f for f in keep if (p / f).is_file()] + weight_files(p)


def read_config(path: str | os.PathLike) -> dict:
    """The JSON object in `path`/config.json (not yet validated as a config)."""
    f = Path(path) / CONFIG
    if not f.is_file():
        raise CheckpointError(f"{path}: no {CONFIG}")
    if f.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{f}: {f.stat().st_size:,} bytes is too large for a config")
    try:
        d = json.loads(f.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{f}: expected a JSON object of config fields, got {json_kind(d)}")
    return d


def read_model_config(path: str | os.PathLike) -> BaseConfig:
    """The validated config of checkpoint directory `path`; errors name config.json and the field."""
    try:
        return config_from_dict(read_config(path))
    except ConfigError as e:
        raise CheckpointError(f"{Path(path) / CONFIG}: {e}") from None


def checkpoint_config(path: str | os.PathLike) -> BaseConfig:
    """The config of any checkpoint directory: ours (config.json with a family) or a transformers
    model's (config.json with a model_type: an `hf.HFConfig`)."""
    raw = read_config(path)
    if is_hf_config(raw):
        return HFConfig.from_hf_dict(raw)
    return read_model_config(path)


def _oversized_fields(config: BaseConfig, header: Header) -> list[str]:
    """Integer config fields larger than every tensor dimension in the file: the likely culprits."""
    largest = max((d for shape, _ in header.values() for d in shape), default=0)
    return [f"{f.name} = {v}" for f in dataclasses.fields(config)
            if type(v := getattr(config, f.name)) is int and v > largest]


def check_size(config: BaseConfig, header: Header, config_file: str | os.PathLike, weights: str | os.PathLike) -> None:
    """The closed-form parameter count of the config against the number of values in the file: a
    config that inflates d_model, n_layers or vocab_size is refused before a module is built. Within
    2x the model is built (parameters on meta, so at most 2x the file for parameters a family makes
    otherwise) and compared tensor by tensor, which names each difference."""
    need = param_count(config)
    have = sum(math.prod(shape) for shape, _ in header.values())
    if need > 2 * have:
        fields = _oversized_fields(config, header)
        culprit = f"{', '.join(fields)} {'is' if len(fields) == 1 else 'are'} larger than any tensor dimension in " \
                  f"{Path(weights).name}; " if fields else ""
        raise CheckpointError(f"{config_file}: {culprit}the config describes {need:,} parameters but {weights} "
                              f"holds {have:,} values")


class _ParametersOnMeta(TorchFunctionMode):
    """torch.empty without a device (how every torch.nn layer allocates its parameters) gives a meta
    tensor: shapes without memory. Other factories run on the CPU, so the tables a model computes in
    __init__ (RoPE/SRPE; bounded through the config's context) are exact: a model built wholly on the
    meta device would compute them with torch's Python meta kernels, which cost seconds to import in
    every process. Thread-local, like every torch function mode."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.empty and kwargs.get("device") is None:
            kwargs = {**kwargs, "device": "meta"}
        return func(*args, **kwargs)


def shape_model(config: BaseConfig) -> RouteScopeLM:
    """The model with (at least) its torch.nn parameters on the meta device and no initialisation."""
    with _ParametersOnMeta():
        return build_model(config, init=False)


def materialise(model: RouteScopeLM, device: torch.device | str | None = None,
                dtype: torch.dtype | None = None) -> RouteScopeLM:
    """Give every meta parameter uninitialised memory on `device` (default CPU), floating ones in
    `dtype` (default: as built), keeping tied parameters tied; buffers move to `device` and keep
    their dtype (devices.place). Parameters are allocated where they will live: no CPU copy first."""
    if any(b.is_meta for b in model.buffers()):  # a family allocated a buffer with torch.empty
        return place(build_model(model.config, init=False), device, dtype)
    real: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if p.is_meta:
                if id(p) not in real:
                    want = dtype if dtype is not None and p.is_floating_point() else p.dtype
                    # torch.empty from a shape: empty_like(meta) would import torch's Python meta kernels
                    real[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=want, device=device),
                                               requires_grad=p.requires_grad)
                setattr(module, name, real[id(p)])
    return place(model, device, dtype)


def storage_dtypes(t: torch.Tensor) -> tuple[str, ...]:
    """The safetensors dtypes `t` may be loaded from: any float storage for a float (checkpoints are
    saved in float16), the exact dtype otherwise; an int32 file tensor is never cast to a weight."""
    return FLOAT_STORAGE if t.is_floating_point() else (DTYPE_NAMES.get(t.dtype, str(t.dtype)),)


def check_tensors(model: RouteScopeLM, weights: str | os.PathLike, header: Header | None = None) -> Header:
    """Compare the file's tensor names, shapes and storage dtypes with the model's (which may live on
    the meta device); raise listing every problem. Returns the header."""
    header = read_header(weights) if header is None else header
    state = model.state_dict(keep_vars=True)  # keep_vars: tied weights are one Parameter object
    aliases: dict[int, list[str]] = {}
    for k, v in state.items():
        aliases.setdefault(id(v), []).append(k)
    problems = []
    # names that alias another parameter (tied weights) may be absent from the file
    for k in sorted(set(state) - set(header)):
        if not any(a in header for a in aliases[id(state[k])]):
            problems.append(f"missing tensor {k} {list(state[k].shape)}")
    problems += [f"unexpected tensor {k} {list(header[k][0])}" for k in sorted(set(header) - set(state))]
    for k in sorted(set(header) & set(state)):
        (shape, stored), want = header[k], state[k]
        if shape != tuple(want.shape):
            problems.append(f"tensor {k} has shape {list(shape)}, expected {list(want.shape)}")
        allowed = storage_dtypes(want)
        if stored not in allowed:
            problems.append(f"tensor {k} is stored as {stored}, expected {' or '.join(allowed)}")
    if problems:
        raise CheckpointError(f"{weights} does not match its config: {_listing(problems)}", problems)
    return header


def _fill(model: RouteScopeLM, weights: str | os.PathLike, header: Header) -> None:
    """Copy every tensor of the (checked) file into the model, refusing NaN/Inf values."""
    state = model.state_dict()
    with torch.no_grad(), safe_open(str(weights), framework="pt") as f:
        for k in header:
            source = f.get_tensor(k)
            target = state[k].copy_(source)  # casts to the model's dtype
            if target.is_floating_point() and not bool(torch.isfinite(target).all()):
                bad = ~torch.isfinite(source.float())
                if bad.any():
                    first = [int(i) for i in bad.nonzero()[0]]
                    raise CheckpointError(f"{weights}: tensor {k} holds {int(bad.sum()):,} NaN/Inf value(s), "
                                          f"the first at index {first}")
                raise CheckpointError(f"{weights}: tensor {k} overflows {str(target.dtype).removeprefix('torch.')} "
                                      f"(largest magnitude {float(source.float().abs().max()):.4g})")


def load_weights(model: RouteScopeLM, weights: str | os.PathLike) -> None:
    """Fill `model` from a safetensors file after checking names, shapes, dtypes; refuses NaN/Inf."""
    _fill(model, weights, check_tensors(model, weights))


def load_tokenizer_file(path: str | os.PathLike):
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise CheckpointError(f"{path}: not a valid HF tokenizers file ({e})") from None


def tokenizer_mismatch(tokenizer, vocab_size: int) -> str | None:
    """Why `tokenizer` cannot serve a model of `vocab_size` ids, or None. Both directions break: with
    fewer tokens the ids past the tokenizer decode to nothing (the model can and does emit them),
    with more the tokenizer emits ids past the embedding table."""
    n = tokenizer.get_vocab_size()
    if n < vocab_size:
        return (f"{n} tokens but vocab_size = {vocab_size}: ids {n}..{vocab_size - 1} would decode to nothing "
                "(add reserved tokens to the tokenizer or lower vocab_size)")
    if n > vocab_size:
        return f"{n} tokens but vocab_size = {vocab_size}: ids {vocab_size}..{n - 1} are past the embedding table"
    return None


TOKENIZER_SHARE = 0.9  # a tokenizer covering less of a transformers model's vocabulary gets a warning
log = logging.getLogger(__name__)


def _load_hf_checkpoint(path: Path, raw: dict, device: torch.device, dtype: torch.dtype | None,
                        device_map: str | None = None, max_memory: dict | None = None):
    """A transformers model directory, loaded by transformers from local safetensors files only."""
    try:
        check_hf_directory(path, raw)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    tok = load_tokenizer_file(path / TOKENIZER) if (path / TOKENIZER).is_file() else None
    vocab = raw.get("vocab_size")
    if tok is not None and isinstance(vocab, int) and tok.get_vocab_size() > vocab:  # fewer is common (padding)
        raise CheckpointError(f"{path / TOKENIZER}: {tok.get_vocab_size()} tokens but vocab_size = {vocab} in "
                              f"{path / CONFIG}: ids {vocab}.. are past the embedding table")
    if tok is not None and isinstance(vocab, int) and tok.get_vocab_size() < TOKENIZER_SHARE * vocab:
        n = tok.get_vocab_size()  # padded tables are a few percent larger; this is another tokenizer
        log.warning(f"{path / TOKENIZER}: {n} tokens for a model of {vocab} ids ({n / vocab:.0%}): ids {n}..{vocab - 1} "
                    "decode to nothing; is this the model's own tokenizer?")
    try:
        model = load_hf(path, raw, device=device, dtype=dtype, device_map=device_map, max_memory=max_memory)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return model, tok


def load_checkpoint(path: str | os.PathLike, *, device: str | torch.device = "cpu",
                    dtype: str | torch.dtype | None = "auto", device_map: str | None = None,
                    max_memory: str | dict | None = None):
    """Return (model in eval mode, tokenizer or None). Every check runs before the model takes memory,
    the last of them that it fits in the memory `device` has free (devices.require_fits).

    `device`: "cpu", "cuda[:N]", "mps", "auto" (devices.resolve_device) or "meta" (every check, no
    weight read: a model of shapes only). `dtype` applies to the floating parameters: "auto" (the
    default) the dtype the checkpoint stores (float32 for float16 on the CPU: devices.run_dtype),
    or float32, bfloat16, float16; the position tables stay float32 (devices.place).

    `device_map="auto"` (transformers models): accelerate spreads the model over the GPUs, the CPU
    and disk, within `max_memory` ("cpu=20GiB,0=70GiB" or accelerate's dict) where given (hf.load_hf).
    RouteScope's own checkpoints (megabytes) load whole on `device` whatever the map."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    device_map, max_memory = resolve_device_map(device_map), parse_max_memory(max_memory)
    if max_memory is not None and device_map is None:
        raise CheckpointError("max_memory applies with device_map 'auto' (--device-map auto)")
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory")
    raw = read_config(path)
    if is_hf_config(raw):  # a transformers model directory (model_type, *.safetensors)
        return _load_hf_checkpoint(path, raw, device, dtype, device_map, max_memory)
    config = read_model_config(path)
    weights = path / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{path}: no {WEIGHTS}")
    tok = load_tokenizer_file(path / TOKENIZER) if (path / TOKENIZER).is_file() else None
    if tok is not None and (problem := tokenizer_mismatch(tok, config.vocab_size)):
        raise CheckpointError(f"{path / TOKENIZER}: {problem} in {path / CONFIG}")
    header = read_header(weights)
    dtype = run_dtype(dtype, stored_dtype(header), device)
    check_size(config, header, path / CONFIG, weights)  # the config against its weights: which field is off
    try:
        require_fits(param_count(config), dtype, device, str(path))  # from the config: before any module exists
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    model = shape_model(config)
    check_tensors(model, weights, header)
    model = materialise(model, device, dtype)
    if device.type != "meta":
        _fill(model, weights, header)
    return model.eval(), tok
