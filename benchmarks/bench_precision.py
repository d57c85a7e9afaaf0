"""Reduced precision against float32 on the CPU: how far bfloat16 / float16 parameters move the
logits and the exported routing values of every shipped checkpoint.

Prompts: first sentences of training documents, story and math alternating (common.corpus_prompts).
Each checkpoint is loaded in float32 and in each reduced dtype (core_models.devices: parameters
cast, position tables kept float32) and exported with analysis.export.batch (prompt rows, batches
of 8). Reported per checkpoint and dtype:
- logits: max over prompts of max |logit - logit_32| / max |logit_32| (error relative to the scale
  of that prompt's logits), and the share of positions whose top-1 next token agrees;
- routing values: max over rows of |value - value_32| / max |value_32| of the row's kind (values
  are probabilities, weights, cosines and shares, whose scale is 1; PAGMLP norms are relative);
- routing decisions (the selected options of one prompt, position, layer and kind: top-k, Gumbel
  choice, dominant path): the share that differ from float32, and the largest float32 margin
  (weakest selected minus strongest unselected value) among those that differ: a flip of a near tie
  has a small margin.
The README's stated bfloat16 tolerance is the bound these numbers support; tests/models/test_devices.py
checks it on the shipped checkpoints
(devices.BF16_TOL).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from benchmarks import common as C

KEY = ["prompt_id", "position", "layer", "site", "kind", "option"]


def export_rows(model, tok, prompts: list[tuple[str, str]], name: str) -> pd.DataFrame:
    from routescope.analysis.export import batch as B
    from routescope.analysis.export.run_table import TokenText

    job = B.ExportJob()
    if not model.routing_layers():  # llama-dense: logits only
        return pd.DataFrame(columns=[*KEY, "value", "selected"])
    encoded = B.encode_prompts(tok, prompts, model.context, job)
    frames = [df for _, dfs in B.export_batches(model, encoded, TokenText(tok), job.ablation(model), job, name)
              for df in dfs]
    return pd.concat(frames, ignore_index=True)


@torch.inference_mode()
def logits_of(model, tok, prompts: list[tuple[str, str]]) -> list[torch.Tensor]:
    return [model(torch.tensor([tok.encode(p).ids[-model.context:]])).logits[0].float() for _, p in prompts]


def decisions(both: pd.DataFrame) -> tuple[int, int, float]:
    """(decisions, flipped, largest float32 margin of a flipped one). A decision: the selected options
    of one (prompt, position, layer, kind); its margin: weakest selected minus strongest unselected
    float32 value. Kinds with rows for selected options only (MoEP top-k weights) have no margin."""
    both = both[both["selected_32"].notna() | both["selected"].notna()]
    n = flipped = 0
    worst = 0.0
    for _, d in both.groupby(["prompt_id", "position", "layer", "kind"]):
        n += 1
        s32, s16 = d["selected_32"].fillna(False).astype(bool), d["selected"].fillna(False).astype(bool)
        if (s32 != s16).any():
            flipped += 1
            if s32.any() and (~s32 & d["value_32"].notna()).any():
                worst = max(worst, float(d["value_32"][s32].min() - d["value_32"][~s32].max()))
    return n, flipped, worst


def compare(ref_logits, logits, ref_rows: pd.DataFrame, rows: pd.DataFrame) -> dict[str, float]:
    rel = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(logits, ref_logits))
    top1 = np.mean([float((a.argmax(-1) == b.argmax(-1)).float().mean()) for a, b in zip(logits, ref_logits)])
    out = {"logits_rel": rel, "top1": float(top1), "value_rel": float("nan"), "flipped": float("nan"),
           "margin": float("nan"), "decisions": 0}
    if ref_rows.empty:
        return out
    both = ref_rows.merge(rows, on=KEY, how="outer", suffixes=("_32", ""))
    paired = both[both["value_32"].notna() & both["value"].notna()]
    scale = paired.groupby("kind")["value_32"].transform(lambda v: v.abs().max()).replace(0, 1.0)
    n, flipped, margin = decisions(both)
    out.update(value_rel=float(((paired["value"] - paired["value_32"]).abs() / scale).max()),
               flipped=flipped / n, margin=margin, decisions=n)
    return out


def run(args) -> C.Report:
    from routescope.core_models.checkpoint import CheckpointError, load_checkpoint

    rep = C.Report("bench_precision", "Reduced precision vs float32 on the CPU (logits, routing values)")
    n = 40 if args.quick else 200
    prompts = [(str(k + 1), p) for k, p in enumerate(C.corpus_prompts(n))]
    t = C.Table(f"{n} corpus prompts, prompt rows (no generation), deterministic routing",
                ["checkpoint", "dtype", "logits max rel. err", "top-1 agree", "routing value max rel. err",
                 "decisions", "flipped", "max float32 margin of a flip"])
    worst: dict[str, dict[str, float]] = {}
    for name in C.SHIPPED:
        path = C.checkpoint_path(name)
        if path is None:
            continue
        try:
            ref, tok = load_checkpoint(path)
        except CheckpointError as e:  # a checkpoint being retrained may not match its config for a while
            rep.notes.append(f"{name}: skipped, not loadable ({str(e)[:120]}...)")
            continue
        ref_logits, ref_rows = logits_of(ref, tok, prompts), export_rows(ref, tok, prompts, name)
        for dtype in ("bfloat16", "float16"):
            model, _ = load_checkpoint(path, dtype=dtype)
            m = compare(ref_logits, logits_of(model, tok, prompts), ref_rows, export_rows(model, tok, prompts, name))
            t.add(name, dtype, m["logits_rel"], f"{m['top1']:.2%}", m["value_rel"], m["decisions"],
                  f"{m['flipped']:.2%}", m["margin"])
            w = worst.setdefault(dtype, {})
            for k in ("logits_rel", "value_rel", "margin", "flipped"):
                if m[k] == m[k] and (name.startswith("moep") is False or k in ("margin", "flipped")):
                    w[k] = max(w.get(k, 0.0), m[k])
    rep.tables.append(t)
    for dtype, w in worst.items():
        rep.notes.append(f"{dtype}, worst over checkpoints (values and logits: MoEP apart): logits max rel. err "
                         f"{w['logits_rel']:.4f}, routing value max rel. err {w['value_rel']:.4f}, decisions flipped "
                         f"{w['flipped']:.2%}, largest float32 margin of a flipped decision {w['margin']:.4f}")
    return rep


if __name__ == "__main__":
    C.main(run, __doc__)
