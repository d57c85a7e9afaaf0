"""Goal 2: the floor. A RouteScope llama forward (no trace) vs a hand-written nanoGPT-style llama
of identical shape and weights (benchmarks/nano_llama.py), batch 1, 64 tokens. Goal <= 1.10x.
Shapes: the llama-dense preset and the issue's reference shape (d_model 128, 8 layers, vocab 4096).
"""
from __future__ import annotations

import torch

from benchmarks import common as C
from benchmarks.nano_llama import NanoLlama


def run(args) -> C.Report:
    rep = C.Report("bench_floor", "2. Floor: RouteScope llama vs a hand-written nanoGPT-style llama")
    t = C.Table("Forward latency, batch 1, 64 tokens (logits checked equal to 1e-4 first)",
                ["shape", "weights", "params", "nano ms", "RouteScope ms", "RouteScope/nano", "max abs diff"])
    n_reps, inner = C.reps(args, 60, 5), (1 if args.quick else 3)
    shapes = {"llama-dense preset": {}, "reference (d128, 8 layers, V4096)": C.REF_SHAPE}
    for label, over in shapes.items():
        model, _, source = C.model_for("llama-dense", **over)
        nano = NanoLlama.from_routescope(model)
        ids = C.random_ids(64, model.vocab_size, seed=2)
        with torch.no_grad():
            diff = float((model(ids).logits - nano(ids)).abs().max())
            assert diff <= 1e-4, f"{label}: nano and RouteScope logits differ by {diff:.2e}"
            s = C.interleaved({"nano": lambda: nano(ids), "rs": lambda: model(ids)}, n_reps, inner=inner)
        r = C.ratio(s["rs"], s["nano"])
        t.add(label, source, f"{model.num_params():,}", C.ms(s["nano"]), C.ms(s["rs"]), C.fmt(r, "x"), f"{diff:.1e}")
        rep.goals.append(C.Goal(f"2.floor.{'preset' if not over else 'reference'}",
                                f"llama forward vs nanoGPT-style, {label}", "<=", 1.10, r))
    t.notes.append(f"medians of {n_reps} interleaved repetitions x {inner} call(s)")
    rep.tables.append(t)
    return rep


if __name__ == "__main__":
    C.main(run, __doc__)
