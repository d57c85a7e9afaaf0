"""Issue 28: the expert-importance sweep, fast path against the naive loop, and bfloat16 rounding.

1. olmoe-tiny (checkpoints/olmoe-tiny, 4 layers x 16 experts, top-4), every layer x every expert
   over the first 10,000 tokens of the shipped validation split (float32 effects, no control draws
   and no pruning curve: the sweep alone): `sweep="fast"` (prefix reuse + many ablations per
   forward) and `sweep="naive"` (one full forward per ablation), interleaved in one process; wall
   and process CPU seconds, their ratio, and the largest difference of the two delta_nll columns.
2. A random OLMoE-shaped model with 64 experts x 16 layers (hidden 128, top-8, built from
   transformers' OlmoeConfig): seconds per (layer, expert) of the fast sweep (experts 0-7 of every
   layer over 1,000 tokens) beside one plain forward over the same tokens.
3. bfloat16 rounding: olmoe-tiny loaded in bfloat16 and in float32, log p of every target token of
   the 10,000: mean and median |difference|, beside the mean |delta_nll| of the experts.

--results PATH writes the report into PATH's bench_importance section.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from . import common as C

SECTION = ("<!-- bench_importance -->", "<!-- /bench_importance -->")


def _timed(f):
    w, c = time.perf_counter(), time.process_time()
    out = f()
    return out, time.perf_counter() - w, time.process_time() - c


def sweep_olmoe(args, rep: C.Report) -> dict:
    from routescope.analysis.corpus.shipped import shipped
    from routescope.analysis.reports.importance import ImportanceSettings, importance
    from routescope.core_models.checkpoint import load_checkpoint

    tokens = 2_000 if args.quick else 10_000
    model, tok = load_checkpoint(C.CHECKPOINTS / "olmoe-tiny", dtype="float32")
    data = shipped("validation")
    s = dict(max_tokens=tokens, control_draws=0, prune_max=0, bootstrap=200)
    runs = {"fast": [], "naive": []}
    tables = {}
    for r in range(1 if args.quick else 2):
        for method in (("fast", "naive") if r % 2 == 0 else ("naive", "fast")):
            res, wall, cpu = _timed(lambda: importance(model, tok, data, ImportanceSettings(sweep=method, **s)))
            runs[method].append((wall, cpu))
            tables[method] = res
    fast, naive = tables["fast"]["importance"], tables["naive"]["importance"]
    diffs = {c: float(np.abs(fast[c].to_numpy() - naive[c].to_numpy()).max()) for c in ("delta_nll", "kl", "flip_rate")}
    diff = diffs["delta_nll"]
    t = C.Table(f"olmoe-tiny: every layer x 16 experts ({len(fast)} ablations) over {tokens:,} tokens, float32",
                ["method", "wall s (each)", "CPU s (each)", "median wall s", "median CPU s"])
    for m, xs in runs.items():
        t.add(tables[m].provenance["method"], ", ".join(f"{w:.1f}" for w, _ in xs),
              ", ".join(f"{c:.1f}" for _, c in xs), C.median([w for w, _ in xs]), C.median([c for _, c in xs]))
    wall = C.median([w for w, _ in runs["fast"]]) / C.median([w for w, _ in runs["naive"]])
    cpu = C.median([c for _, c in runs["fast"]]) / C.median([c for _, c in runs["naive"]])
    t.notes += [f"fast / naive: {wall:.3f}x wall, {cpu:.3f}x CPU",
                f"largest |delta_nll(fast) - delta_nll(naive)|: {diff:.3g} (largest |delta_nll| "
                f"{float(naive['delta_nll'].abs().max()):.3g}); largest |kl difference| {diffs['kl']:.3g} (largest kl "
                f"{float(naive['kl'].max()):.3g}); largest |flip_rate difference| {diffs['flip_rate']:.3g}",
                f"{tables['fast'].provenance['predicted_positions']:,} predicted positions in "
                f"{tables['fast'].provenance['rows']:,} rows"]
    rep.tables.append(t)
    rep.goals.append(C.Goal("28.3.sweep", "olmoe-tiny full sweep, fast / naive loop (process CPU time)", "<=", 0.6,
                            cpu))
    rep.goals.append(C.Goal("28.3.equal", "olmoe-tiny: largest |delta_nll difference| fast vs naive", "<=", 1e-5, diff,
                            unit=""))
    return {"tokens": tokens, "mean_abs_delta": float(naive["delta_nll"].abs().mean()), "model": model, "tok": tok,
            "data": data}


def sweep_wide(args, rep: C.Report) -> None:
    from transformers import AutoModelForCausalLM, OlmoeConfig

    from routescope.analysis.corpus.shipped import shipped
    from routescope.analysis.reports.importance import ImportanceSettings, importance, tokens_of
    from routescope.analysis.reports.importance.plan import batches as make_batches
    from routescope.core_models.checkpoint import load_checkpoint
    from routescope.core_models.hf import HFConfig, HFModel

    _, tok = load_checkpoint(C.CHECKPOINTS / "olmoe-tiny")
    cfg = OlmoeConfig(vocab_size=4096, hidden_size=128, intermediate_size=64, num_hidden_layers=16,
                      num_attention_heads=4, num_key_value_heads=4, num_experts=64, num_experts_per_tok=8,
                      max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
    model = HFModel(HFConfig.from_hf_dict(cfg.to_dict()), hf).eval()
    data = shipped("validation")
    tokens = 500 if args.quick else 1_000
    options = tuple(range(2 if args.quick else 8))
    settings = ImportanceSettings(max_tokens=tokens, options=options, control_draws=0, prune_max=0, bootstrap=100)
    res, wall, cpu = _timed(lambda: importance(model, tok, data, settings))
    n = len(res["importance"])
    toks = tokens_of(data, tok, model.context, tokens)
    batches = make_batches(toks, settings.batch_size, 0)

    def plain():
        with torch.inference_mode():
            for _, x, _ in batches:
                model(x)
    _, fwall, fcpu = _timed(plain)
    _, fwall2, fcpu2 = _timed(plain)
    fwall, fcpu = min(fwall, fwall2), min(fcpu, fcpu2)
    t = C.Table(f"64 experts x 16 layers (random OLMoE, hidden 128, top-8): experts {options[0]}-{options[-1]} of "
                f"every layer ({n} ablations) over {tokens:,} tokens",
                ["what", "wall s", "CPU s"])
    t.add("whole sweep (fast)", wall, cpu)
    t.add("per (layer, expert)", wall / n, cpu / n)
    t.add("one plain forward over the same tokens", fwall, fcpu)
    t.notes.append(f"per (layer, expert) / one plain forward: {cpu / n / fcpu:.3f}x CPU "
                   "(the sweep includes the unablated pass, usage and REAP)")
    rep.tables.append(t)


def bf16_rounding(args, rep: C.Report, ctx: dict) -> None:
    from routescope.analysis.reports.importance.plan import batches, tokens_of
    from routescope.core_models.checkpoint import load_checkpoint

    f32, tok = ctx["model"], ctx["tok"]
    b16, _ = load_checkpoint(C.CHECKPOINTS / "olmoe-tiny", dtype="bfloat16")
    toks = tokens_of(ctx["data"], tok, f32.context, ctx["tokens"])
    diffs = []
    with torch.inference_mode():
        for _, x, lengths in batches(toks, 8, 0):
            valid = torch.arange(x.shape[1] - 1)[None, :] < (lengths[:, None] - 1)
            tgt = x[:, 1:, None]
            lp = [torch.log_softmax(m(x).logits[:, :-1].float(), -1).gather(-1, tgt)[..., 0][valid] for m in (f32, b16)]
            diffs.append((lp[0] - lp[1]).abs())
    d = torch.cat(diffs).double()
    t = C.Table(f"bfloat16 rounding on olmoe-tiny: |log p(target) in bfloat16 - in float32| over {len(d):,} positions",
                ["statistic", "nats"])
    t.add("mean", float(d.mean()))
    t.add("median", float(d.median()))
    t.add("90th percentile", float(d.quantile(0.9)))
    t.add("mean |delta_nll| of the 64 experts (float32)", ctx["mean_abs_delta"])
    rep.tables.append(t)


def run(args) -> C.Report:
    rep = C.Report("bench_importance", "Issue 28: which experts matter (causal importance sweep)")
    rep.notes.append(f"machine: {C.cpu_model()}, {os.cpu_count()} cores shared with other jobs; process CPU time is "
                     "the measure the ratio goal uses (wall time moves with the other jobs' load)")
    ctx = sweep_olmoe(args, rep)
    bf16_rounding(args, rep, ctx)
    sweep_wide(args, rep)
    return rep



def main() -> None:
    p = C.parser(__doc__)
    p.add_argument("--results", metavar="PATH", help="write the report into PATH's bench_importance section")
    args = p.parse_args()
    C.setup(args)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    rep = run(args)
    rep.seconds = time.perf_counter() - t0
    rep.notes.append(f"{rep.seconds:.0f} s in all; {torch.get_num_threads()} torch thread(s); load average (1 min) "
                     f"{load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    text = rep.render() + ("\n(QUICK mode: a smoke test, not the measurement)\n" if args.quick else "")
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"text": text}))
    if args.results:
        C.write_section(Path(args.results), text, SECTION)


if __name__ == "__main__":
    main()
