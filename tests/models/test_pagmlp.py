"""PAGMLP: the paper's dropout 0.1 while training (seeded by the call, inactive in eval) and the
independent / complementary gate options, each against an independent float64 computation."""
import json
import math
from pathlib import Path

import pytest
import torch

from routescope.core_models import Ablation, ConfigError, build_model, config_from_dict, from_name, param_count, tracing
from routescope.core_models.layers import PAGMLP, seeded_dropout
from routescope.core_models.runtime import RunState, running
from routescope.core_models.sites import name_sites

from tolerances import assert_close_to_scale

TINY = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, context=48)
CKPT = Path(__file__).resolve().parents[2] / "checkpoints" / "pagmlp"


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


def test_the_preset_trains_with_the_papers_dropout():
    assert from_name("pagmlp").pagmlp_dropout == 0.1


def test_train_mode_output_varies_with_the_seed_and_repeats_with_it():
    model = pagmlp_model().train()
    idx = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        a, a2, b = (model(idx, seed=s).logits for s in (1, 1, 2))
    torch.testing.assert_close(a, a2, rtol=0, atol=0)  # exact: the same forward and mask twice
    assert (a - b).abs().max() > 1e-3


def test_eval_mode_is_deterministic_and_equals_the_dropout_free_model():
    model = pagmlp_model().eval()
    free = pagmlp_model(pagmlp_dropout=0.0)
    free.load_state_dict(model.state_dict())
    idx = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        outs = [model(idx, seed=s).logits for s in (1, 2)]
        free_eval, free_train = free.eval()(idx).logits, free.train()(idx, seed=3).logits
    # exact: with dropout inactive every call runs the same kernels on the same weights and input
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(outs[0], free_eval, rtol=0, atol=0)
    torch.testing.assert_close(free_train, free_eval, rtol=0, atol=0)  # no other train-time randomness


def test_dropout_zeroes_a_fraction_p_of_the_output_and_rescales_the_rest():
    torch.manual_seed(0)
    ffn = PAGMLP(16, 32, dropout=0.1)
    x = torch.randn(64, 50, 16)
    with torch.no_grad():
        clean = ffn.eval()(x)
        with running(RunState(generator=torch.Generator().manual_seed(7), training=True)):
            noisy = ffn.train()(x)
    ratio = noisy / clean  # (64, 50, 16): 0 where dropped, 1 / (1 - p) where kept
    dropped = ratio == 0
    torch.testing.assert_close(ratio[~dropped], torch.full_like(ratio[~dropped], 1 / 0.9), rtol=1e-5, atol=0)
    n = ratio.numel()
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


@pytest.mark.parametrize("field,value", [("pagmlp_gate", "both"), ("pagmlp_dropout", 1.0), ("pagmlp_dropout", -0.1)])
def test_bad_pagmlp_fields_are_named(field, value):
    with pytest.raises(ConfigError, match=field):
        from_name("pagmlp", **{field: value})


@pytest.mark.skipif(not (CKPT / "config.json").is_file(), reason="shipped pagmlp checkpoint missing")
def test_config_without_the_new_fields_loads_as_trained():
    saved = json.loads((CKPT / "config.json").read_text())
    assert "pagmlp_gate" not in saved and "pagmlp_dropout" not in saved
    c = config_from_dict(saved)
    assert (c.pagmlp_gate, c.pagmlp_dropout) == ("independent", 0.0)
