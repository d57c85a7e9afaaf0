"""Issue 21: the cost of instrumenting a Hugging Face MoE model (batch 1, 64 tokens).

Four variants, interleaved: `plain` (the transformers model called directly, with no RouteScope
hook on it: a second instance sharing the very same parameter tensors), `hooked` (the instrumented
transformers model called directly: its permanent router hooks idle), `call` (RouteScope's model
call around it: input and option checks, the call state, the hooks idle) and `traced` (every site
recorded). Goals: hooked / plain <= 1.02 (the instrumentation idle, as bench_trace measures our own
families' sites: the same call path with and without them); traced / call <= 1.10. call / plain is
reported with its absolute cost: RouteScope's per-call checks, a fixed few tens of microseconds.
The shipped checkpoints/<name> when present, else the preset with random weights.
"""
from __future__ import annotations

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


def run(args) -> C.Report:
    rep = C.Report("bench_hf", "Hugging Face MoE: instrumentation cost (batch 1, 64 tokens)")
    t = C.Table("Forward latency: plain transformers vs the same model with idle hooks, RouteScope's call, every site traced",
                ["model", "weights", "sites", "plain ms", "hooked ms", "call ms", "traced ms", "hooked/plain",
                 "call/plain (us)", "traced/call"])
    n_reps, inner = C.reps(args, 60, 5), (1 if args.quick else 3)
    for name in (*PRESETS, "mixtral-d512"):
        model, _, source = C.model_for(name) if name in PRESETS else (larger_model(), None, "random weights")
        twin = plain_twin(model)
        ids = C.random_ids(64, model.vocab_size, seed=1)

        def traced() -> None:
            with tracing():
                model(ids)

        with torch.no_grad():
            with tracing() as tr:
                ref = model(ids).logits
            assert torch.equal(ref, twin(input_ids=ids, use_cache=False).logits.float()), f"{name}: twin differs"
            s = C.interleaved({"plain": lambda: twin(input_ids=ids, use_cache=False),
                               "hooked": lambda: model.hf(input_ids=ids, use_cache=False),
                               "call": lambda: model(ids), "traced": traced}, n_reps, inner=inner)
        hook_ratio, call_ratio = C.ratio(s["hooked"], s["plain"]), C.ratio(s["call"], s["plain"])
        trace_ratio = C.ratio(s["traced"], s["call"])
        t.add(name, source, str(len(tr.names())), C.ms(s["plain"]), C.ms(s["hooked"]), C.ms(s["call"]),
              C.ms(s["traced"]), C.fmt(hook_ratio, "x"),
              f"{C.fmt(call_ratio, 'x')} ({(C.ms(s['call']) - C.ms(s['plain'])) * 1e3:+.0f})", C.fmt(trace_ratio, "x"))
        rep.goals.append(C.Goal(f"21.idle.{name}", f"{name}: router hooks idle vs the same model without them",
                                "<=", 1.02, hook_ratio))
        rep.goals.append(C.Goal(f"21.trace.{name}", f"{name}: every site traced vs untraced", "<=", 1.10, trace_ratio))
    t.notes.append(f"medians of {n_reps} interleaved repetitions x {inner} call(s); `sites` = sites recorded")
    rep.tables.append(t)
    return rep


if __name__ == "__main__":
    C.main(run, __doc__)
