"""Issue 27 item 6: exact-ablation path attribution over every expert of a 128-expert x 24-layer x
top-8 Qwen3-MoE (random weights, tests/scale_models.py), one ablation per forward against several
rows of ablations per forward, in one run (the same prompt, the same process, alternating order).

Run: python -m benchmarks.bench_attribution [--tokens 24] [--per-forward 16]"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--per-forward", type=int, default=16)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from scale_models import scale_moe

    import routescope as rs
    from routescope.analysis.runs.attribution import PathAttribution

    with tempfile.TemporaryDirectory() as d:
        model, _ = rs.load(scale_moe(Path(d) / "moe128"))
        ids = torch.randint(0, model.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
        runs = {}
        for k in (1, args.per_forward):
            t0 = time.perf_counter()
            df = PathAttribution(model).attribute(ids, args.tokens - 1, None, ablations_per_forward=k)
            runs[k] = (time.perf_counter() - t0, df)
        (t1, a), (tk, b) = runs[1], runs[args.per_forward]
        diff = float(np.abs(a["contribution"].to_numpy() - b["contribution"].to_numpy()).max())
        print(f"experts: {len(a)}; prompt: {args.tokens} tokens; torch threads: {torch.get_num_threads()}")
        print(f"one ablation per forward: {t1:.1f} s; {args.per_forward} per forward: {tk:.1f} s; "
              f"ratio {tk / t1:.2f}x; largest contribution difference {diff:.2e} "
              f"(largest |contribution| {float(a['contribution'].abs().max()):.3f})")


if __name__ == "__main__":
    main()
