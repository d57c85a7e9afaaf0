"""MoEP: shapes, parameter counts, causality, top-k routing, ablations, KV cache, training."""
from __future__ import annotations

import re

import pytest
import torch

from core_models import Ablation, ConfigError, build_model, from_name, param_count, tracing
from core_models.moep import MoEP, MoEPConfig, moep_param_count

TINY = dict(vocab_size=97, d_model=32, d_par=16, n_heads=2, n_par_heads=1, context=32)


def tiny(seed: int = 0, **kw) -> MoEP:
    torch.manual_seed(seed)
    return build_model(MoEPConfig(**{**TINY, **kw})).eval()


def ids(B: int = 2, T: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


class CallCounter:
    """Counts forward calls of a module; the hook is removed on exit, even after an error."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.calls = module, 0

    def __enter__(self) -> "CallCounter":
        self.handle = self.module.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def test_output_shape_and_presets():
    m = tiny()
    assert m(ids(3, 7)).logits.shape == (3, 7, 97)
    for name, expert in (("moep", "linear"), ("moep-swiglu", "swiglu")):
        c = from_name(name, **TINY)
        assert isinstance(c, MoEPConfig) and c.expert == expert


@pytest.mark.parametrize("kw", [
    {}, dict(expert="swiglu"), dict(expert="swiglu", expert_hidden=24), dict(tie_embeddings=False),
    dict(ln_bias=True, n_pre=0, n_post=2), dict(n_parallel_layers=3, n_blocks=3, top_k=1, n_experts=2),
])
def test_param_count_formula(kw):
    m = tiny(**kw)
    assert moep_param_count(m.config) == param_count(m.config) == sum(p.numel() for p in m.parameters())


def test_active_params_against_module_sizes():
    m = tiny(expert="swiglu", n_blocks=3, top_k=1, n_experts=4, expert_top_k=2)
    size = lambda mod: sum(p.numel() for p in mod.parameters())
    skipped = sum(2 * size(layer.blocks[0]) for layer in m.parallel)  # 3 - 1 blocks per layer
    skipped += 2 * (size(m.moe_shrink.experts[0]) + size(m.moe_grow.experts[0]))  # 4 - 2 experts each
    assert m.active_params() == m.num_params() - skipped < m.num_params()


def test_causal():
    m = tiny()
    a = ids(2, 16)
    with torch.no_grad():
        ref = m(a).logits
        for t in (0, 5, 14):
            b = a.clone()
            b[:, t + 1:] = torch.randint(0, 97, b[:, t + 1:].shape, generator=torch.Generator().manual_seed(t))
            torch.testing.assert_close(m(b).logits[:, :t + 1], ref[:, :t + 1], atol=1e-6, rtol=0)


def test_site_shapes_match_their_docs():
    m = tiny()
    B, T = 2, 9
    with torch.no_grad(), tracing() as tr:
        m(ids(B, T))
    c = m.config
    expect = {"moe_shrink.router.indices": (B, T, c.expert_top_k), "moe_shrink.out": (B, T, c.d_par),
              "parallel.0.router.probs": (B, T, c.n_blocks), "parallel.0.router.weights": (B, T, c.top_k),
              "parallel.1.combined": (B, T, c.d_par), "parallel.1.out": (B, T, c.d_par),
              "moe_grow.router.logits": (B, T, c.n_experts), "moe_grow.out": (B, T, c.d_model)}
    for name, shape in expect.items():
        assert tr[name].shape == shape, name
    assert any(re.fullmatch(r"parallel\.0\.blocks\.\d\.out", n) for n in tr.names())
    for name in tr.names():  # every documented shape has the recorded rank, batch and pos first
        doc = re.match(r"\[([^\]]*)\]", tr.shapes[name]).group(1).split(", ")
        assert tr[name].dim() == len(doc) and tr[name].shape[:2] == (B, T) and doc[:2] == ["batch", "pos"], name


def test_topk_routing_and_mixture_recomputed():
    m = tiny()
    x_in = {}
    h = m.moe_shrink.register_forward_pre_hook(lambda mod, args: x_in.update(x=args[0].detach()))
    try:
        with torch.no_grad(), tracing() as tr:
            m(ids(2, 10))
    finally:
        h.remove()
    for layer, k in (("moe_shrink", 2), ("parallel.0", 2), ("parallel.1", 2), ("moe_grow", 2)):
        probs = torch.softmax(tr[f"{layer}.router.logits"], dim=-1)
        top, idx = torch.topk(probs, k, dim=-1)
        assert torch.equal(tr[f"{layer}.router.indices"], idx), layer
        torch.testing.assert_close(tr[f"{layer}.router.weights"], top / top.sum(-1, keepdim=True))
    # parallel.0: out = in + sum_k w_k * block_{idx_k}(in), unselected blocks contributing nothing
    x, idx, w = tr["moe_shrink.out"], tr["parallel.0.router.indices"], tr["parallel.0.router.weights"]
    expect = x.clone()
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            for s in range(idx.shape[-1]):
                expect[b, t] += w[b, t, s] * tr[f"parallel.0.blocks.{int(idx[b, t, s])}.out"][b, t]
    torch.testing.assert_close(tr["parallel.0.out"], expect, atol=1e-6, rtol=1e-5)
    # moe_shrink: a plain loop over tokens and their selected experts
    xs, idx, w = x_in["x"], tr["moe_shrink.router.indices"], tr["moe_shrink.router.weights"]
    expect = torch.zeros_like(tr["moe_shrink.out"])
    with torch.no_grad():
        for b in range(xs.shape[0]):
            for t in range(xs.shape[1]):
                for s in range(idx.shape[-1]):
                    expert = m.moe_shrink.experts[int(idx[b, t, s])]
                    expect[b, t] += w[b, t, s] * expert(m.moe_shrink.norm(xs[b, t]))
    torch.testing.assert_close(tr["moe_shrink.out"], expect, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cached", [False, True])
def test_dropped_block_never_selected_or_run(cached):
    m = tiny()
    ab = Ablation(drop=(("parallel.0", 1), ("moe_grow", 3)))
    with CallCounter(m.parallel[0].blocks[1]) as blk, CallCounter(m.moe_grow.experts[3]) as exp, \
            CallCounter(m.parallel[1].blocks[1]) as other:
        with torch.no_grad(), tracing(["parallel.0.router.indices", "moe_grow.router.indices"]) as tr:
            m(ids(), ablation=ab, cache=m.new_cache() if cached else None)
    assert blk.calls == 0 and exp.calls == 0
    assert not (tr["parallel.0.router.indices"] == 1).any() and not (tr["moe_grow.router.indices"] == 3).any()
    assert other.calls == 1 or not cached  # not dropped elsewhere: runs with a cache


def test_dropping_leaves_fewer_than_k():
    m = tiny()
    ab = Ablation(drop=(("parallel.1", 0), ("parallel.1", 1), ("parallel.1", 3)))
    with torch.no_grad(), tracing(["parallel.1.router.indices", "parallel.1.router.weights"]) as tr:
        m(ids(), ablation=ab)
    assert (tr["parallel.1.router.indices"] == 2).all() and tr["parallel.1.router.indices"].shape[-1] == 1
    assert torch.equal(tr["parallel.1.router.weights"], torch.ones_like(tr["parallel.1.router.weights"]))


def test_forcing_routes_every_token():
    m = tiny()
    ab = Ablation(force=(("parallel.1", 2), ("moe_shrink", 0)))
    with CallCounter(m.parallel[1].blocks[3]) as unused, CallCounter(m.moe_shrink.experts[1]) as unused_expert:
        with torch.no_grad(), tracing() as tr:
            m(ids(), ablation=ab)
    for name, j in (("parallel.1", 2), ("moe_shrink", 0)):
        assert (tr[f"{name}.router.indices"] == j).all()
        assert (tr[f"{name}.router.weights"] == 1).all()
    assert unused.calls == 0 and unused_expert.calls == 0  # no cache: unselected blocks skipped
    torch.testing.assert_close(tr["parallel.1.out"], tr["parallel.0.out"] + tr["parallel.1.blocks.2.out"])


@pytest.mark.parametrize("expert", ["linear", "swiglu"])
def test_cached_decoding_matches_recompute(expert):
    m = tiny(expert=expert)
    seq = ids(2, 20, seed=3)
    with torch.no_grad():
        full = m(seq).logits
        cache = m.new_cache()
        steps = [m(seq[:, :4], cache=cache).logits]
        for t in range(4, 20):
            steps.append(m(seq[:, t:t + 1], cache=cache).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("field, kw", [
    ("top_k", dict(top_k=5)), ("expert_top_k", dict(expert_top_k=5)), ("expert", dict(expert="mlp")),
    ("n_par_heads", dict(n_par_heads=3)), ("n_heads", dict(n_heads=5)), ("n_pre", dict(n_pre=-1)),
    ("n_blocks", dict(n_blocks=0)), ("aux_lambda", dict(aux_lambda=-1.0)), ("expert_hidden", dict(expert_hidden=-2)),
])
def test_config_errors_name_the_field(field, kw):
    with pytest.raises(ConfigError, match=rf"MoEPConfig\.{field} ="):
        MoEPConfig(**{**TINY, **kw})


def test_training_aux_loss_backpropagates():
    m = tiny().train()
    out = m(ids())
    assert isinstance(out.aux_loss, torch.Tensor) and out.aux_loss.dim() == 0
    assert set(out.aux) == {"load_balance"}
    out.aux_loss.backward()
    for router in (m.moe_shrink.router, m.parallel[0].router, m.moe_grow.router):
        assert router.proj.weight.grad is not None and router.proj.weight.grad.abs().sum() > 0
    m.eval()
    assert m(ids()).aux_loss is None
