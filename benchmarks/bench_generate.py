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
from benchmarks.bench_peers import gpt2_model, peer
from core_models import tracing
from core_models.generate import generate

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


def run(args) -> C.Report:
    rep = C.Report("bench_generate", "4. Generation with KV cache (64-token prompt + 64 new tokens)")
    peers = C.peers_available()
    model, _, source = C.model_for("pagmlp", **C.REF_SHAPE)
    ids = C.random_ids(PROMPT, model.vocab_size, seed=4)
    prompt = ids[0].tolist()
    variants = {"RouteScope generate (pagmlp, routing records on)":
                lambda: generate(model, prompt, max_new_tokens=NEW, top_n=10, trace_sites=None)}
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

        def hf_inference_mode():
            with torch.inference_mode():
                return got[0]()
        variants[HF_IM] = hf_inference_mode
    n_reps = C.reps(args, 30, 3)
    with torch.no_grad():
        s = C.interleaved(variants, n_reps, warmup=1)
    t = C.Table("Generation throughput (interleaved)", ["variant", "median s / call", "tokens/s", "tokens/s vs HF"])
    rs = s["RouteScope generate (pagmlp, routing records on)"]
    hf_s = s.get(HF)
    for name, xs in s.items():
        t.add(name, C.median(xs), NEW / C.median(xs), C.fmt(C.ratio(hf_s, xs), "x") if hf_s else "-")
    if hf_s is None:
        t.add(HF, got, "-", "-")
    t.notes.append(f"medians of {n_reps} interleaved repetitions; RouteScope weights: {source}")
    rep.tables.append(t)
    rep.goals.append(C.Goal("4.tokens-per-s", "RouteScope generate tokens/s / HF GPT-2 tokens/s", ">=", 1.0,
                            C.ratio(hf_s, rs) if hf_s else None, note="" if hf_s else got))
    hf_im = s.get(HF_IM)
    rep.goals.append(C.Goal("4.tokens-per-s.same-mode", "the same, HF called inside torch.inference_mode (the mode "
                            "RouteScope's generate uses)", ">=", 1.0, C.ratio(hf_im, rs) if hf_im else None,
                            note="" if hf_im else got))

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
    C.main(run, __doc__)
