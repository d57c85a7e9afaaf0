"""Goal 1: the cost of routing sites, per family preset (batch 1, 64 tokens).

Three variants of one model, interleaved: `stripped` (a deep copy with every Site replaced by
nn.Identity: no instrumentation at all), `idle` (sites present, no trace active) and `traced`
(`core_models.tracing()` recording every site). Goals: traced / idle <= 1.10; idle / stripped <= 1.02.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from benchmarks import common as C
from routescope.core_models import tracing
from routescope.core_models.sites import Site


def strip_sites(model: nn.Module) -> nn.Module:
    """A copy of `model`'s module tree with every routing site replaced by nn.Identity. Parameters
    and buffers are shared, not copied: both variants then read the very same weight memory, so a
    difference in where two copies landed (cache, pages) cannot pass for a cost of the sites."""
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    clone = copy.deepcopy(model, memo=shared)
    names = [n for n, m in clone.named_modules() if isinstance(m, Site)]
    for name in names:
        parent_name, _, leaf = name.rpartition(".")
        parent = clone.get_submodule(parent_name) if parent_name else clone
        setattr(parent, leaf, nn.Identity())
    assert not any(isinstance(m, Site) for m in clone.modules())
    return clone


def run(args) -> C.Report:
    rep = C.Report("bench_trace", "1. Tracing cost per family (batch 1, 64 tokens)")
    t = C.Table("Forward latency: stripped (no sites) vs idle sites vs every site traced",
                ["preset", "weights", "sites", "stripped ms", "idle ms", "traced ms", "idle/stripped",
                 "traced/idle"])
    n_reps, inner = C.reps(args, 60, 5), (1 if args.quick else 3)
    for name in C.FAMILY_PRESETS:
        model, _, source = C.model_for(name)
        bare = strip_sites(model)
        ids = C.random_ids(64, model.vocab_size, seed=1)

        def traced() -> None:
            with tracing():
                model(ids)

        with torch.no_grad():
            with tracing() as tr:
                ref = model(ids).logits
            assert torch.equal(ref, bare(ids).logits), f"{name}: stripping the sites changed the logits"
            s = C.interleaved({"stripped": lambda: bare(ids), "idle": lambda: model(ids), "traced": traced},
                              n_reps, inner=inner)
        idle_ratio, trace_ratio = C.ratio(s["idle"], s["stripped"]), C.ratio(s["traced"], s["idle"])
        t.add(name, source, str(len(tr.names())), C.ms(s["stripped"]), C.ms(s["idle"]), C.ms(s["traced"]),
              C.fmt(idle_ratio, "x"), C.fmt(trace_ratio, "x"))
        rep.goals.append(C.Goal(f"1.trace.{name}", f"{name}: every site traced vs untraced", "<=", 1.10, trace_ratio))
        rep.goals.append(C.Goal(f"1.idle.{name}", f"{name}: idle sites vs sites removed", "<=", 1.02, idle_ratio))
    t.notes.append(f"medians of {n_reps} interleaved repetitions x {inner} call(s); `sites` = sites recorded")
    t.notes.append("llama-dense has no routing site: its ratios show the timing noise floor")
    rep.tables.append(t)
    return rep


if __name__ == "__main__":
    C.main(run, __doc__)
