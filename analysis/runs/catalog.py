"""Find checkpoint directories and describe them from their config and training summary."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from routescope.core_models import config_from_dict, param_count
from routescope.core_models.checkpoint import CONFIG, TOKENIZER, WEIGHTS, weight_files
from routescope.core_models.hf import check_hf_directory, is_hf_config
from routescope.core_models.weights import read_header

from routescope.analysis.environment import ENV_ROOTS, extra_roots  # noqa: F401  (ENV_ROOTS: the name callers know)

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "checkpoints"


@dataclass(frozen=True)
class CheckpointInfo:
    name: str
    path: str
    family: str
    params: int | None = None
    params_active: int | None = None
    val_loss: dict[str, float] = field(default_factory=dict)
    has_tokenizer: bool = False
    problem: str | None = None  # why it cannot be opened, if it cannot


def checkpoint_roots(extra: list[str] | None = None) -> list[Path]:
    roots = [DEFAULT_ROOT] + [Path(p) for p in extra_roots()]
    roots += [Path(p) for p in extra or []]
    seen, out = set(), []
    for r in roots:
        key = r.resolve()
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def describe(path: str | os.PathLike) -> CheckpointInfo:
    path = Path(path)
    try:
        config = json.loads((path / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        return CheckpointInfo(path.name, str(path), "?", problem=f"{CONFIG} unreadable ({e})")
    summary = {}
    if (path / "training.json").is_file():
        try:
            summary = json.loads((path / "training.json").read_text())
        except (OSError, json.JSONDecodeError):
            summary = {}
    if is_hf_config(config):
        return _describe_hf(path, config, summary)
    problem = None if (path / WEIGHTS).is_file() else f"no {WEIGHTS}"
    family, params = str(config.get("family", "?")) if isinstance(config, dict) else "?", summary.get("params_total")
    try:
        cfg = config_from_dict(config)
        family = cfg.label  # the one family label (core_models config.label)
        if params is None:  # imported or hand-made: count from the config (no weights read)
            params = param_count(cfg)
    except ValueError as e:
        problem = problem or f"{CONFIG}: {e}"
    return CheckpointInfo(name=path.name, path=str(path), family=family, params=params,
                          params_active=summary.get("params_active"), val_loss=summary.get("val_loss", {}),
                          has_tokenizer=(path / TOKENIZER).is_file(), problem=problem)


def _describe_hf(path: Path, config: dict, summary: dict) -> CheckpointInfo:
    """A transformers model directory: its model_type, and parameters counted from the safetensors
    headers (no tensor read, no model built)."""
    problem, params = None, summary.get("params_total")
    try:
        check_hf_directory(path, config)
        if params is None:
            params = sum(math.prod(shape) for f in weight_files(path) for shape, _ in read_header(f).values())
    except ValueError as e:
        problem = str(e)
    return CheckpointInfo(name=path.name, path=str(path), family=str(config.get("model_type", "?")), params=params,
                          params_active=summary.get("params_active"), val_loss=summary.get("val_loss", {}),
                          has_tokenizer=(path / TOKENIZER).is_file(), problem=problem)


def list_checkpoints(roots: list[Path] | None = None) -> list[CheckpointInfo]:
    """Every directory with a config.json (`CONFIG`) directly under the roots, sorted by name."""
    found = []
    for root in roots if roots is not None else checkpoint_roots():
        if not root.is_dir():
            continue
        for d in sorted(root.iterdir()):
            if d.is_dir() and not d.name.startswith(".") and (d / CONFIG).is_file():
                found.append(describe(d))
    return found
