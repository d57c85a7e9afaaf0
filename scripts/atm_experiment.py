"""ATM merge rate and its cost, per Wiola checkpoint and threshold (checkpoints/experiments/atm-merging.md).

    python scripts/atm_experiment.py CHECKPOINT [CHECKPOINT ...] [--taus 0.6,0.92] [--docs 50]

For each checkpoint and tau: the mean merge ratio mu and attention-FLOP saving mu (2 - mu) over the
first --docs validation documents of each domain (analysis.runs.routing.atm_summary, as
benchmarks/bench_scale.py measures them), and the validation loss (the trainer's validation text,
nats/token) with ATM off and on at that tau. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from routescope.analysis.export import columns as C  # noqa: E402
from routescope.analysis.reports.report import validation_rows  # noqa: E402
from routescope.analysis.runs.routing import atm_summary  # noqa: E402
from routescope.core_models import tracing  # noqa: E402
from routescope.core_models.checkpoint import load_checkpoint  # noqa: E402
from routescope.corpora.corpus import validation_documents  # noqa: E402


@torch.inference_mode()
def val_loss(model, rows: dict[str, torch.Tensor], **options) -> dict[str, float]:
    out = {}
    for dom, r in rows.items():
        total, count = 0.0, 0
        for k in range(0, len(r), 16):
            chunk = r[k:k + 16]
            logits = model(chunk[:, :-1], **options).logits
            total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
            count += chunk[:, 1:].numel()
        out[dom] = total / count
    return out


@torch.inference_mode()
def merge_rates(model, tok, tau: float, n_docs: int) -> tuple[float, float]:
    sites = [n for n in model.site_names() if ".atm." in n]
    frames = []
    for dom in ("story", "math"):
        for doc in validation_documents(dom, n_docs):
            with tracing(sites) as tr:
                model(torch.tensor([tok.encode(doc).ids[:model.context]]), atm=True, atm_tau=tau)
            frames.append(atm_summary(tr, model))
    df = pd.concat(frames, ignore_index=True)
    return float(df[C.MU].mean()), float(df[C.FLOP_SAVING].mean())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--taus", default="0.6,0.92")
    p.add_argument("--docs", type=int, default=50)
    a = p.parse_args()
    torch.set_num_threads(1)
    print("| checkpoint | trained at tau | tau | mean mu | attention-FLOP saving | val loss ATM off (story / math) "
          "| val loss ATM on (story / math) |")
    print("|---|---|---|---|---|---|---|")
    for ck in a.checkpoints:
        model, tok = load_checkpoint(ck)
        model.eval()
        rows = validation_rows(tok, 100, 256)
        off = val_loss(model, rows, atm=False)
        for tau in (float(t) for t in a.taus.split(",")):
            mu, saving = merge_rates(model, tok, tau, a.docs)
            on = val_loss(model, rows, atm=True, atm_tau=tau)
            print(f"| {Path(ck).name} | {model.config.atm_tau:g} | {tau:g} | {mu:.2%} | {saving:.2%} "
                  f"| {off['story']:.3f} / {off['math']:.3f} | {on['story']:.3f} / {on['math']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
