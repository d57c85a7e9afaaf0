"""A pruned Hugging Face checkpoint: the N least important experts of every MoE layer removed (their
router rows and expert weights), the config's expert count lowered, written by transformers' own
`save_pretrained`, with a model card that says what was pruned, on which data, and the measured loss.

Dropping an expert (its router logit -inf before the top-k) and removing it give the same model: a
softmax over the remaining logits is the softmax over all of them with the dropped ones at -inf. So
the pruned model's logits equal RouteScope's ablated model's (checked on a test prompt before
anything is written).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from routescope.core_models.ablation import Ablation

def check_prune_out(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        raise ValueError(f"{p}: exists and is not an empty directory; --prune-out names a new checkpoint directory")
    if not p.parent.is_dir():
        raise ValueError(f"{p}: directory {p.parent} does not exist")
    return p


def check_prunable(model: Any, n: int) -> None:
    """ValueError unless `n` experts can be removed from every MoE layer of this model (a Hugging
    Face model: `pruned_copy`)."""
    if not hasattr(model, "pruned_copy"):
        raise ValueError(f"--prune writes a transformers checkpoint: {model.config.label} is not a Hugging Face model")
    why = model.prune_problem(n)
    if why:
        raise ValueError(f"--prune {n}: {why}")


def pruned_model(model: Any, drop: dict[str, list[int]]) -> Any:
    return model.pruned_copy(drop)


def _card(model_name: str, drop: dict[str, list[int]], provenance: dict, loss: float, max_diff: float) -> str:
    base = float(provenance["base_loss"])
    rows = "\n".join(f"| `{l}` | {', '.join(map(str, os_))} |" for l, os_ in drop.items())
    return f"""# {model_name}, pruned by RouteScope

{len(next(iter(drop.values())))} experts removed from each of {len(drop)} MoE layers: the least important by their
causal effect on `{provenance['dataset']}` (sha256 `{provenance['dataset_sha256']}`, {provenance['rows']:,} rows,
{provenance['predicted_positions']:,} predicted positions), measured by `routescope importance` in
{provenance['effects_dtype']} (each expert dropped alone, teacher-forced: the mean next-token NLL with it dropped
minus without).

| layer | experts removed (original numbering) |
|---|---|
{rows}

Measured on that dataset: loss {base:.6f} unpruned, {loss:.6f} pruned (delta {loss - base:+.6f} nats per token).
The pruned model's logits equal the unpruned model with these experts dropped on a test prompt (largest difference
{max_diff:.3g}). Written with transformers' own `save_pretrained`; the config's expert count is lowered and the
router rows and expert weights of the removed experts are gone. Source weights sha256
`{provenance.get('weights_sha256')}`.
"""


def write_pruned(model: Any, tokenizer_file: Path | None, drop: dict[str, list[int]], out: Path, *, model_name: str,
                 provenance: dict, loss: float, prompt_ids: list[int]) -> float:
    """Write the pruned checkpoint into `out` (a temporary directory beside it renamed into place: a
    failed or interrupted write leaves nothing); the largest logit difference from the ablated model
    on `prompt_ids`, which must be within float rounding (else ValueError, nothing written)."""
    from transformers.utils import logging as hf_logging  # optional: the hf extra (pruning is for HF models)

    new = pruned_model(model, drop)
    x = torch.tensor([prompt_ids], device=model.device)
    with torch.inference_mode():
        want = model(x, ablation=Ablation(drop=tuple((l, o) for l, os_ in drop.items() for o in os_))).logits
        got = new(input_ids=x).logits.float()
    diff = float((got - want).abs().max())
    if diff > 1e-3 * max(1.0, float(want.abs().max())):
        raise ValueError(f"the pruned model's logits differ from the ablated model's by {diff:.3g}: not written")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        new.save_pretrained(tmp, safe_serialization=True)
        if tokenizer_file is not None and tokenizer_file.is_file():
            shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")
        (tmp / "README.md").write_text(_card(model_name, drop, provenance, loss, diff), encoding="utf-8")
        (tmp / "pruning.json").write_text(json.dumps({"dropped": drop, "loss": loss, "max_logit_difference": diff,
                                                      "importance": provenance}, indent=1, default=str),
                                          encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty (check_prune_out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return diff
