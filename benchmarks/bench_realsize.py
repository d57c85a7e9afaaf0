"""Issue 27: a real-size MoE checkpoint in RouteScope against plain transformers.

The model: OLMoE-1B-7B's shape (64 experts, top-8, 16 layers, hidden 2048, vocabulary 50,304;
6.9B parameters, 13.8 GB in bfloat16) with random weights, written one safetensors shard per
layer from tensors made for that shard alone (a `save_pretrained` of the whole model would copy
the experts and pass 17 GiB), and a model of the same per-layer shape with 2 layers. Each side runs
in a fresh process (`--child`), which samples its anonymous memory (RssAnon: mapped weights do not
count) every 5 ms. The checkpoint's files are read once first (page cache warm for both sides), and
the sides run in the order plain, RouteScope, RouteScope, plain; each figure is the mean of a side's
two runs:

- plain: `AutoModelForCausalLM.from_pretrained(dtype="auto", trust_remote_code=False)`, a forward of 64 tokens, a forward
  over the corpus batches (4 x 64 tokens each);
- routescope: `rs.load` (dtype auto), pick -> first routing heatmap (load, a traced prompt pass of
  the same 64 tokens as plain's forward, `prompt_of`, with its views, the figures drawn; as the app,
  without the long export table, which only its Export view builds), a drop toggle (the same prompt
  with one expert dropped, views and figures included), the corpus statistics over the same batches, and `routescope export`
  of one 64-token prompt as its own process.

Goals (issue 27): load <= 1.1x plain; peak anonymous memory <= 1.1x plain; pick -> heatmap <=
plain load + one plain forward + 2 s (issue 41: the forward is the CPU floor); drop toggle <= 1.2x one plain forward + 300 ms; corpus throughput >= 0.95x plain
forward; export <= 1.2x (plain load + forward). The export is a process of its own, so its
denominator is too: a plain transformers script that loads the checkpoint and runs the same 64 ids,
started the same way (interpreter start and imports on both sides; the in-process figure, which
leaves them out on the plain side only, is printed beside it).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import common as C

SHAPE = dict(vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_attention_heads=16,
             num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
             max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=0, pad_token_id=1)
TOKENS, CORPUS_BATCHES, CORPUS_ROWS = 64, 2, 4


class AnonPeak:
    """The largest RssAnon of this process while the block runs (sampled every 5 ms)."""

    def __enter__(self) -> "AnonPeak":
        self.peak, self._stop = self.now(), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    @staticmethod
    def now() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.now())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.now())


def build(path: Path, layers: int, device: str = "cpu", shape: dict | None = None) -> int:
    """Write the checkpoint shard by shard: the embedding, each layer, then the head and final
    norm; random normal weights (std 0.02), norms 1, drawn on `device` (a GPU draws them faster).
    Returns the bytes written."""
    import transformers as T
    from safetensors.torch import save_file

    cfg = T.OlmoeConfig(**(shape or SHAPE), num_hidden_layers=layers, dtype="bfloat16")
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in T.OlmoeForCausalLM(cfg).state_dict().items()}
    groups: dict[str, list[str]] = {}
    for name in shapes:
        part = name.split(".")
        key = f"layer{int(part[2]):03d}" if part[:2] == ["model", "layers"] else ("embed" if "embed" in name else "head")
        groups.setdefault(key, []).append(name)
    path.mkdir(parents=True, exist_ok=True)
    gen, weight_map, total = torch.Generator(device).manual_seed(0), {}, 0
    names = sorted(groups)
    for i, key in enumerate(names):
        shard = f"model-{i + 1:05d}-of-{len(names):05d}.safetensors"
        tensors = {n: (torch.ones(shapes[n]) if "norm" in n else
                       torch.randn(shapes[n], generator=gen, device=device) * 0.02).to(torch.bfloat16).cpu()
                   for n in groups[key]}
        save_file(tensors, str(path / shard), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map.update({n: shard for n in tensors})
        del tensors
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}))
    cfg.save_pretrained(path)
    (path / "tokenizer.json").write_text(C.tokenizer_path().read_text())
    return total


# words of the project's own tokenizer (the benchmark's checkpoints carry it; a random id above its
# 4,096 entries decodes to nothing, so a prompt made by decoding random ids of the model's 50,304
# would shrink to a few tokens on the RouteScope side, as it did before session 35)
PROMPT_TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
               "with her friends. One day, she found a big red ball under a tree. Solve this problem: find the "
               "largest prime number less than one hundred and explain each step of the reasoning. ") * 2


def prompt_of(tok: Any) -> tuple[str, list[int]]:
    """A text that encodes to exactly TOKENS tokens, and those tokens (a `tokenizers.Tokenizer`):
    both sides run the very same ids, the plain side as ids, RouteScope's from the text."""
    enc = tok.encode(PROMPT_TEXT).ids
    for n in range(TOKENS, TOKENS + 16):
        text = tok.decode(enc[:n])
        ids = tok.encode(text).ids
        if len(ids) == TOKENS:
            return text, ids
    raise ValueError(f"no prefix of the prompt text encodes to {TOKENS} tokens")


def _batches(vocab: int) -> list[torch.Tensor]:
    return [C.random_ids(TOKENS, vocab, seed=10 + b, batch=CORPUS_ROWS) for b in range(CORPUS_BATCHES)]


def child(p: dict[str, Any]) -> dict[str, Any]:
    path, side = p["path"], p["side"]
    out: dict[str, Any] = {}
    with AnonPeak() as mem:
        t0 = time.perf_counter()
        if side == "plain":
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path, dtype="auto", trust_remote_code=False).eval()
            vocab = model.config.vocab_size
        else:
            import routescope as rs

            model, tok = rs.load(path)
            vocab = model.vocab_size
        out["load_s"] = time.perf_counter() - t0
        from tokenizers import Tokenizer

        prompt, prompt_ids = prompt_of(Tokenizer.from_file(str(Path(path) / "tokenizer.json")))
        ids = torch.tensor([prompt_ids])
        if side == "plain":
            with torch.inference_mode():
                model(ids)  # warm-up
                times = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    model(ids)
                    times.append(time.perf_counter() - t0)
                out["forward_s"] = C.median(times)
                t0 = time.perf_counter()
                for b in _batches(vocab):
                    model(b)
                out["corpus_tok_s"] = CORPUS_BATCHES * CORPUS_ROWS * TOKENS / (time.perf_counter() - t0)
        else:
            from routescope.analysis.runs.session import RunSettings, run_prompt
            from routescope.rendering.drawers import draw_run
            from routescope.core_models.ablation import Ablation

            settings = RunSettings(max_new_tokens=0)
            out["prompt_tokens"] = len(tok.encode(prompt).ids)  # what run_prompt encodes: TOKENS, as plain's
            t0 = time.perf_counter()
            run = run_prompt(model, tok, prompt, settings=settings, table=False)  # as the app: no export table
            figs, _ = draw_run(run, model, stacked=True, layered=True)  # as the Routing view draws them
            out["first_heatmap_s"] = out["load_s"] + time.perf_counter() - t0
            out["figures"] = sorted(figs)
            layer = next(iter(model.routing_layers()))
            times = []
            for o in range(3):  # as the app redraws after a toggle: the prompt pass, its views and figures
                t0 = time.perf_counter()
                draw_run(run_prompt(model, tok, prompt, settings=settings, ablation=Ablation(drop=((layer, o),)),
                                    table=False), model, stacked=True, layered=True)
                times.append(time.perf_counter() - t0)
            out["toggle_s"] = C.median(times)
            out["corpus_tok_s"] = _corpus_throughput(model, vocab)
    out["peak_anon_gib"] = mem.peak / 2**30
    return out


def _corpus_throughput(model: Any, vocab: int) -> float:
    """Tokens a second of RouteScope's corpus statistics over the plain side's batches, through
    `run_corpus`'s own batch loop (bench_gpu's `_corpus`)."""
    from benchmarks.bench_gpu import _corpus

    t0 = time.perf_counter()
    _corpus(model, _batches(vocab))
    return CORPUS_BATCHES * CORPUS_ROWS * TOKENS / (time.perf_counter() - t0)


def warm_page_cache(path: Path) -> None:
    """Read every file of the checkpoint once, so the first side's load does not read the disk."""
    for f in sorted(path.iterdir()):
        with f.open("rb") as fh:
            while fh.read(1 << 24):
                pass


def mean_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of each number over a side's runs (the last run's other values)."""
    return {k: (sum(r[k] for r in runs) / len(runs) if isinstance(v, (int, float)) else v) for k, v in runs[-1].items()}


PLAIN_SCRIPT = """
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype="auto", trust_remote_code=False)
with torch.no_grad():
    model(input_ids=torch.tensor([[int(i) for i in sys.argv[2].split(",")]]), use_cache=False)
"""


def _process_seconds(cmd: list[str]) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, timeout=3600, env=env, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def export_and_plain_process(path: Path, out: Path) -> tuple[float, float]:
    """Seconds of `routescope export` of the 64-token prompt, and of a plain transformers script that
    loads the checkpoint and runs the same 64 ids, each its own process started the same way
    (interpreter start and imports included on both sides), in the order export, plain, plain,
    export; each the mean of its two."""
    from tokenizers import Tokenizer

    prompt, ids = prompt_of(Tokenizer.from_file(str(path / "tokenizer.json")))
    export = [sys.executable, "-m", "routescope.cli.main", "export", str(path), "--prompt", prompt, "--out", str(out),
              "--quiet"]
    plain = [sys.executable, "-c", PLAIN_SCRIPT, str(path), ",".join(map(str, ids))]
    times: dict[str, list[float]] = {"export": [], "plain": []}
    for side in ("export", "plain", "plain", "export"):
        times[side].append(_process_seconds(export if side == "export" else plain))
    return sum(times["export"]) / 2, sum(times["plain"]) / 2


def run(args) -> C.Report:
    rep = C.Report("bench_realsize", "Real-size MoE: RouteScope against plain transformers (bfloat16, CPU)")
    t = C.Table("Each side in a fresh process (times in s; memory: peak RssAnon in GiB)",
                ["model", "params", "side", "load", "forward 64", "first heatmap", "drop toggle", "corpus tok/s",
                 "export", "peak anon"])
    root = Path(args.root)
    for layers in ((2,) if args.quick else (2, 16)):
        path = root / f"olmoe-shape-{layers}l"
        if not (path / "config.json").is_file():
            build(path, layers)
        warm_page_cache(path)  # neither side pays the first read from disk
        runs: dict[str, list[dict[str, Any]]] = {"plain": [], "routescope": []}
        for side in ("plain", "routescope", "routescope", "plain"):  # ABBA: a drifting load hits both alike
            runs[side].append(C.run_child("benchmarks.bench_realsize", {"path": str(path), "side": side},
                                          args.threads, 7200))
        plain, ours = (mean_of(runs[s]) for s in ("plain", "routescope"))
        assert ours["prompt_tokens"] == TOKENS, f"RouteScope's prompt has {ours['prompt_tokens']} tokens"
        export, plain_process = export_and_plain_process(path, root / f"export-{layers}l.csv")
        n = sum(json.loads((path / "model.safetensors.index.json").read_text())["metadata"].values()) / 2
        name = f"OLMoE shape, {layers} layers"
        t.rows.append([name, f"{n / 1e9:.2f}B", "plain", f"{plain['load_s']:.1f}", f"{plain['forward_s']:.2f}", "-", "-",
                       f"{plain['corpus_tok_s']:.0f}", "-", f"{plain['peak_anon_gib']:.2f}"])
        t.rows.append([name, f"{n / 1e9:.2f}B", "routescope", f"{ours['load_s']:.1f}", "-",
                       f"{ours['first_heatmap_s']:.1f}", f"{ours['toggle_s']:.2f}", f"{ours['corpus_tok_s']:.0f}",
                       f"{export:.1f}", f"{ours['peak_anon_gib']:.2f}"])
        tag = f"27.{layers}l"
        rep.goals += [
            C.Goal(f"{tag}.load", f"{name}: load / plain load", "<=", 1.1, ours["load_s"] / plain["load_s"]),
            C.Goal(f"{tag}.memory", f"{name}: peak anonymous memory / plain", "<=", 1.1,
                   ours["peak_anon_gib"] / plain["peak_anon_gib"]),
            C.Goal(f"{tag}.heatmap", f"{name}: pick -> first heatmap minus (plain load + one plain forward)", "<=",
                   2.0, ours["first_heatmap_s"] - plain["load_s"] - plain["forward_s"], "s"),
            C.Goal(f"{tag}.toggle", f"{name}: drop toggle / (1.2 x plain forward + 0.3 s)", "<=", 1.0,
                   ours["toggle_s"] / (1.2 * plain["forward_s"] + 0.3)),
            C.Goal(f"{tag}.corpus", f"{name}: corpus throughput / plain forward's", ">=", 0.95,
                   ours["corpus_tok_s"] / plain["corpus_tok_s"]),
            C.Goal(f"{tag}.export", f"{name}: export process / plain load + forward process", "<=", 1.2,
                   export / plain_process),
        ]
        t.notes.append(f"{name}: export {export:.1f} s as its own process; a plain transformers script loading the "
                       f"checkpoint and running the same 64 ids {plain_process:.1f} s as its own process; plain load + "
                       f"forward in-process (after imports) {plain['load_s'] + plain['forward_s']:.1f} s, "
                       f"export / that = {export / (plain['load_s'] + plain['forward_s']):.2f}x")
    rep.tables.append(t)
    rep.notes.append(f"checkpoints under {root} (kept for reruns); shards written one per layer")
    return rep


if __name__ == "__main__":
    import argparse

    if "--root" in sys.argv:  # the parent's own option, not the children's
        i = sys.argv.index("--root")
        ROOT = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    else:
        ROOT = "/tmp/routescope-realsize"

    def _run(args: argparse.Namespace) -> C.Report:
        args.root = ROOT
        return run(args)

    C.main(_run, __doc__, child=child)
