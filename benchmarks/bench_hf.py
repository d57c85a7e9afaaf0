"""Issue 21: the cost of instrumenting a Hugging Face MoE model (batch 1, 64 tokens).

Five variants, interleaved: `plain` (the very transformers module tree RouteScope instruments,
called directly with every RouteScope wrapped forward detached for the call), `hooked` (the same
call with them attached and idle; the name is from when they were hooks), `call` (RouteScope's
model call around it: input and option checks, the call state, the wrappers idle), `traced` (every
site recorded) and `twin` (a second transformers instance sharing the very same parameter tensors,
never instrumented). Goals: hooked / plain <= 1.02 (the instrumentation idle, as bench_trace
measures our own families' sites: the same call path with and without them; the median over five
fresh processes, `idle_child`); traced / call <= 1.10 (from its own two-variant interleave, as the
idle goal: a variant run between them widens the noise). call / plain is reported with its
absolute cost: RouteScope's per-call checks. Where valgrind is installed, a second table counts
each variant's instructions per forward (`instruction_table`): the same ratios, free of the
machine's timing noise (not in --quick).

Why `plain` is the same instance and `twin` only a control: two identical instances sharing every
parameter differ by up to about 5% on the 2-core CPU (measured in session 35: four twins of
olmoe-tiny, interleaved, 0.95x-1.035x of one another), which is more than the 2% being measured.
twin / plain shows that instance-to-instance spread in each run.
The shipped checkpoints/<name> when present, else the preset with random weights.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks import common as C
from routescope.core_models import tracing

PRESETS = ("mixtral-tiny", "olmoe-tiny")
# a larger Mixtral-style model (random weights, ~0.1B parameters): the hooks' fixed cost per call
# against a forward of realistic width
LARGER = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
              num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2)


def larger_model():
    import json

    from routescope.core_models import build_model
    from routescope.core_models.hf import HFConfig

    torch.manual_seed(0)
    d = {"model_type": "mixtral", "vocab_size": 4096, "max_position_embeddings": 256, **LARGER}
    return build_model(HFConfig(model_type="mixtral", hf_config=json.dumps(d), vocab_size=4096, context=256)).eval()


def plain_twin(model):
    """The same transformers model without RouteScope's hooks, sharing every parameter and buffer."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        twin = AutoModelForCausalLM.from_config(model.hf.config)
    twin.load_state_dict(model.hf.state_dict(), assign=True, strict=True)
    twin.tie_weights()
    for name, buf in model.hf.named_buffers():  # non-persistent buffers (rotary tables) are not in the state dict
        parent, _, leaf = name.rpartition(".")
        setattr(twin.get_submodule(parent) if parent else twin, leaf, buf)
    return twin.eval()


class Detached:
    """Every forward hook and instance `forward` of a module tree, swapped out while the block runs and
    put back after. Entering with `detach=False` does the same dictionary work without removing
    anything, so both timed sides pay the swap. Not quite the same cost: under callgrind on
    mixtral-tiny (session 37) hooked minus plain read +20 thousand instructions a forward with the
    swap around each call and +158 thousand with it outside the count, a bias of about 0.4% of a
    forward in the hooked side's favour; `instruction_table` counts without it."""

    HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
             "_forward_hooks_with_kwargs")

    def __init__(self, root: torch.nn.Module, detach: bool = True) -> None:
        self.modules = list(root.modules())
        self.kept = [({h: getattr(m, h) for h in self.HOOKS}, m.__dict__.get("forward")) for m in self.modules]
        self.detach = detach
        self.EMPTY = {h: type(d)() for h, d in self.kept[0][0].items()}  # shared, never written while detached

    def __enter__(self) -> None:
        for m, (hooks, fwd) in zip(self.modules, self.kept):  # straight into __dict__: Module.__setattr__ costs
            for h, d in hooks.items():                            # microseconds, as much as a tiny forward's hooks
                m.__dict__[h] = self.EMPTY[h] if self.detach else d
            if self.detach and fwd is not None:
                del m.__dict__["forward"]

    def __exit__(self, *exc) -> None:
        for m, (hooks, fwd) in zip(self.modules, self.kept):
            for h, d in hooks.items():
                m.__dict__[h] = d
            if fwd is not None:
                m.__dict__["forward"] = fwd


IDLE_PROCESSES = 5


def _model(name: str):
    return C.model_for(name) if name in PRESETS else (larger_model(), None, "random weights")


def direct(model, ids, detach: bool):
    """The transformers module tree called directly, RouteScope's hooks detached for the call (or
    the same dictionary work with them left on: `Detached`)."""
    swap = Detached(model.hf, detach)

    def call() -> None:
        with swap:
            model.hf(input_ids=ids, use_cache=False)
    return call


def idle_child(p: dict) -> dict:
    """One fresh process's idle ratio: hooked vs detached, interleaved (`run` takes the median of
    several: a process's memory layout moves a tiny forward by a few percent, the same for every
    repetition in it, so more repetitions in one process cannot average it out)."""
    model, _, _ = _model(p["model"])
    ids = C.random_ids(64, model.vocab_size, seed=1)
    with torch.no_grad():
        idle = C.interleaved({"plain": direct(model, ids, True), "hooked": direct(model, ids, False)}, p["reps"],
                             inner=p["inner"])
    return {"ratio": C.ratio(idle["hooked"], idle["plain"]), "plain_ms": C.ms(idle["plain"]),
            "hooked_ms": C.ms(idle["hooked"])}


# --- instructions per forward: deterministic where time is not -----------------------------------------

COUNTED_CALLS = 5  # forwards counted per variant (after two uncounted warm-up calls)
VARIANTS = ("plain", "hooked", "call", "traced")


def counted(f: Callable[[], Any]) -> None:
    """Run `f` as the comparator of one libc qsort call, so that valgrind's callgrind with
    `--collect-atstart=no --toggle-collect=*qsort*` counts the instructions `f` executes and nothing
    else (no interpreter start, import or model load; a fixed few hundred for the qsort itself)."""
    import ctypes

    libc = ctypes.CDLL(None)
    done: list[bool] = []

    def compare(a, b) -> int:
        if not done:
            done.append(True)
            f()
        return 0
    pair = (ctypes.c_int * 2)(0, 1)
    libc.qsort(pair, 2, ctypes.sizeof(ctypes.c_int), ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(compare))


def instructions_child(p: dict) -> dict:
    """Count one variant's forwards. plain and hooked: the module tree called directly, its wrappers
    detached (or not) for the whole count, so no swap (`Detached`) is inside it."""
    model, _, _ = _model(p["model"])
    ids = C.random_ids(64, model.vocab_size, seed=1)
    which = p["variant"]

    def traced() -> None:
        with tracing():
            model(ids)
    f = {"call": lambda: model(ids), "traced": traced}.get(which, lambda: model.hf(input_ids=ids, use_cache=False))
    with torch.no_grad(), Detached(model.hf, detach=which == "plain"):
        f(), f()
        counted(lambda: [f() for _ in range(p["calls"])])
    return {}


def instructions(name: str, which: str, threads: int) -> float:
    """Instructions per forward of one variant, counted by callgrind in a fresh process."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        C.run_child("benchmarks.bench_hf", {"kind": "instructions", "model": name, "variant": which,
                                            "calls": COUNTED_CALLS}, threads, timeout=3600,
                    prefix=("valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=*qsort*",
                            f"--callgrind-out-file={out}"), env={"PYTHONHASHSEED": "0"})
        totals = [int(line.split()[1]) for line in out.read_text().splitlines() if line.startswith("totals:")]
    return totals[0] / COUNTED_CALLS


def instruction_table(args, rep: C.Report) -> None:
    """Each variant's instructions per forward on the tiny models (two callgrind processes at a time:
    counts do not depend on the load). Not the goal, which is time; where time moves by more than the
    effect being measured, this says what the code itself costs."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    if shutil.which("valgrind") is None:
        rep.notes.append("instructions per forward: not measured (valgrind is not installed)")
        return
    jobs = [(m, v) for m in PRESETS for v in VARIANTS]
    with ThreadPoolExecutor(2) as pool:
        got = dict(zip(jobs, pool.map(lambda j: instructions(*j, args.threads), jobs)))
    t = C.Table("Instructions per forward (valgrind callgrind, deterministic; batch 1, 64 tokens)",
                ["model", *(f"{v} (M)" for v in VARIANTS), "hooked/plain", "call/plain", "traced/call"])
    for m in PRESETS:
        n = {v: got[(m, v)] for v in VARIANTS}
        t.add(m, *(f"{n[v] / 1e6:.2f}" for v in VARIANTS), f"{n['hooked'] / n['plain']:.4f}x",
              f"{n['call'] / n['plain']:.4f}x", f"{n['traced'] / n['call']:.4f}x")
    t.notes.append(f"each: one fresh process under `valgrind --tool=callgrind`, counting only {COUNTED_CALLS} forwards "
                   "after two warm-up calls (`counted`); instructions are not time (a cache miss costs more than an "
                   "add), but they do not move with the machine's load or a process's memory layout")
    rep.tables.append(t)


def run(args) -> C.Report:
    rep = C.Report("bench_hf", "Hugging Face MoE: instrumentation cost (batch 1, 64 tokens)")
    t = C.Table("Forward latency: plain transformers vs the same model with idle wrappers, RouteScope's call, every site traced",
                ["model", "weights", "sites", "plain ms", "hooked ms", "call ms", "traced ms", "hooked/plain",
                 "call/plain (us)", "traced/call", "twin/plain (control)"])
    n_reps, inner = C.reps(args, 60, 5), (1 if args.quick else 3)
    idle_runs: dict[str, list[float]] = {}
    for name in (*PRESETS, "mixtral-d512"):
        model, _, source = _model(name)
        twin = plain_twin(model)
        ids = C.random_ids(64, model.vocab_size, seed=1)

        def traced() -> None:
            with tracing():
                model(ids)

        with torch.no_grad():
            with tracing() as tr:
                ref = model(ids).logits
            assert torch.equal(ref, twin(input_ids=ids, use_cache=False).logits.float()), f"{name}: twin differs"
            with Detached(model.hf):
                assert torch.equal(ref, model.hf(input_ids=ids, use_cache=False).logits.float()), f"{name}: detached differs"
            s = C.interleaved({"call": lambda: model(ids), "traced": traced,
                               "twin": lambda: twin(input_ids=ids, use_cache=False), "plain": direct(model, ids, True)},
                              n_reps, inner=inner)
            # the traced goal from its own two-variant interleave (in the five-variant loop above the
            # other instances run between them; both figures are printed)
            trace = C.interleaved({"call": lambda: model(ids), "traced": traced}, 3 * n_reps, inner=inner)
        # the idle goal: hooked vs detached in several fresh processes, each its own interleave (2%
        # is near what one process's memory layout moves a tiny forward by: session 36 read 1.031x
        # for mixtral-tiny in one run, 0.989-1.006x in three before)
        n_proc = 1 if args.quick else IDLE_PROCESSES
        idle_reps = (3 if name in PRESETS else 1) * n_reps
        procs = [C.run_child("benchmarks.bench_hf", {"model": name, "reps": idle_reps, "inner": inner}, args.threads)
                 for _ in range(n_proc)]
        idle = {k: [p[k] for p in procs] for k in ("ratio", "plain_ms", "hooked_ms")}
        idle_runs[name] = idle["ratio"]
        hook_ratio, call_ratio = C.median(idle["ratio"]), C.ratio(s["call"], s["plain"])
        trace_ratio = C.ratio(trace["traced"], trace["call"])
        t.add(name, source, str(len(tr.names())), C.median(idle["plain_ms"]), C.median(idle["hooked_ms"]), C.ms(s["call"]),
              C.ms(s["traced"]), C.fmt(hook_ratio, "x"),
              f"{C.fmt(call_ratio, 'x')} ({(C.ms(s['call']) - C.ms(s['plain'])) * 1e3:+.0f})",
              f"{C.fmt(trace_ratio, 'x')} ({C.fmt(C.ratio(s['traced'], s['call']), 'x')})",
              C.fmt(C.ratio(s["twin"], s["plain"]), "x"))
        rep.goals.append(C.Goal(f"21.idle.{name}", f"{name}: RouteScope's wrapped forwards idle vs the same model without them",
                                "<=", 1.02, hook_ratio))
        rep.goals.append(C.Goal(f"21.trace.{name}", f"{name}: every site traced vs untraced", "<=", 1.10, trace_ratio))
    t.notes.append("hooked/plain (the idle goal): the median over fresh processes, each its own interleave of the two "
                   f"({3 * n_reps} repetitions x {inner} call(s) for the tiny models, {n_reps} for mixtral-d512); plain "
                   "and hooked ms: the medians of the processes' medians; per process: "
                   + "; ".join(f"{n} " + ", ".join(f"{r:.3f}x" for r in rs) for n, rs in idle_runs.items()))
    t.notes.append(f"call, traced and twin: of a second interleave with plain, {n_reps} repetitions, whose plain "
                   f"the call/plain and twin/plain ratios use; traced/call: of its own interleave of the two, "
                   f"{3 * n_reps} repetitions (in brackets: from the five-variant interleave); `sites` = sites recorded")
    rep.tables.append(t)
    if not args.quick:
        instruction_table(args, rep)
    return rep


def child(p: dict) -> dict:
    return instructions_child(p) if p.get("kind") == "instructions" else idle_child(p)


if __name__ == "__main__":
    C.main(run, __doc__, child=child)
