"""Behaviour every family shares: shapes, parameter formulas, causality, KV cache, trace sites."""
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from routescope.core_models import ConfigError, InputError, build_model, config_from_dict, param_count, tracing
from routescope.core_models.layers import gelu, gelu_exact, rms_norm

from tiny_models import TINY, tiny_model
from tolerances import FORWARD_EPS, assert_close_to_scale


def test_output_shape_and_param_formula(family_model):
    _, model = family_model
    out = model(torch.randint(0, 97, (2, 11)))
    assert out.logits.shape == (2, 11, 97)
    assert param_count(model.config) == sum(p.numel() for p in model.parameters())


def test_causality(family_model):
    _, model = family_model
    a = torch.randint(0, 97, (1, 20))
    b = a.clone()
    b[0, 12:] = torch.randint(0, 97, (8,))
    la, lb = model(a).logits, model(b).logits
    assert_close_to_scale(la[:, :12], lb[:, :12], FORWARD_EPS, msg="the past changed with the future")
    assert not torch.allclose(la[:, 12:], lb[:, 12:])


def test_cached_decoding_matches_full_recompute(family_model):
    _, model = family_model
    seq = torch.randint(0, 97, (1, 40))
    full = model(seq).logits
    cache = model.new_cache()
    parts = [model(seq[:, :8], cache=cache).logits]
    for t in range(8, 40):  # 32 single-token steps
        parts.append(model(seq[:, t:t + 1], cache=cache).logits)
    assert_close_to_scale(torch.cat(parts, 1), full, FORWARD_EPS, msg="cached steps vs full recompute")


def _dims(shape_doc: str) -> list[str]:
    inside = re.match(r"\[(.*?)\]", shape_doc).group(1).strip()
    return [d.strip() for d in inside.split(",")] if inside else []


def test_trace_records_every_site_with_documented_shape(family_model):
    _, model = family_model
    B, T = 2, 9
    with tracing() as tr:
        model(torch.randint(0, 97, (B, T)))
    # MoEP parallel blocks that no token selected are skipped, so their output site may not fire;
    # Wiola's token-merging sites fire only with ATM on (off by default at inference); Gumbel pi and
    # the aux terms only while training (tests/models/test_papaformer.py checks their shapes)
    conditional = {n for n in model.site_names()
                   if re.fullmatch(r"parallel\.\d+\.blocks\.\d+\.out|blocks\.\d+\.atm\..+"
                                   r"|parallel\.\d+\.router\.(pi|aux\..+)", n)}
    assert set(model.site_names()) - conditional <= set(tr.names()) <= set(model.site_names())
    for name, doc in model.site_shapes().items():
        if name not in tr:
            continue
        dims, t = _dims(doc), tr[name]
        assert t.dim() == len(dims), (name, doc, tuple(t.shape))
        for size, dim in zip(t.shape, dims):
            if dim == "batch":
                assert size == B, name
            if dim == "pos":
                assert size == T, name


def test_trace_records_only_requested_sites_and_nothing_when_idle(family_model):
    _, model = family_model
    idx = torch.randint(0, 97, (1, 6))
    names = model.site_names()[:1]
    with tracing(names) as tr:
        model(idx)
    assert tr.names() == names
    plain = model(idx).logits  # outside any trace: still the same function
    with tracing():
        traced = model(idx).logits
    # exact: a site only copies its input aside, so both calls run the same kernels on the same tensors
    torch.testing.assert_close(plain, traced, atol=0, rtol=0)


def test_config_json_round_trip(family_model):
    _, model = family_model
    d = json.loads(json.dumps(model.config.to_dict()))
    assert config_from_dict(d) == model.config


@pytest.mark.parametrize("key,field,value", [
    ("llama", "n_heads", 3), ("llama", "ffn", "relu"), ("share_linear", "n_paths", 1),
    ("share_linear", "combiner", "mystery"), ("pgpt", "n_layers", 3), ("pgpt_sigmoid", "n_paths", 3),
    ("llama", "d_model", "wide"),
])
def test_bad_config_field_is_named(key, field, value):
    d = tiny_model(key).config.to_dict()
    d[field] = value
    with pytest.raises(ConfigError, match=field):
        config_from_dict(d)


def test_unknown_and_missing_config_fields_are_named():
    d = tiny_model("llama").config.to_dict()
    with pytest.raises(ConfigError, match="wingspan"):
        config_from_dict({**d, "wingspan": 3})
    with pytest.raises(ConfigError, match="family"):
        config_from_dict({k: v for k, v in d.items() if k != "family"})
    with pytest.raises(ConfigError, match="unknown"):
        config_from_dict({**d, "family": "transformer-xxl"})


def test_bad_input_is_named():
    model = tiny_model("pgpt")
    with pytest.raises(InputError, match="empty"):
        model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(InputError, match="97"):
        model(torch.tensor([[3, 97]]))
    with pytest.raises(InputError, match="-1"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(InputError, match="context"):
        model(torch.zeros(1, 49, dtype=torch.long))


def test_pagmlp_starts_balanced_and_costs_what_swiglu_costs():
    p = build_model(TINY_cfg("pagmlp"))
    s = build_model(TINY_cfg("llama"))
    assert sum(x.numel() for x in p.parameters()) == sum(x.numel() for x in s.parameters()) + 2 * 2
    with tracing() as tr:
        p(torch.randint(0, 97, (1, 4)))
    assert float(tr["blocks.0.ffn.alpha"]) == pytest.approx(0.5)
    assert float(tr["blocks.0.ffn.beta"]) == pytest.approx(0.5)


def TINY_cfg(key):
    from routescope.core_models import from_name
    preset, over = TINY[key]
    return from_name(preset, **over)


def test_rms_norm_is_bit_identical_to_torch():
    torch.manual_seed(0)
    x, w = torch.randn(3, 7, 128) * 4, torch.randn(128)
    # exact on any CPU: torch.rms_norm on CPU is the composite pow, mean, add, rsqrt, mul, mul, the same
    # ops in the same order as rms_norm, so both run the same kernels on the same values
    assert torch.equal(rms_norm(x, w, 1e-6), F.rms_norm(x, (128,), w, 1e-6))
    xh = x.to(torch.bfloat16)  # low precision in, float32 arithmetic, low precision out
    got = rms_norm(xh, w, 1e-6)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, F.rms_norm(xh.float(), (128,), w, 1e-6).to(torch.bfloat16))


def test_gelu_exact_matches_the_erf_definition():
    x = torch.cat((torch.linspace(-12, 12, 20001), torch.randn(5000) * 3))
    want = x.double() * 0.5 * (1 + torch.special.erf(x.double() / math.sqrt(2)))
    # x/2 * (1 + erf(x/sqrt 2)) in float32: erf is good to a few ulps of 1, and for x < 0 the sum
    # 1 + erf cancels, so the error is a few eps of |x| (not of the tiny result). Measured: 2.4 eps of
    # |x| (oneDNN's kernel near x = 3.5, i.e. 1.0e-6); the tanh approximation is 1500 eps away.
    def assert_erf_gelu(got, units, msg):
        assert_close_to_scale(got, want[:len(got)], units, scale=x[:len(got)].double().abs(), msg=msg)

    for n in (len(x), 300):  # both paths: F.gelu and the small-input formula
        got = gelu_exact(x[:n])
        assert_erf_gelu(got, 16, f"gelu_exact on {n} values")
        assert_close_to_scale(got, F.gelu(x[:n]), 32, scale=x[:n].abs(), msg="formula vs F.gelu")  # 16 + 16
    with pytest.raises(AssertionError):  # the bound tells the approximation from the definition
        assert_erf_gelu(F.gelu(x, approximate="tanh"), 16, "tanh")
    # exact: gelu(x, "tanh") calls F.gelu(x, approximate="tanh") itself
    assert torch.equal(gelu(x, "tanh"), F.gelu(x, approximate="tanh"))
