"""Checkpoint directories: config.json, model.safetensors, tokenizer.json, README.md.

Safetensors only; nothing is ever unpickled. Writes go to a temporary sibling directory that is
renamed into place, so a failed save never leaves a half-written checkpoint.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_model

from .base import RouteScopeLM
from .config import ConfigError
from .registry import build_model, config_from_dict

CONFIG, WEIGHTS, TOKENIZER, CARD = "config.json", "model.safetensors", "tokenizer.json", "README.md"


class CheckpointError(ValueError):
    """A checkpoint directory is incomplete or does not match its config; the message lists what."""


def save_checkpoint(model: RouteScopeLM, path: str | os.PathLike, *, tokenizer=None, card: str | None = None,
                    dtype: torch.dtype = torch.float16, overwrite: bool = True) -> Path:
    path = Path(path)
    if path.exists() and not overwrite:
        raise CheckpointError(f"{path} exists (pass overwrite=True to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
    try:
        (tmp / CONFIG).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
        # a copy in the storage dtype; save_model drops the duplicate names of tied weights
        clone = build_model(model.config)
        clone.load_state_dict(model.state_dict())
        save_model(clone.to(dtype), str(tmp / WEIGHTS), metadata={"family": model.config.family})
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


def read_config(path: str | os.PathLike) -> dict:
    f = Path(path) / CONFIG
    if not f.is_file():
        raise CheckpointError(f"{path}: no {CONFIG}")
    try:
        return json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from None


def check_tensors(model: RouteScopeLM, weights: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Compare the file's tensor names and shapes with the model's; raise listing every problem."""
    state = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in state.items()}
    # names that alias another parameter (tied weights) may be absent from the file
    ptr_names: dict[int, list[str]] = {}
    for k, v in state.items():
        ptr_names.setdefault(v.data_ptr(), []).append(k)
    try:
        with safe_open(str(weights), framework="pt") as f:
            found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{weights}: not a readable safetensors file ({e})") from None
    problems = []
    for k in sorted(set(expected) - set(found)):
        if not any(a in found for a in ptr_names[state[k].data_ptr()]):
            problems.append(f"missing tensor {k} {list(expected[k])}")
    problems += [f"unexpected tensor {k} {list(found[k])}" for k in sorted(set(found) - set(expected))]
    problems += [f"tensor {k} has shape {list(found[k])}, expected {list(expected[k])}"
                 for k in sorted(set(found) & set(expected)) if found[k] != expected[k]]
    if problems:
        raise CheckpointError(f"{weights} does not match its config: " + "; ".join(problems))
    return found


def load_weights(model: RouteScopeLM, weights: str | os.PathLike) -> None:
    found = check_tensors(model, weights)
    state = model.state_dict()
    with torch.no_grad(), safe_open(str(weights), framework="pt") as f:
        for k in found:
            state[k].copy_(f.get_tensor(k).to(state[k].dtype))


def load_tokenizer_file(path: str | os.PathLike):
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise CheckpointError(f"{path}: not a valid HF tokenizers file ({e})") from None


def load_checkpoint(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32):
    """Return (model in eval mode, tokenizer or None)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory")
    try:
        config = config_from_dict(read_config(path))
    except ConfigError as e:
        raise CheckpointError(f"{path / CONFIG}: {e}") from None
    if not (path / WEIGHTS).is_file():
        raise CheckpointError(f"{path}: no {WEIGHTS}")
    model = build_model(config).to(dtype)
    load_weights(model, path / WEIGHTS)
    tok = load_tokenizer_file(path / TOKENIZER) if (path / TOKENIZER).is_file() else None
    if tok is not None and tok.get_vocab_size() > config.vocab_size:
        raise CheckpointError(f"{path}: tokenizer has {tok.get_vocab_size()} tokens but the model's "
                              f"vocab_size is {config.vocab_size}")
    return model.eval(), tok
