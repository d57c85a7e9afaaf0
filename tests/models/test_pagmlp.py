"""PAGMLP: the paper's dropout 0.1 while training (seeded by the call, inactive in eval; the same in
its SwiGLU baseline, llama-dense) and the independent / complementary gate options, each against an
independent float64 computation."""
import math

import pytest
import torch

from routescope.core_models import Ablation, ConfigError, build_model, config_from_dict, from_name, param_count, tracing
from routescope.core_models.layers import PAGMLP, Block, BlockSpec, seeded_dropout
from routescope.core_models.run_state import RunState, running
from routescope.core_models.sites import name_sites

from tolerances import assert_close_to_scale

TINY = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, context=48)


def pagmlp_model(seed=0, **kw):
    torch.manual_seed(seed)
    return build_model(from_name("pagmlp", **{**TINY, **kw}))


def reference_pagmlp(ffn: PAGMLP, x: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """float64 recomputation from the weights: [silu(g1) * u1 * alpha | gelu_erf(g2) * u2 * beta] @ down^T."""
    x = x.double()
    g, u = x @ ffn.gate.weight.double().T, x @ ffn.up.weight.double().T
    h = ffn.half
    silu = g[..., :h] * torch.sigmoid(g[..., :h])
    gelu = 0.5 * g[..., h:] * (1 + torch.erf(g[..., h:] / math.sqrt(2)))
    return torch.cat((silu * u[..., :h] * alpha, gelu * u[..., h:] * beta), -1) @ ffn.down.weight.double().T


def test_pagmlp_and_its_swiglu_baseline_train_the_same_way():
    p, d = from_name("pagmlp").to_dict(), from_name("llama-dense").to_dict()
    assert p["ffn_dropout"] == d["ffn_dropout"] == 0.1  # PAGMLP §4: dropout 0.1 in both runs
    assert {k for k in p if p[k] != d[k]} == {"ffn"}  # nothing else differs
    for name in ("pagmlp", "llama-dense"):
        assert all(b.ffn_dropout == 0.1 for b in build_model(from_name(name, **TINY)).blocks)


def test_gates_start_at_one_half():  # "initialized at 0.5" read as alpha = beta = 0.5 (raw parameters 0)
    with torch.no_grad(), tracing(["blocks.0.ffn.alpha", "blocks.0.ffn.beta"]) as tr:
        pagmlp_model().eval()(torch.randint(0, 97, (1, 4)))
    assert float(tr["blocks.0.ffn.alpha"]) == float(tr["blocks.0.ffn.beta"]) == 0.5


def test_train_mode_output_varies_with_the_seed_and_repeats_with_it():
    model = pagmlp_model().train()
    idx = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        a, a2, b = (model(idx, seed=s).logits for s in (1, 1, 2))
    torch.testing.assert_close(a, a2, rtol=0, atol=0)  # exact: the same forward and mask twice
    assert (a - b).abs().max() > 1e-3


def test_eval_mode_is_deterministic_and_equals_the_dropout_free_model():
    model = pagmlp_model().eval()
    free = pagmlp_model(ffn_dropout=0.0)
    free.load_state_dict(model.state_dict())
    idx = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        outs = [model(idx, seed=s).logits for s in (1, 2)]
        free_eval, free_train = free.eval()(idx).logits, free.train()(idx, seed=3).logits
    # exact: with dropout inactive every call runs the same kernels on the same weights and input
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(outs[0], free_eval, rtol=0, atol=0)
    torch.testing.assert_close(free_train, free_eval, rtol=0, atol=0)  # no other train-time randomness


@pytest.mark.parametrize("ffn", ["pagmlp", "swiglu"])
def test_dropout_zeroes_a_fraction_p_of_the_ffn_output_and_rescales_the_rest(ffn):
    torch.manual_seed(0)
    block = Block(BlockSpec(dim=16, n_heads=2, n_kv_heads=2, ffn=ffn, ffn_hidden=32, ffn_dropout=0.1, context=64))
    name_sites(block)
    x = torch.randn(64, 50, 16)
    with torch.no_grad():
        h = x + block.attn(block.norm_1(x))  # the residual stream before the FFN
        clean = block.ffn(block.norm_2(h))
        assert torch.equal(block.eval()(x), h + clean)  # eval: no dropout
        with running(RunState(generator=torch.Generator().manual_seed(7), training=True)):
            noisy = block.train()(x) - h  # (64, 50, 16): the FFN output after dropout
    dropped = noisy == 0  # h + 0 - h is exactly 0
    kept = ~dropped
    # kept elements are clean / (1 - p), up to the rounding of adding and removing h
    torch.testing.assert_close(noisy[kept], clean[kept] / 0.9, rtol=1e-4, atol=4 * torch.finfo().eps * float(h.abs().max()))
    n = noisy.numel()
    assert abs(dropped.float().mean().item() - 0.1) < 5 * math.sqrt(0.1 * 0.9 / n)  # 5 binomial sigmas


def test_seeded_dropout_is_inverted_dropout():
    y = seeded_dropout(torch.ones(200_000), 0.25, torch.Generator().manual_seed(0))
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.75), rtol=1e-6, atol=0)
    assert abs((y == 0).float().mean().item() - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 200_000)


@pytest.mark.parametrize("gate", ["independent", "complementary"])
def test_gates_against_an_independent_computation(gate):
    torch.manual_seed(1)
    ffn = PAGMLP(16, 40, gate=gate).eval()
    name_sites(ffn)
    with torch.no_grad():
        ffn.a.fill_(0.4)
        if ffn.b is not None:
            ffn.b.fill_(-1.3)
    alpha = 1 / (1 + math.exp(-0.4))
    beta = 1 / (1 + math.exp(1.3)) if gate == "independent" else 1 - alpha
    x = torch.randn(3, 5, 16)
    with torch.no_grad(), tracing() as tr:
        y = ffn(x)
    # float32 vs float64: a few eps of the output's scale (measured 2.3); the sums cancel, so not of each element
    assert_close_to_scale(y, reference_pagmlp(ffn, x, alpha, beta), 16, msg=gate)
    assert float(tr["alpha"]) == pytest.approx(alpha, rel=1e-6)
    assert float(tr["beta"]) == pytest.approx(beta, rel=1e-6)
    assert sum(p.numel() for p in ffn.parameters()) == 3 * 16 * 40 + (2 if gate == "independent" else 1)


def test_complementary_model_counts_one_scalar_per_layer_and_drops_a_pathway():
    model = pagmlp_model(pagmlp_gate="complementary").eval()
    assert param_count(model.config) == sum(p.numel() for p in model.parameters())
    assert all(b.ffn.b is None for b in model.blocks)
    with torch.no_grad(), tracing() as tr:
        model(torch.randint(0, 97, (1, 6)), ablation=Ablation.parse(drop=["blocks.0.ffn:1"]))
    assert (tr["blocks.0.ffn.geglu_out"] == 0).all() and (tr["blocks.1.ffn.geglu_out"] != 0).any()
    assert float(tr["blocks.0.ffn.alpha"]) + float(tr["blocks.0.ffn.beta"]) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("field,value", [("pagmlp_gate", "both"), ("pagmlp_dropout", 1.0), ("pagmlp_dropout", -0.1),
                                         ("ffn_dropout", 1.0), ("ffn_dropout", -0.1)])
def test_bad_pagmlp_fields_are_named(field, value):
    with pytest.raises(ConfigError, match=field):
        from_name("pagmlp", **{field: value})


def test_both_dropout_names_at_once_are_refused():
    with pytest.raises(ConfigError, match="pagmlp_dropout.*set ffn_dropout only"):
        from_name("pagmlp", pagmlp_dropout=0.1)  # the preset sets ffn_dropout


def test_configs_written_before_the_fields_load_as_trained():
    new = from_name("pagmlp", **TINY).to_dict()
    old = {k: v for k, v in new.items() if k not in ("pagmlp_gate", "pagmlp_dropout", "ffn_dropout")}
    c = config_from_dict(old)  # the first PAGMLP checkpoints: neither field, trained without dropout
    assert (c.pagmlp_gate, c.dropout) == ("independent", 0.0)
    c = config_from_dict({**old, "pagmlp_dropout": 0.1})  # later ones: the PAGMLP-only name
    assert c.dropout == 0.1 and all(b.ffn_dropout == 0.1 for b in build_model(c).blocks)
