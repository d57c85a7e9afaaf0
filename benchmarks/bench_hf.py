"""Issue 21: the cost of instrumenting a Hugging Face MoE model (batch 1, 64 tokens).

Three variants, interleaved: `plain` (the transformers model called directly, with no RouteScope
hook on it: a second instance sharing the very same parameter tensors), `idle` (the RouteScope
HFModel call, its permanent router hooks registered, no trace active) and `traced` (every site
recorded). Goals: idle / plain <= 1.02 (as for our own families' sites); traced / idle <= 1.10.
The shipped checkpoints/<name> when present, else the preset with random weights.
"""
from __future__ import annotations

import torch

from benchmarks import common as C
from routescope.core_models import tracing

PRESETS = ("mixtral-tiny", "olmoe-tiny")


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


def run(args) -> C.Report:
    rep = C.Report("bench_hf", "Hugging Face MoE: instrumentation cost (batch 1, 64 tokens)")
    t = C.Table("Forward latency: plain transformers vs RouteScope idle vs every site traced",
                ["model", "weights", "sites", "plain ms", "idle ms", "traced ms", "idle/plain", "traced/idle"])
    n_reps, inner = C.reps(args, 60, 5), (1 if args.quick else 3)
    for name in PRESETS:
        model, _, source = C.model_for(name)
        twin = plain_twin(model)
        ids = C.random_ids(64, model.vocab_size, seed=1)

        def traced() -> None:
            with tracing():
                model(ids)

        with torch.no_grad():
            with tracing() as tr:
                ref = model(ids).logits
            assert torch.equal(ref, twin(input_ids=ids, use_cache=False).logits.float()), f"{name}: twin differs"
            s = C.interleaved({"plain": lambda: twin(input_ids=ids, use_cache=False), "idle": lambda: model(ids),
                               "traced": traced}, n_reps, inner=inner)
        idle_ratio, trace_ratio = C.ratio(s["idle"], s["plain"]), C.ratio(s["traced"], s["idle"])
        t.add(name, source, str(len(tr.names())), C.ms(s["plain"]), C.ms(s["idle"]), C.ms(s["traced"]),
              C.fmt(idle_ratio, "x"), C.fmt(trace_ratio, "x"))
        rep.goals.append(C.Goal(f"21.idle.{name}", f"{name}: RouteScope call, hooks idle, vs plain transformers",
                                "<=", 1.02, idle_ratio))
        rep.goals.append(C.Goal(f"21.trace.{name}", f"{name}: every site traced vs idle", "<=", 1.10, trace_ratio))
    t.notes.append(f"medians of {n_reps} interleaved repetitions x {inner} call(s); `sites` = sites recorded")
    rep.tables.append(t)
    return rep


if __name__ == "__main__":
    C.main(run, __doc__)
