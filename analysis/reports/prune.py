"""A pruned (or merged) Hugging Face checkpoint: the N least important experts of every MoE layer removed
(their router rows and expert weights; merged: first averaged into their most similar kept expert),
the config's expert count lowered, written by transformers' own `save_pretrained`, with a model card
that says what was removed, which rows ranked the experts and which judged the result, and the loss
before and after on the held-out rows.

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

def check_prune_out(path: str | os.PathLike, flag: str = "--prune-out") -> Path:
    p = Path(path)
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        raise ValueError(f"{p}: exists and is not an empty directory; {flag} names a new checkpoint directory")
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


def check_mergeable(model: Any, n: int) -> None:
    """ValueError unless `n` experts of every MoE layer can be merged into others (a Hugging Face model
    whose experts are stacked tensors: `merged_copy`)."""
    if not hasattr(model, "merged_copy"):
        raise ValueError(f"--merge averages transformers expert weights: {model.config.label} is not a Hugging Face "
                         "model")
    why = model.merge_problem(n)
    if why:
        raise ValueError(f"--merge {n}: {why}")


def pruned_model(model: Any, drop: dict[str, list[int]]) -> Any:
    return model.pruned_copy(drop)


def _data(provenance: dict) -> str:
    """Which data ranked the experts and which judged the result (the split of `holdout`)."""
    h = provenance.get("holdout") or {}
    where = f"`{provenance['dataset']}` (sha256 `{provenance['dataset_sha256']}`, {provenance['rows']:,} rows as taken)"
    if not h.get("heldout"):
        return f"ranked and measured on the same rows of {where} (in-sample: optimistic)"
    return (f"ranked on {h['ranking_rows']:,} rows ({h['ranking_positions']:,} predicted positions) of {where}, "
            f"judged on the other {h['heldout_rows']:,} rows ({h['heldout_positions']:,} positions), never used to "
            f"rank (a seeded split: share held out {h['heldout']}, seed {h['seed']}; the row ids of each side are in "
            "the JSON file beside this card)")


def _card(model_name: str, drop: dict[str, list[int]], provenance: dict, losses: tuple[float, float],
          max_diff: float, into: dict[str, dict[int, int]] | None = None) -> str:
    base, loss = losses
    n = len(next(iter(drop.values())))
    if into is None:
        what, head = "pruned", f"{n} experts removed from each of {len(drop)} MoE layers"
        rows = "\n".join(f"| `{l}` | {', '.join(map(str, os_))} |" for l, os_ in drop.items())
        table = "| layer | experts removed (original numbering) |\n|---|---|\n" + rows
        how = ("the router rows and expert weights of the removed experts are gone. Its logits equal the unpruned "
               "model with these experts dropped")
    else:
        what, head = "merged", (f"{n} experts of each of {len(drop)} MoE layers merged into their most similar kept "
                                "expert (M-SMoE style: the usage-weighted mean of the weights; the merged expert's "
                                "router row removed, so its tokens go to their next choice)")
        rows = "\n".join(f"| `{l}` | {', '.join(f'{d} -> {t}' for d, t in sorted(p.items()))} |"
                         for l, p in into.items())
        table = "| layer | merged -> into (original numbering) |\n|---|---|\n" + rows
        how = ("the merged experts' router rows and weights are gone and each kept expert holds its merged weights. "
               "Its logits equal RouteScope's merged run (the merged weights, the merged experts dropped)")
    return f"""# {model_name}, {what} by RouteScope

{head}: the least important by their causal effect (each expert dropped alone, teacher-forced: the mean
next-token NLL with it dropped minus without, in {provenance['effects_dtype']}), {_data(provenance)}.

{table}

Measured on the held-out rows: loss {base:.6f} before, {loss:.6f} after (delta {loss - base:+.6f} nats per token).
Written with transformers' own `save_pretrained`; the config's expert count is lowered and {how} on a test prompt
(largest difference {max_diff:.3g}). Source weights sha256 `{provenance.get('weights_sha256')}`.
"""


def write_pruned(model: Any, tokenizer_file: Path | None, drop: dict[str, list[int]], out: Path, *, model_name: str,
                 provenance: dict, losses: tuple[float, float], prompt_ids: list[int],
                 into: dict[str, dict[int, int]] | None = None) -> float:
    """Write the pruned checkpoint into `out` (a temporary directory beside it renamed into place: a
    failed or interrupted write leaves nothing); the largest logit difference from the ablated model
    on `prompt_ids`, which must be within float rounding (else ValueError, nothing written). `losses`:
    (before, after) on the held-out rows. `into` (layer -> {merged: kept}): `model` is a merged copy
    (`merged_copy`) and the card and `merging.json` say so."""
    from transformers.utils import logging as hf_logging  # optional: the hf extra (pruning is for HF models)

    new = pruned_model(model, drop)
    x = torch.tensor([prompt_ids], device=model.device)
    with torch.inference_mode():
        want = model(x, ablation=Ablation(drop=tuple((l, o) for l, os_ in drop.items() for o in os_))).logits
        got = new(input_ids=x).logits.float()
    diff = float((got - want).abs().max())
    what = "pruned" if into is None else "merged"
    if diff > 1e-3 * max(1.0, float(want.abs().max())):
        raise ValueError(f"the {what} model's logits differ from RouteScope's run by {diff:.3g}: not written")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    meta = {"dropped": drop, "losses_heldout": {"before": losses[0], "after": losses[1]},
            "max_logit_difference": diff, "importance": provenance}
    if into is not None:
        meta["merged_into"] = {l: {str(d): t for d, t in p.items()} for l, p in into.items()}
    try:
        new.save_pretrained(tmp, safe_serialization=True)
        if tokenizer_file is not None and tokenizer_file.is_file():
            shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")
        (tmp / "README.md").write_text(_card(model_name, drop, provenance, losses, diff, into), encoding="utf-8")
        (tmp / ("pruning.json" if into is None else "merging.json")).write_text(
            json.dumps(meta, indent=1, default=str), encoding="utf-8")
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
