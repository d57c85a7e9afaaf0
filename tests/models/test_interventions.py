"""Ablation semantics, forced routes, thread safety and trace clean-up."""
import contextlib
import threading

import pytest
import torch

from routescope.core_models import Ablation, AblationError, tracing
from routescope.core_models.trace import active_trace

from tiny_models import tiny_model
from tolerances import FORWARD_EPS, assert_close_to_scale


@contextlib.contextmanager
def count_calls(module):
    calls = []
    handle = module.register_forward_hook(lambda *a: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


@pytest.mark.parametrize("key", ["pgpt", "pgpt3", "pgpt_sigmoid"])
def test_pgpt_keeping_one_path_equals_that_path_through_norm_and_head(key):
    model = tiny_model(key)
    idx = torch.randint(0, 97, (2, 10))
    n = model.config.n_paths
    for j in range(n):
        ab = Ablation(drop=tuple(("paths", o) for o in range(n) if o != j))
        got = model(idx, ablation=ab).logits
        with torch.no_grad():
            alone = model.head(model.ln_f(model.paths[j](model.embed(idx))))  # independent route
        assert_close_to_scale(got, alone, FORWARD_EPS, msg=f"path {j} alone")


def test_pgpt_dropped_path_is_not_computed_and_weights_renormalise():
    model = tiny_model("pgpt3")
    idx = torch.randint(0, 97, (1, 8))
    with count_calls(model.paths[1].blocks[0]) as calls, tracing(["mixer.weights"]) as tr:
        model(idx, ablation=Ablation.parse(drop=["paths:1"]))
    assert calls == []
    full = torch.softmax(model.mixer.w.detach(), 0)
    w = tr["mixer.weights"]
    assert w[1] == 0
    torch.testing.assert_close(w[[0, 2]], full[[0, 2]] / full[[0, 2]].sum())


@pytest.mark.parametrize("key", ["pgpt", "pgpt3", "pgpt_sigmoid"])
def test_pgpt1_reference_mode_runs_the_heaviest_path_without_ln_f(key):
    model = tiny_model(key)
    idx = torch.randint(0, 97, (2, 10))
    mode = Ablation.parse(modes=["pgpt1-reference"])
    full = model.mixer.full().detach()
    j = int(torch.argmax(full))  # the first of equal maxima
    with count_calls(model.paths[1 - j if j < 2 else 0].blocks[0]) as calls, torch.no_grad():
        got = model(idx, ablation=mode).logits
        alone = model.head(model.paths[j](model.embed(idx)))  # no ln_f
    assert calls == []  # the other paths never run
    assert_close_to_scale(got, alone, FORWARD_EPS, msg=f"path {j} without ln_f")
    assert mode.describe() == "mode pgpt1-reference" and not mode.is_empty


def test_an_ablation_mode_the_model_lacks_is_named():
    with pytest.raises(AblationError, match="not an ablation mode of this model .*: mode 'pgpt1-reference'"):
        tiny_model("moep")(torch.randint(0, 97, (1, 4)), ablation=Ablation.parse(modes=["pgpt1-reference"]))
    with pytest.raises(AblationError, match="modes: pgpt1-reference"):
        tiny_model("pgpt")(torch.randint(0, 97, (1, 4)), ablation=Ablation.parse(modes=["pgpt-2"]))


def test_forced_gumbel_route_is_the_one_used():
    model = tiny_model("gumbel_v1")
    idx = torch.randint(0, 97, (2, 12))
    for option in range(model.config.n_options):
        with tracing() as tr:
            model(idx, ablation=Ablation(force=(("parallel.1", option),)))
        assert (tr["parallel.1.router.choice"] == option).all()
        cands = [tr[f"parallel.1.paths.{j}.out"] for j in range(3)] + [tr["parallel.1.combined"]]
        # exact: the layer passes the forced candidate on as it is
        torch.testing.assert_close(tr["parallel.1.out"], cands[option], atol=0, rtol=0)


def test_gumbel_deterministic_route_is_argmax_and_output_is_that_candidate():
    model = tiny_model("gumbel_v2")
    with tracing() as tr:
        model(torch.randint(0, 97, (2, 12)))
    for i in range(2):
        logits = tr[f"parallel.{i}.router.logits"]
        assert torch.equal(tr[f"parallel.{i}.router.choice"], logits.argmax(-1))
        torch.testing.assert_close(tr[f"parallel.{i}.router.probs"], logits.softmax(-1))


def test_gumbel_dropped_option_is_never_chosen_and_not_computed():
    model = tiny_model("gumbel_v1")
    idx = torch.randint(0, 97, (2, 16))
    with count_calls(model.parallel[0].paths[2]) as calls, tracing() as tr:
        model(idx, ablation=Ablation.parse(drop=["2"]))
    assert calls == []
    for i in range(3):
        assert (tr[f"parallel.{i}.router.choice"] != 2).all()
        assert f"parallel.{i}.paths.2.out" not in tr  # never computed, so never recorded


def test_gumbel_sampled_routing_is_seeded():
    model = tiny_model("gumbel_v1")
    idx = torch.randint(0, 97, (1, 30))

    def routes(seed):
        with tracing(["parallel.0.router.choice"]) as tr:
            model(idx, routing="sampled", seed=seed)
        return tr["parallel.0.router.choice"]

    assert torch.equal(routes(1), routes(1))
    assert any(not torch.equal(routes(1), routes(s)) for s in range(2, 6))


def test_share_linear_dropped_path_contributes_zeros():
    model = tiny_model("share_linear")
    idx = torch.randint(0, 97, (1, 10))
    with count_calls(model.parallel[1].paths[0]) as calls, tracing() as tr:
        model(idx, ablation=Ablation.parse(drop=["parallel.1:0"]))
    assert calls == []
    layer = model.parallel[1]
    with torch.no_grad():
        expect = layer.combine(torch.cat([torch.zeros_like(tr["parallel.1.paths.1.out"]),
                                          tr["parallel.1.paths.1.out"], tr["parallel.1.paths.2.out"]], -1))
    torch.testing.assert_close(tr["parallel.1.combined"], expect)


def test_pagmlp_pathway_drop_zeroes_that_half():
    model = tiny_model("pagmlp")
    with tracing() as tr:
        model(torch.randint(0, 97, (1, 6)), ablation=Ablation.parse(drop=["blocks.1.ffn:1"]))
    assert (tr["blocks.1.ffn.geglu_out"] == 0).all()
    assert (tr["blocks.0.ffn.geglu_out"] != 0).any()


@pytest.mark.parametrize("spec,match", [
    (dict(drop=["parallel.9:0"]), "parallel.9"), (dict(drop=["7"]), "out of range"),
    (dict(drop=["0", "1", "2", "3"]), "every option"), (dict(drop=["par allel:1"]), "bad layer name"),
])
def test_bad_ablation_is_named(spec, match):
    model = tiny_model("gumbel_v1")
    with pytest.raises(AblationError, match=match):
        model(torch.randint(0, 97, (1, 4)), ablation=Ablation.parse(**spec))


def test_eight_threads_with_different_ablations_match_serial_results():
    model = tiny_model("gumbel_v1")
    idx = torch.randint(0, 97, (1, 24))
    ablations = [Ablation(), Ablation.parse(drop=["0"]), Ablation.parse(drop=["1"]), Ablation.parse(drop=["3"]),
                 Ablation.parse(force=["parallel.0:2"]), Ablation.parse(drop=["parallel.1:0"]),
                 Ablation.parse(force=["*:3"]), Ablation.parse(drop=["0", "parallel.2:1"])]

    def run(ab):
        with tracing() as tr:
            logits = model(idx, ablation=ab).logits
        return logits, {k: tr[k] for k in tr.names()}

    serial = [run(ab) for ab in ablations]
    results = [None] * 8
    barrier = threading.Barrier(8)

    def worker(i):
        barrier.wait()
        for _ in range(3):
            results[i] = run(ablations[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (ls, ts), (lp, tp) in zip(serial, results):  # exact: the same kernels on the same tensors
        assert torch.equal(ls, lp)
        assert ts.keys() == tp.keys() and all(torch.equal(ts[k], tp[k]) for k in ts)


def test_no_hook_or_trace_remains_after_a_forward_that_raises():
    model = tiny_model("share_linear")

    def boom(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with tracing(edits={"parallel.0.combined": boom}):
            model(torch.randint(0, 97, (1, 5)))
    assert active_trace() is None
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    with tracing() as tr:  # and the model still works
        model(torch.randint(0, 97, (1, 5)))
    assert "parallel.0.combined" in tr


def test_trace_edit_patches_a_site():
    model = tiny_model("pgpt")
    idx = torch.randint(0, 97, (1, 6))
    with tracing(edits={"paths.0.out": torch.zeros_like}):
        patched = model(idx).logits
    ref = model(idx, ablation=Ablation.parse(drop=["paths:0"])).logits  # renormalised, so differs
    zero_w = model(idx).logits
    assert not torch.allclose(patched, zero_w) and not torch.allclose(patched, ref)


def test_training_returns_auxiliary_routing_losses():
    model = tiny_model("gumbel_v2").train()
    out = model(torch.randint(0, 97, (2, 12)))
    assert set(out.aux) == {"routing_entropy", "load_balance"}
    # load term rewards balance: it is minus the entropy of the mean routing distribution
    assert out.aux["load_balance"] < 0
    (out.logits.logsumexp(-1).mean() + out.aux_loss).backward()
    assert model.parallel[0].router.proj.weight.grad is not None
