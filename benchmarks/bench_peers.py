"""Goal 3: RouteScope tracing vs interpretability peers on one shape (d_model 128, 8 layers,
4 heads, vocab 4096, batch 1, 64 tokens), all in one interleaved loop.

- RouteScope: `pagmlp` at 8 layers (a llama with PAGMLP feed-forwards: the llama with routing
  sites; a dense llama has none), `tracing()` recording every site.
- TransformerLens HookedTransformer of the same llama shape (RMSNorm, rotary, gated SiLU MLP of
  the same width), `run_with_cache()` caching every hook point. Goal: RouteScope >= 3x faster.
- nnsight wrapping the same RouteScope model and saving the outputs of the same site modules
  (the same tensors RouteScope records). Goal: RouteScope faster.
- HF GPT-2 of the same shape, plain forward (context only).
Every variant runs under torch.no_grad and again under torch.inference_mode, all interleaved, in
each of 3 fresh processes (one process's luck does not decide a goal); a goal is reported per mode
as the median over processes of each process's own ratio. Peers are built from configs with random weights (HF_HUB_OFFLINE=1); a peer that is not
installed (`pip install -e .[bench]`) is reported as such and its goal as not measured.
"""
from __future__ import annotations

import warnings

import torch

from benchmarks import common as C
from routescope.core_models import tracing

SEQ = 64


def routescope_model():
    model, _, _ = C.model_for("pagmlp", **C.REF_SHAPE)
    return model


def transformer_lens_model(hidden: int):
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    s = C.REF_SHAPE
    cfg = HookedTransformerConfig(d_model=s["d_model"], n_layers=s["n_layers"], n_heads=s["n_heads"],
                                  d_head=s["d_model"] // s["n_heads"], d_mlp=hidden, d_vocab=s["vocab_size"],
                                  n_ctx=256, act_fn="silu", normalization_type="RMS", gated_mlp=True,
                                  positional_embedding_type="rotary", rotary_dim=s["d_model"] // s["n_heads"],
                                  tokenizer_name=None, seed=0)
    return HookedTransformer(cfg).eval()


def gpt2_model():
    from transformers import GPT2Config, GPT2LMHeadModel
    s = C.REF_SHAPE
    cfg = GPT2Config(vocab_size=s["vocab_size"], n_positions=256, n_embd=s["d_model"], n_layer=s["n_layers"],
                     n_head=s["n_heads"], bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).eval()


def nnsight_saver(model, site_names: list[str]):
    """A callable running one nnsight trace of `model` that saves the outputs of the named modules."""
    import nnsight
    from nnsight import NNsight
    wrapped = NNsight(model)
    envoys = []
    for name in site_names:
        e = wrapped
        for part in name.split("."):
            e = e[int(part)] if part.isdigit() else getattr(e, part)
        envoys.append(e)

    def run(ids: torch.Tensor) -> list:
        with wrapped.trace(ids):
            saved = nnsight.save([])
            for e in envoys:
                saved.append(e.output)
        return saved
    return run


def peer(pkg: str, versions: dict, setup):
    """setup() -> (callable, tensors recorded), or why not: not installed, or the error building it."""
    if not versions[pkg]:
        return f"{pkg} not installed"
    try:
        return setup()
    except Exception as e:  # a peer release that breaks must not hide the other rows
        return f"{pkg} {versions[pkg]} failed: {type(e).__name__}: {str(e)[:80]}"


MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
TL_KEY, NN_KEY = "TransformerLens run_with_cache (all hooks)", "nnsight trace (same site outputs saved)"
RS_KEY = "RouteScope trace (all sites)"
TL_PLAIN = "TransformerLens forward (no cache)"


def in_mode(mode: str, f):
    """f run under one grad mode: every variant of a table row set gets the same one."""
    ctx = MODES[mode]

    def run():
        with ctx():
            return f()
    return run


PROCESSES = 3  # fresh processes: a library's speed moved by up to 20% from one process to the next


def measure(payload: dict) -> dict:
    """One process's measurement: every variant under both grad modes, interleaved. JSON-able."""
    peers = C.peers_available()
    model = routescope_model()
    ids = C.random_ids(SEQ, model.vocab_size, seed=3)
    names = model.site_names()

    def rs_traced():
        with tracing():
            model(ids)

    dense, _, _ = C.model_for("llama-dense", **C.REF_SHAPE)  # same shape, SwiGLU, no sites
    base = {RS_KEY: rs_traced, "RouteScope forward (no trace)": lambda: model(ids),
            "RouteScope llama-dense forward (no sites)": lambda: dense(ids)}
    counts = {RS_KEY: len(names), "RouteScope forward (no trace)": 0, "RouteScope llama-dense forward (no sites)": 0}
    missing: dict[str, str] = {}
    with torch.no_grad():
        with tracing() as tr:
            model(ids)
        assert len(tr.names()) == len(names)

        def tl_setup():
            with warnings.catch_warnings():  # 3.9 warns that HookedTransformer goes away in 4.0
                warnings.simplefilter("ignore", DeprecationWarning)
                tl = transformer_lens_model(model.config.hidden)
            base[TL_PLAIN], counts[TL_PLAIN] = (lambda: tl(ids)), 0  # context: TransformerLens without a cache
            return (lambda: tl.run_with_cache(ids)), len(tl.run_with_cache(ids)[1])

        def nnsight_setup():
            saver = nnsight_saver(model, names)
            got = saver(ids)
            assert len(got) == len(names) and all(torch.equal(a, tr[n]) for a, n in zip(got, names))
            return (lambda: saver(ids)), len(got)

        def gpt2_setup():
            gpt2 = gpt2_model()
            return (lambda: gpt2(ids)), 0

        for label, pkg, setup in ((TL_KEY, "transformer-lens", tl_setup), (NN_KEY, "nnsight", nnsight_setup),
                                  ("HF GPT-2 forward (no hooks)", "transformers", gpt2_setup)):
            got = peer(pkg, peers, setup)
            if isinstance(got, str):
                missing[label] = got
            else:
                base[label], counts[label] = got
    variants = {(mode, name): in_mode(mode, f) for mode in MODES for name, f in base.items()}
    s = C.interleaved(variants, payload["reps"], inner=payload["inner"])
    return {"order": list(base), "counts": counts, "missing": missing, "peers": peers, "n_sites": len(names),
            "medians": {f"{mode}|{name}": C.median(xs) for (mode, name), xs in s.items()}}


def run(args) -> C.Report:
    rep = C.Report("bench_peers", "3. Peers on one shape (d128, 8 layers, 4 heads, V4096, 64 tokens)")
    n_reps, n_procs = C.reps(args, 60, 5), (1 if args.quick else PROCESSES)
    runs = [C.run_child("benchmarks.bench_peers", {"reps": n_reps, "inner": 1 if args.quick else 2}, args.threads)
            for _ in range(n_procs)]
    first = runs[0]
    base, counts, missing = first["order"], first["counts"], first["missing"]

    def per_process(mode: str, name: str) -> list[float]:  # each process's median, seconds
        return [r["medians"][f"{mode}|{name}"] for r in runs]

    def ratios(mode: str, name: str) -> list[float]:  # each process's own ratio to its RouteScope trace
        return [r["medians"][f"{mode}|{name}"] / r["medians"][f"{mode}|{RS_KEY}"] for r in runs]

    t = C.Table("Latency per call (interleaved; each library called under the same grad mode)",
                ["variant", "tensors recorded", "no_grad ms", "no_grad: x trace", "inference_mode ms",
                 "inference_mode: x trace"])
    for name in base:
        row = [name, str(counts[name])]
        for mode in MODES:
            row += [C.ms(per_process(mode, name)), C.fmt(C.median(ratios(mode, name)), "x")]
        t.add(*row)
    for name, why in missing.items():
        t.add(name, "-", why, "-", "-", "-")
    t.notes.append(f"{n_procs} fresh process(es), each timing every variant {n_reps} times interleaved; shown: the "
                   "median over processes of each process's median, and of each process's own ratio")
    t.notes.append(f"RouteScope model: pagmlp at 8 layers ({first['n_sites']} sites: alpha, beta and both pathways "
                   "per layer); llama-dense (SwiGLU, no sites) for scale")
    t.notes.append("RouteScope's own entry points (generation, the app, export) run under torch.inference_mode; "
                   "here every library gets the same mode, once no_grad (the usual notebook setting) and once "
                   "inference_mode")
    t.notes.append("versions: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in first["peers"].items()))
    rep.tables.append(t)
    if TL_KEY in base:
        p = C.Table("TransformerLens run_with_cache / RouteScope trace, process by process",
                    ["process", "no_grad: TL ms", "no_grad: RouteScope ms", "no_grad: ratio", "inference_mode: TL ms",
                     "inference_mode: RouteScope ms", "inference_mode: ratio"])
        for k, r in enumerate(runs):
            row = [str(k + 1)]
            for mode in MODES:
                tl, rs = r["medians"][f"{mode}|{TL_KEY}"], r["medians"][f"{mode}|{RS_KEY}"]
                row += [tl * 1e3, rs * 1e3, C.fmt(tl / rs, "x")]
            p.add(*row)
        rep.tables.append(p)
    for mode in MODES:
        rep.goals.append(C.Goal(f"3.transformer-lens.{mode}", f"TransformerLens run_with_cache / RouteScope trace "
                                f"({mode}, median of {n_procs} processes)", ">=", 3.0,
                                C.median(ratios(mode, TL_KEY)) if TL_KEY in base else None,
                                note=missing.get(TL_KEY, "")))
        rep.goals.append(C.Goal(f"3.nnsight.{mode}", f"nnsight trace / RouteScope trace, same tensors ({mode})", ">",
                                1.0, C.median(ratios(mode, NN_KEY)) if NN_KEY in base else None,
                                note=missing.get(NN_KEY, "")))
    return rep


if __name__ == "__main__":
    C.main(run, __doc__, child=measure)
