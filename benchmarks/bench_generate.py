"""Goal 4: KV-cache generation, batch 1, 64-token prompt + 64 new tokens, shape d128 / 8 layers /
4 heads / vocab 4096.

- tokens/s of `core_models.generate.generate(top_n=10, trace_sites=None)` (routing records on)
  on pagmlp at 8 layers, vs HF GPT-2 of the same shape `generate(use_cache=True, do_sample=False,
  min_new_tokens=max_new_tokens=64)`, interleaved. tokens/s = 64 / wall time of the whole call
  (prompt pass included). Goal: RouteScope >= HF. RouteScope's generate runs under
  torch.inference_mode, HF's under no_grad as shipped; HF is also timed inside inference_mode.
- per-token flatness: a manual loop with `model.new_cache()` and every site traced, decoding one
  token at a time from a 14-token prompt to position 242; the step times at positions 238-242 vs
  14-18 (a 5-position window around 240 and 16, pooled over repetitions). Goal: <= 1.3x.
"""
from __future__ import annotations

import time

import torch

from benchmarks import common as C
from benchmarks.bench_peers import gpt2_model, in_mode, peer
from routescope.core_models import tracing
from routescope.core_models.generate import generate

PROMPT, NEW = 64, 64
HF = "HF GPT-2 generate (use_cache, greedy)"
HF_IM = "HF GPT-2 generate, called inside torch.inference_mode"


def flat_steps(model, reps: int, start: int = 14, stop: int = 243) -> dict[int, list[float]]:
    """Seconds of each decode step by input position, over `reps` decoding loops."""
    times: dict[int, list[float]] = {}
    ids = C.random_ids(start, model.vocab_size, seed=5)
    with torch.no_grad():
        for _ in range(reps):
            cache = model.new_cache()
            with tracing():
                tok = model(ids, cache=cache).logits[:, -1:].argmax(-1)  # (1, 1)
                for pos in range(start, stop):
                    t0 = time.perf_counter()
                    tok = model(tok, cache=cache).logits[:, -1:].argmax(-1)
                    times.setdefault(pos, []).append(time.perf_counter() - t0)
    return times


def window(times: dict[int, list[float]], center: int, half: int = 2) -> list[float]:
    return [x for p in range(center - half, center + half + 1) for x in times.get(p, [])]


RS = "RouteScope generate (pagmlp, routing records on)"
PROCESSES = 3  # fresh processes: one process's memory layout moved the ratio by up to 10%


def throughput(payload: dict) -> dict:
    """One process's interleaved generation timings (seconds per call, per variant). JSON-able."""
    peers = C.peers_available()
    model, _, source = C.model_for("pagmlp", **C.REF_SHAPE)
    ids = C.random_ids(PROMPT, model.vocab_size, seed=4)
    prompt = ids[0].tolist()
    variants = {RS: lambda: generate(model, prompt, max_new_tokens=NEW, top_n=10, trace_sites=None)}
    dense, _, _ = C.model_for("llama-dense", **C.REF_SHAPE)  # same shape, no sites: nothing recorded
    variants["RouteScope generate (llama-dense, no sites)"] = \
        lambda: generate(dense, prompt, max_new_tokens=NEW, top_n=10, trace_sites=None)
    g = generate(model, prompt, max_new_tokens=NEW, top_n=10, trace_sites=None)
    assert len(g.new_ids) == NEW and g.trace is not None and g.trace.names()

    def hf_setup():
        gpt2 = gpt2_model()
        mask = torch.ones_like(ids)

        def hf():
            return gpt2.generate(ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                 use_cache=True, pad_token_id=0)
        with torch.no_grad():
            assert hf().shape[1] == PROMPT + NEW
        return hf, 0

    got = peer("transformers", peers, hf_setup)
    if not isinstance(got, str):
        variants[HF] = got[0]
        variants[HF_IM] = in_mode("inference_mode", got[0])
    s = C.interleaved(variants, payload["reps"], warmup=1)
    return {"medians": {k: C.median(v) for k, v in s.items()}, "missing": got if isinstance(got, str) else "",
            "source": source}


def run(args) -> C.Report:
    rep = C.Report("bench_generate", "4. Generation with KV cache (64-token prompt + 64 new tokens)")
    n_reps, n_procs = C.reps(args, 30, 3), (1 if args.quick else PROCESSES)
    runs = [C.run_child("benchmarks.bench_generate", {"reps": n_reps}, args.threads) for _ in range(n_procs)]
    names, missing = list(runs[0]["medians"]), runs[0]["missing"]

    def per_process(name: str) -> list[float]:
        return [r["medians"][name] for r in runs]

    def vs(peer_name: str) -> float | None:  # median over processes of each one's tokens/s ratio
        if peer_name not in names:
            return None
        return C.median([r["medians"][peer_name] / r["medians"][RS] for r in runs])

    t = C.Table("Generation throughput (interleaved)", ["variant", "median s / call", "tokens/s", "tokens/s vs HF"])
    for name in names:
        sec = C.median(per_process(name))
        ratio = C.median([r["medians"][HF] / r["medians"][name] for r in runs]) if HF in names else None
        t.add(name, sec, NEW / sec, C.fmt(ratio, "x") if ratio else "-")
    if missing:
        t.add(HF, missing, "-", "-")
    t.notes.append(f"{n_procs} fresh process(es), each timing every variant {n_reps} times interleaved; shown: the "
                   f"median over processes of each process's median and of its own ratio; weights: {runs[0]['source']}")
    rep.tables.append(t)
    if HF in names:
        p = C.Table("RouteScope tokens/s over HF's, process by process",
                    ["process", "RouteScope s / call", "HF s / call", "ratio", "HF in inference_mode s / call",
                     "ratio (same mode)"])
        for k, r in enumerate(runs):
            m = r["medians"]
            p.add(str(k + 1), m[RS], m[HF], C.fmt(m[HF] / m[RS], "x"), m[HF_IM], C.fmt(m[HF_IM] / m[RS], "x"))
        rep.tables.append(p)
    rep.goals.append(C.Goal("4.tokens-per-s", f"RouteScope generate tokens/s / HF GPT-2 tokens/s (median of {n_procs} "
                            "processes)", ">=", 1.0, vs(HF), note=missing))
    rep.goals.append(C.Goal("4.tokens-per-s.same-mode", "the same, HF called inside torch.inference_mode (the mode "
                            "RouteScope's generate uses)", ">=", 1.0, vs(HF_IM), note=missing))

    model, _, _ = C.model_for("pagmlp", **C.REF_SHAPE)
    loops = C.reps(args, 20, 2)
    times = flat_steps(model, loops)
    early, late = window(times, 16), window(times, 240)
    f = C.Table("Decode step time by position (KV cache, every site traced)",
                ["positions", "samples", "median ms"])
    for label, xs in (("14-18", early), ("126-130", window(times, 128)), ("238-242", late)):
        f.add(label, str(len(xs)), C.ms(xs))
    flat = C.ratio(late, early)
    f.notes.append(f"{loops} decoding loops of {len(times)} steps each; ratio 240/16 = {flat:.3f}")
    rep.tables.append(f)
    rep.goals.append(C.Goal("4.flat", "decode step at position 240 / at position 16", "<=", 1.3, flat))
    return rep


if __name__ == "__main__":
    C.main(run, __doc__, child=throughput)
