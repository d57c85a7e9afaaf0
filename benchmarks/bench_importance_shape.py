"""Issue 40: the first-order estimate against the exact sweep, and the exact sweep at a real shape.

1. Agreement: the shipped olmoe-tiny and mixtral-tiny over the shipped validation split, every
   expert estimated and measured exactly (`method="both"`, `confirm` = the experts of a layer):
   the `estimate_agreement` table (Spearman and top-10 recall per layer), the Spearman over every
   (layer, expert) together, and the estimate's time beside the exact sweep's.
2. Real shape: a random OLMoE with OLMoE-1B-7B's layer shape (hidden 2048, 64 experts, top-8, expert
   intermediate 1024, vocabulary 50,304, 16 heads), 4 layers, float32, over 2,000 validation tokens
   (olmoe-tiny's tokenizer), 16 seeded experts per layer (64 ablations):
   - the exact sweep's loop as `measure.measure_batch` runs it on a CPU (one ablation per forward),
     prefix reuse ("fast": capture, each layer's experts outputs once, then per ablation `resume`
     from its layer, that layer's experts call answered from them, + the output embedding and
     effects at predicted positions) against the naive loop (per ablation one full forward +
     effects), each part timed;
   - all 256 first-order estimates (`estimate.estimate`) against one plain forward over the same
     tokens (forward-equivalents) and against one exact ablation (its mean fast and naive time).
Process CPU seconds (1 torch thread), one run: ratios measured in one process, never asserted.
`--results PATH` writes the report into PATH's bench_importance_shape section.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from . import common as C

SECTION = ("<!-- bench_importance_shape -->", "<!-- /bench_importance_shape -->")


def _cpu(f):
    c = time.process_time()
    out = f()
    return out, time.process_time() - c


def agreement(args, rep: C.Report) -> None:
    from routescope.analysis.corpus.shipped import shipped
    from routescope.analysis.reports.importance import ImportanceSettings, importance
    from routescope.core_models.checkpoint import load_checkpoint

    data = shipped("validation")
    for name in ("olmoe-tiny", "mixtral-tiny"):
        model, tok = load_checkpoint(C.CHECKPOINTS / name, dtype="float32")
        n = max(model.routing_layers().values())
        s = ImportanceSettings(method="both", confirm=n, max_tokens=2_000 if args.quick else None, control_draws=0,
                               prune_max=0, bootstrap=100)
        res, cpu = _cpu(lambda: importance(model, tok, data, s))
        imp, agree = res["importance"], res["estimate_agreement"]
        t = C.Table(f"{name}: first-order estimate vs exact delta_nll, every expert of every layer, shipped validation "
                    f"split ({res.provenance['predicted_positions']:,} predicted positions in "
                    f"{res.provenance['rows']:,} rows)", ["layer", "options measured", "Spearman", "top-10 recall"])
        for r in agree.itertuples():
            t.add(r.layer, str(r.options_measured), f"{r.spearman:.4f}",
                  "-" if np.isnan(r.top10_recall) else f"{r.top10_recall:.1f}")
        pooled = imp["delta_nll_estimate"].rank().corr(imp["delta_nll"].rank())
        sign = float((np.sign(imp["delta_nll_estimate"]) == np.sign(imp["delta_nll"])).mean())
        t.notes += [f"Spearman over all {len(imp)} (layer, expert): {pooled:.4f}; same sign: {sign:.4f}",
                    f"estimate {res.provenance['estimate_seconds']:.1f} s wall of the {res.provenance['seconds']:.1f} s "
                    f"run ({cpu:.1f} s CPU), the rest the exact sweep of all {len(imp)} experts"]
        rep.tables.append(t)


def _real_shape_model():
    from transformers import AutoModelForCausalLM, OlmoeConfig

    from routescope.core_models.hf import HFConfig, HFModel

    cfg = OlmoeConfig(vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
                      max_position_embeddings=4096, tie_word_embeddings=False, norm_topk_prob=False)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    return HFModel(HFConfig.from_hf_dict(cfg.to_dict()), hf).eval()


def real_shape(args, rep: C.Report) -> None:
    from routescope.analysis.corpus.shipped import shipped
    from routescope.analysis.reports.importance import scope_of, tokens_of
    from routescope.analysis.reports.importance.estimate import estimate, gradients, layer_estimates
    from routescope.analysis.reports.importance import measure as M
    from routescope.analysis.reports.importance.measure import _Positions
    from routescope.analysis.reports.importance.plan import batches, drop
    from routescope.core_models.checkpoint import load_checkpoint

    _, tok = load_checkpoint(C.CHECKPOINTS / "olmoe-tiny")
    if args.chunk_logits:  # the effects' chunk of logits (measure.CHUNK_LOGITS), read when a batch's positions are made
        M.CHUNK_LOGITS = args.chunk_logits
    (model, build) = _cpu(_real_shape_model)
    n_tokens = 300 if args.quick else args.tokens
    per_layer = 2 if args.quick else args.experts
    toks = tokens_of(shipped("validation"), tok, model.context, n_tokens)
    rng = np.random.default_rng(0)
    layers = list(model.routing_layers())
    sample = [(l, int(o)) for l in layers for o in sorted(rng.choice(64, per_layer, replace=False))]
    parts = {k: 0.0 for k in ("fast capture", "fast experts outputs (once a layer)", "fast resume (layers)",
                              "fast head + effects",
                              "naive plain forward + positions", "naive full forwards", "naive effects")}
    checks = []
    with torch.inference_mode():
        for _, x, lengths in batches(toks, 8, 0):
            c = time.process_time()
            prefix = model.capture(x)
            pos = _Positions(prefix.logits, x, lengths, head=model.output_embedding)
            parts["fast capture"] += time.process_time() - c
            fast_d, slots = [], {}
            for l, o in sample:
                if l not in slots:  # measure_batch's `reuse`: the layer's experts outputs once a batch
                    c = time.process_time()
                    slots = {l: model.expert_outputs(prefix, l)}
                    parts["fast experts outputs (once a layer)"] += time.process_time() - c
                c = time.process_time()
                hidden = model.resume(prefix, l, [drop((l, o))] * x.shape[0], head=False, expert_outputs=slots[l])
                c2 = time.process_time()
                fast_d.append(pos.effects_of_hidden(hidden)[0])
                parts["fast resume (layers)"] += c2 - c
                parts["fast head + effects"] += time.process_time() - c2
            del prefix, pos, hidden, slots
            c = time.process_time()
            pos = _Positions(model(x).logits, x, lengths)
            parts["naive plain forward + positions"] += time.process_time() - c
            for (l, o), fd in zip(sample, fast_d):
                c = time.process_time()
                logits = model(x, ablation=drop((l, o))).logits
                c2 = time.process_time()
                checks.append(float(np.abs(pos.effects(logits)[0] - fd).max()))
                parts["naive full forwards"] += c2 - c
                parts["naive effects"] += time.process_time() - c2
            del pos, logits

        def plain():
            for _, x, _ in batches(toks, 8, 0):
                model(x)
        _, fwd = _cpu(plain)
    fast = sum(v for k, v in parts.items() if k.startswith("fast"))
    naive = sum(v for k, v in parts.items() if k.startswith("naive"))
    m = len(sample)
    if args.skip_estimate:
        rep.notes.append(f"CHUNK_LOGITS {M.CHUNK_LOGITS:,}: fast / naive {fast / naive:.3f}x CPU; " + "; ".join(
            f"{k} {v:.1f} s" for k, v in parts.items()) + f"; one plain forward {fwd:.1f} s")
        return
    scope = scope_of(model, None, None)
    est, est_cpu = _cpu(lambda: estimate(model, toks, scope, 8))
    split = {"forward + backward": 0.0, "local changes (router reruns, new experts)": 0.0}
    for _, x, lengths in batches(toks, 8, 0):  # the estimate's two parts, timed apart (a second pass)
        c = time.process_time()
        grads, _ = gradients(model, x, lengths, layers)
        c2 = time.process_time()
        for l in layers:
            layer_estimates(model, l, grads[l], scope.options[l], False)
        split["forward + backward"] += c2 - c
        split["local changes (router reruns, new experts)"] += time.process_time() - c2
    t = C.Table(f"Real shape (random OLMoE, hidden 2048, 64 experts, top-8, intermediate 1024, vocabulary 50,304, "
                f"16 heads, 4 layers, float32): {per_layer} experts of every layer ({m} ablations) over "
                f"{int(toks.positions.sum() + len(toks.ids)):,} tokens in {len(toks.ids)} rows", ["part", "CPU s"])
    for k, v in parts.items():
        t.add(k, f"{v:.1f}")
    t.add("fast, all", f"{fast:.1f}")
    t.add("naive, all", f"{naive:.1f}")
    t.add("one plain forward over the tokens", f"{fwd:.1f}")
    t.add(f"all {len(est.keys)} first-order estimates", f"{est_cpu:.1f}")
    for k, v in split.items():
        t.add(f"estimates (second pass): {k}", f"{v:.1f}")
    exact_one = (fast + naive) / 2 / m
    t.notes += [f"fast / naive: {fast / naive:.3f}x CPU",
                f"per ablation: fast {fast / m:.2f} s, naive {naive / m:.2f} s; one plain forward {fwd:.2f} s",
                f"all {len(est.keys)} estimates: {est_cpu / fwd:.2f} forward-equivalents; "
                f"{est_cpu / (fast / m):.2f} fast ablations, {est_cpu / (naive / m):.2f} naive ablations",
                f"largest |fast - naive| of a row's summed delta NLL: {max(checks):.3g} "
                f"(estimates without a reason: {len(est.keys) - sum(1 for l in est.reasons for _ in scope.options[l])})",
                f"building the random model: {build:.1f} s CPU; mean exact ablation {exact_one:.2f} s"]
    rep.tables.append(t)
    rep.goals.append(C.Goal("40.4.sweep", "real shape: fast / naive loop (process CPU)", "<=", 0.6, fast / naive))
    rep.goals.append(C.Goal("40.4.estimate", f"real shape: all {len(est.keys)} estimates, in plain forwards", "<=", 3,
                            est_cpu / fwd, unit=""))


def run(args) -> C.Report:
    rep = C.Report("bench_importance_shape", "Issue 40: first-order estimates, and the exact sweep at a real shape")
    rep.notes.append(f"machine: {C.cpu_model()}, {os.cpu_count()} cores shared with other jobs; process CPU time "
                     "(1 torch thread)")
    if not args.skip_agreement:
        agreement(args, rep)
    if not args.skip_shape:
        real_shape(args, rep)
    return rep



def main() -> None:
    p = C.parser(__doc__)
    p.add_argument("--results", metavar="PATH", help="write the report into PATH's bench_importance_shape section")
    p.add_argument("--skip-agreement", action="store_true", help="leave out part 1 (shipped checkpoints)")
    p.add_argument("--skip-shape", action="store_true", help="leave out part 2 (the real shape)")
    p.add_argument("--tokens", type=int, default=2_000, help="part 2: tokens (the issue's 2,000)")
    p.add_argument("--experts", type=int, default=16, help="part 2: experts sampled per layer (the issue's 16)")
    p.add_argument("--chunk-logits", type=int, help="part 2: measure.CHUNK_LOGITS for this run (a diagnosis)")
    p.add_argument("--skip-estimate", action="store_true", help="part 2: the exact loops only")
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
