"""A real-size MoE on one CUDA GPU: RouteScope against plain transformers, both loaded at once, timed
interleaved (each repetition runs every side in turn), with the routes and logits compared.

The model: OLMoE-1B-7B's shape (bench_realsize.SHAPE, 16 layers, 6.9B parameters, 13.8 GB of
random bfloat16 weights written shard by shard). Steps, each printed as one JSON line (and
appended to --out, so a run cut short keeps what it measured):

- load: plain `from_pretrained(dtype="auto", device_map="cuda", trust_remote_code=False)` and
  `rs.load(device="cuda")`;
- equal: logits and every router's top-8 on a 64-token prompt (plain: the router modules' own
  outputs), and 32 greedy tokens;
- forward: plain forward, RouteScope untraced, traced (every site), and with one expert dropped;
  pick -> first heatmap (a traced prompt pass with its views and figures) and the drop toggle;
- generate: 32 greedy tokens each;
- corpus: plain forward (ids already on the GPU) vs RouteScope's corpus statistics over 4 batches
  of 8 x 256 tokens (ids from the CPU, through run_corpus's own batch loop, the counts read back at
  the end), pipelined and counted on the GPU as shipped, one batch at a time, and with the routes
  counted on the CPU (session 35's way: the trace copied to the host, numpy counts);
- device map: the model spread over the GPU (8 GiB) and the CPU by accelerate; its logits against
  the whole model's, and its forward time;
- importance: one layer's 64 experts over 2,048 tokens, fast with 1 and 16 ablations per
  forward, and naive.

Run: python -m benchmarks.bench_gpu --root /tmp/rs-gpu --out results.jsonl
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

OUT: Path | None = None


def emit(step: str, **values: Any) -> None:
    line = json.dumps({"step": step, **values}, default=str)
    print(line, flush=True)
    if OUT is not None:
        with OUT.open("a") as f:
            f.write(line + "\n")


DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def interleaved(sides: dict[str, Callable[[], Any]], reps: int, warm: int = 2) -> dict[str, float]:
    """Median seconds of each side; every repetition runs the sides in turn (none gets a quieter GPU)."""
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(warm + reps):
        for k, fn in sides.items():
            t = timed(fn)
            if r >= warm:
                times[k].append(t)
    return {k: statistics.median(v) for k, v in times.items()}


def router_topk(m: Any, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    got, handles = {}, []
    for name, mod in m.named_modules():
        if name.endswith(".mlp.gate") and hasattr(mod, "top_k"):
            handles.append(mod.register_forward_hook(lambda mod, a, out, name=name: got.__setitem__(name, out[2])))
    try:
        with torch.inference_mode():
            logits = m(ids).logits
    finally:
        for h in handles:
            h.remove()
    return logits, got


def main() -> None:
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default="/tmp/rs-gpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--skip", default="", help="comma-separated steps to skip")
    ap.add_argument("--dry-run", action="store_true", help="a small model of the same kind on the CPU (checks the script)")
    args = ap.parse_args()
    global DEVICE
    OUT = Path(args.out) if args.out else None
    DEVICE = "cpu" if args.dry_run else "cuda"
    shape = None
    if args.dry_run:
        from benchmarks.bench_realsize import SHAPE
        shape = dict(SHAPE, vocab_size=4096, hidden_size=64, intermediate_size=32, num_attention_heads=4,
                     num_key_value_heads=4)
    skip = set(filter(None, args.skip.split(",")))

    import transformers
    from transformers import AutoModelForCausalLM

    import routescope as rs
    from benchmarks import common as C
    from benchmarks.bench_realsize import build
    from routescope.analysis.runs.session import RunSettings, run_prompt
    from routescope.rendering.drawers import draw_run
    from routescope.core_models.ablation import Ablation
    from routescope.core_models.generate import generate
    from routescope.core_models.trace import tracing

    cuda = DEVICE == "cuda"
    emit("env", torch=torch.__version__, transformers=transformers.__version__,
         gpu=torch.cuda.get_device_name(0) if cuda else "none (dry run)",
         gpu_gib=torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else 0)
    path = Path(args.root) / f"olmoe-shape-{args.layers}l{'-dry' if args.dry_run else ''}"
    if not (path / "config.json").is_file():
        t0 = time.perf_counter()
        size = build(path, args.layers, device=DEVICE, shape=shape)
        emit("build", seconds=time.perf_counter() - t0, gb=size / 1e9)

    t0 = time.perf_counter()
    plain = AutoModelForCausalLM.from_pretrained(str(path), dtype="auto", device_map=DEVICE,
                                                 trust_remote_code=False).eval()
    sync()
    plain_load = time.perf_counter() - t0
    mem = torch.cuda.memory_allocated if cuda else (lambda: 0)
    plain_mem = mem()
    t0 = time.perf_counter()
    model, tok = rs.load(str(path), device=DEVICE)
    sync()
    ours_load = time.perf_counter() - t0
    emit("load", plain_s=plain_load, routescope_s=ours_load, ratio=ours_load / plain_load,
         plain_gib=plain_mem / 2**30, both_gib=mem() / 2**30,
         dtype=str(next(model.parameters()).dtype), note="plain loaded first; both from the page cache")

    vocab = model.vocab_size
    ids = C.random_ids(64, vocab, seed=1)
    gpu_ids = ids.to(DEVICE)
    ref, own = router_topk(plain, gpu_ids)
    with torch.inference_mode(), tracing() as tr:
        logits = model(ids).logits.cpu()
    mismatched = sum(int((tr[f"{layer}.indices"].reshape(idx.shape) != idx.cpu()).any(-1).sum())
                     for layer, idx in own.items())
    with torch.inference_mode():
        want = plain.generate(gpu_ids, max_new_tokens=32, do_sample=False, eos_token_id=None)[0].tolist()
    got = generate(model, ids[0].tolist(), max_new_tokens=32).ids
    emit("equal", logits_equal=bool(torch.equal(logits, ref.float().cpu())),
         logits_max_abs_diff=float((logits - ref.float().cpu()).abs().max()),
         routers=len(own), token_layer_routes_differing=mismatched, tokens=64,
         greedy_equal=got[:len(want)] == want, greedy_tokens=len(want) - 64)

    layer = next(iter(model.routing_layers()))
    drop = Ablation(drop=((layer, 0),))
    with torch.inference_mode():
        fw = interleaved({
            "plain": lambda: plain(gpu_ids),
            "routescope": lambda: model(ids),
            "traced": lambda: _traced(model, ids, tracing),
            "traced_sync_copies": lambda: _synchronous_copies(_traced, model, ids, tracing),
            "dropped": lambda: model(ids, ablation=drop),
        }, reps=10)
    emit("forward64", **{f"{k}_ms": v * 1e3 for k, v in fw.items()},
         traced_ratio=fw["traced"] / fw["plain"], untraced_ratio=fw["routescope"] / fw["plain"])

    prompt = tok.decode(ids[0].tolist())
    settings = RunSettings(max_new_tokens=0)
    # as the app: the views and figures, without the long export table (its Export view builds it)
    t = timed(lambda: draw_run(run_prompt(model, tok, prompt, settings=settings, table=False), model))
    toggles = [timed(lambda o=o: draw_run(run_prompt(model, tok, prompt, settings=settings, table=False,
                                                     ablation=Ablation(drop=((layer, o),))), model))
               for o in range(3)]
    emit("views", first_heatmap_s=ours_load + t, minus_plain_load_s=ours_load + t - plain_load,
         prompt_pass_with_views_s=t, toggle_s=statistics.median(toggles),
         toggle_goal_s=1.2 * fw["plain"] + 0.3)

    with torch.inference_mode():
        gen = interleaved({
            "plain": lambda: plain.generate(gpu_ids, max_new_tokens=32, do_sample=False, eos_token_id=None),
            "routescope": lambda: generate(model, ids[0].tolist(), max_new_tokens=32),
        }, reps=3, warm=1)
    emit("generate32", plain_s=gen["plain"], routescope_s=gen["routescope"], ratio=gen["routescope"] / gen["plain"])

    batches = [C.random_ids(256, vocab, seed=10 + b, batch=8) for b in range(4)]
    on_device = [b.to(DEVICE) for b in batches]  # plain gets its ids already on the device; ours come from the CPU
    corpus = interleaved({
        "plain": lambda: [plain(b) for b in on_device],
        "routescope": lambda: _corpus(model, batches),
        "routescope_one_at_a_time": lambda: _corpus(model, batches, overlap=False),
        "routescope_host_counts": lambda: _corpus(model, batches, host_counts=True),
    }, reps=5, warm=1)
    n = 4 * 8 * 256
    emit("corpus", plain_tok_s=n / corpus["plain"], routescope_tok_s=n / corpus["routescope"],
         ratio=corpus["plain"] / corpus["routescope"],
         one_at_a_time_ratio=corpus["plain"] / corpus["routescope_one_at_a_time"],
         host_counts_tok_s=n / corpus["routescope_host_counts"],
         host_counts_ratio=corpus["plain"] / corpus["routescope_host_counts"])

    if "device_map" not in skip:
        del plain
        if cuda:
            torch.cuda.empty_cache()
        room = {0: "8GiB", "cpu": "100GiB"} if cuda else {"cpu": sum(p.numel() for p in model.parameters())}
        t0 = time.perf_counter()
        split, _ = rs.load(str(path), device=DEVICE, device_map="auto", max_memory=room)
        load_s = time.perf_counter() - t0
        places = sorted(set(split.placement.values()))
        with torch.inference_mode():
            a = model(ids).logits.cpu()
            b = split(ids).logits.cpu()
            sp = interleaved({"whole": lambda: model(ids), "split": lambda: split(ids)}, reps=3, warm=1)
        emit("device_map", load_s=load_s, devices=places, logits_equal=bool(torch.equal(a, b)),
             max_rel_diff=float(((a - b).abs() / a.abs().clamp_min(1e-6)).max()),
             whole_ms=sp["whole"] * 1e3, split_ms=sp["split"] * 1e3)
        del split

    if "importance" not in skip:
        _importance(model, tok, path, emit)


def _synchronous_copies(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` with each trace record copied to the CPU as it fires (the trace as it was before
    its copies went asynchronous): the same work, one wait for the GPU per recorded site."""
    from routescope.core_models.trace import Trace

    Trace.deferred_copies = False
    try:
        return fn(*args)
    finally:
        Trace.deferred_copies = True


def _traced(model: Any, ids: torch.Tensor, tracing: Any) -> None:
    with tracing() as tr:
        model(ids)
    return tr


def _corpus(model: Any, batches: list[torch.Tensor], overlap: bool = True, host_counts: bool = False) -> None:
    """RouteScope's corpus statistics over `batches` (ids on the CPU, as a corpus's text gives them),
    through `run_corpus`'s own counting loop (`route_stats`), every count read back to the host at
    the end. `overlap=False` hands that loop one batch at a time, so nothing overlaps: the same code,
    unpipelined. `host_counts`: a reader without tensors, so the routes come to the CPU and numpy
    counts them there (session 35's way)."""
    import dataclasses

    from routescope.analysis.corpus import stats as S
    from routescope.analysis.corpus.run import layout_of, route_stats
    from routescope.analysis.runs.family_table import route_reader

    reader, layout = route_reader(model), layout_of(model, [])
    if host_counts:
        reader = dataclasses.replace(reader, tensors=None)
    items = [(x, ([x.shape[1]] * len(x), [])) for x in batches]
    with torch.inference_mode():
        for group in ([items] if overlap else [[i] for i in items]):
            stats = route_stats(model, reader, group, layout)
            stats.first, stats.co, [stats.spec[by].items() for by in S.BY_KINDS]  # the counts on the host


def _importance(model: Any, tok: Any, path: Path, emit: Callable[..., None]) -> None:
    from routescope.analysis.reports import importance as I
    from routescope.analysis.inputs.datasets import load_corpus

    import random
    words = tok.decode(list(range(1000, 3000))).split()
    rng = random.Random(0)
    data_file = path.parent / "importance-data.txt"
    data_file.write_text("\n".join(" ".join(rng.choice(words) for _ in range(200)) for _ in range(40)) + "\n")
    data = load_corpus(data_file)
    layers = list(model.routing_layers())
    layer = layers[len(layers) // 2]
    results = {}
    for label, method, k in (("fast1", "fast", 1), ("fast16", "fast", 16), ("naive", "naive", 1)):
        s = I.ImportanceSettings(layers=(layer,), max_tokens=2048, sweep=method, ablations_per_forward=k,
                                 control_draws=2, prune_max=0, bootstrap=100)
        t0 = time.perf_counter()
        r = I.importance(model, tok, data, s, name="olmoe-shape")
        sync()
        results[label] = (time.perf_counter() - t0, r.tables["importance"])
    base = results["naive"][1].set_index(["layer", "option"])["delta_nll"]
    emit("importance", experts=64, tokens=2048, **{f"{k}_s": v[0] for k, v in results.items()},
         fast16_over_naive=results["fast16"][0] / results["naive"][0],
         fast1_over_naive=results["fast1"][0] / results["naive"][0],
         max_abs_delta_diff_fast16=float((results["fast16"][1].set_index(["layer", "option"])["delta_nll"]
                                          - base).abs().max()))


def report(jsonl: Path) -> str:
    """The RESULTS.md table of one run's JSON lines (figures as measured, rounded for reading)."""
    steps = {d["step"]: d for d in map(json.loads, jsonl.read_text().splitlines())}
    rows = []
    for step, d in steps.items():
        for k, v in d.items():
            if k != "step":
                rows.append(f"| {step} | {k} | {round(v, 4) if isinstance(v, float) else v} |")
    return "\n".join(["| step | figure | value |", "|---|---|---|", *rows])


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--report"]:
        print(report(Path(sys.argv[2])))
    else:
        main()
