"""Captum attributions: IG completeness, no hooks on the shared model, exact ablation, Shapley efficiency."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

import routescope.analysis.runs.attribution as A
from routescope.analysis.export import columns as C
from routescope.analysis.runs.attribution import PathAttribution, TokenAttribution
from routescope.core_models import Ablation
from tiny_models import tiny_model
from tolerances import FORWARD_EPS, assert_close_to_scale

IDS = [5, 17, 3, 88, 41, 9, 23]


def no_hooks(model: torch.nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
               for m in model.modules())


def log_prob(model, ids, p, token, ablation=None) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids[: p + 1]]), ablation=ablation).logits
    return float(torch.log_softmax(logits[0, p], -1)[token])


@pytest.mark.parametrize("key,baseline,scale", [("llama", "pad", 10), ("share_linear", "pad", 10),
                                                ("pgpt", "pad", 30), ("wiola", "zeros", 10)])
def test_integrated_gradients_completeness(key, baseline, scale):
    """Sum of attributions = f(input) - f(baseline) up to the captum-reported delta (< 0.05).
    Embeddings are scaled up so the tiny random model's log-prob really depends on the input."""
    model = tiny_model(key)
    with torch.no_grad():
        model.get_submodule(model.token_embedding()).weight.mul_(scale)
    res = TokenAttribution(model).attribute(IDS, target_position=5, target_token=11, n_steps=48, baseline=baseline)
    assert res.attributions.shape == (6,)  # positions 0..5: later tokens cannot matter
    # captum's batched forward vs one forward: rounding of the log-prob's own size
    assert_close_to_scale(res.target_log_prob, log_prob(model, IDS, 5, 11), FORWARD_EPS, msg="target log-prob")
    gap = res.target_log_prob - res.baseline_log_prob
    assert abs(gap) > 0.3  # the check below is not vacuous
    assert abs(res.convergence_delta) < 0.05
    assert float(res.attributions.sum()) == pytest.approx(gap, abs=0.05)
    assert no_hooks(model)
    assert all(p.grad is None for p in model.parameters())  # nothing accumulated on shared weights
    df = res.frame()
    assert list(df.columns) == [C.POSITION, C.TOKEN_ID, C.ATTRIBUTION] and df[C.TOKEN_ID].tolist() == IDS[:6]


def test_shared_model_is_untouched_while_captum_runs(monkeypatch):
    """Inside captum's forward (its hooks active), the shared model has no hooks and another caller
    of the shared model gets exactly the unhooked logits."""
    model = tiny_model("gumbel_v2")
    x = torch.tensor([IDS])
    with torch.no_grad():
        reference = model(x).logits
    seen = []
    real = A._log_prob

    def spying(logits, p, token):
        seen.append(no_hooks(model))
        with torch.no_grad():
            seen.append(torch.equal(model(x).logits, reference))
        return real(logits, p, token)

    monkeypatch.setattr(A, "_log_prob", spying)
    TokenAttribution(model).attribute(IDS, n_steps=4)
    assert seen and all(seen)
    assert no_hooks(model)


def test_embedding_is_found_for_every_kind_of_model():
    assert tiny_model("llama").token_embedding() == "embed"
    assert tiny_model("moep").token_embedding() == "embed.wte"
    assert tiny_model("pgpt").token_embedding() == "embed.wte"
    assert tiny_model("wiola").token_embedding() == "embed"


def test_exact_ablation_equals_the_direct_log_prob_difference():
    model = tiny_model("gumbel_v1")
    df = PathAttribution(model).attribute(IDS, target_position=4, target_token=30, method="ablation")
    c = model.config
    assert len(df) == c.n_parallel_layers * (c.n_paths + 1)
    full = log_prob(model, IDS, 4, 30)
    for layer, option, contrib in zip(df[C.LAYER], df[C.OPTION], df[C.CONTRIBUTION]):
        without = log_prob(model, IDS, 4, 30, Ablation(drop=((layer, option),)))
        # a difference of two log-probs: its rounding is eps of their size, not of the (small) difference
        assert_close_to_scale(contrib, full - without, FORWARD_EPS, scale=max(abs(full), abs(without)), msg=layer)
    assert df[C.FULL_LOG_PROB].eq(full).all()


def test_global_scope_drops_an_option_in_every_layer():
    model = tiny_model("pgpt3")
    pa = PathAttribution(model)
    df = pa.attribute(IDS, method="ablation", scope="global")
    assert df[C.LAYER].eq("*").all() and df[C.OPTION].tolist() == [0, 1, 2]
    token = int(df[C.TOKEN_ID][0])
    full = log_prob(model, IDS, 6, token)
    without = log_prob(model, IDS, 6, token, Ablation(drop=(("paths", 1),)))
    assert_close_to_scale(df[C.CONTRIBUTION][1], full - without, FORWARD_EPS, scale=max(abs(full), abs(without)))


@pytest.mark.parametrize("key", ["share_linear", "moep"])
def test_shapley_efficiency(key):
    """Shapley values over option masks sum to f(all) - f(baseline), the baseline being every
    routing layer reduced to its fallback option (0)."""
    model = tiny_model(key)
    pa = PathAttribution(model)
    df = pa.attribute(IDS, target_position=6, method="shapley", n_samples=6, seed=1)
    token = int(df[C.TOKEN_ID][0])
    layers = model.routing_layers()
    baseline = Ablation(drop=tuple((l, o) for l, n in layers.items() for o in range(1, n)), below_top_k=True)
    f_all, f_base = log_prob(model, IDS, 6, token), log_prob(model, IDS, 6, token, baseline)
    assert_close_to_scale(df[C.REFERENCE_LOG_PROB].iloc[0], f_base, FORWARD_EPS, msg="baseline log-prob")
    # efficiency: the contributions telescope to f_all - f_base; rounding is eps of the log-probs' size
    assert_close_to_scale(df[C.CONTRIBUTION].sum(), f_all - f_base, FORWARD_EPS,
                          scale=max(abs(f_all), abs(f_base)), msg="sum of Shapley values")
    again = pa.attribute(IDS, target_position=6, method="shapley", n_samples=6, seed=1)
    assert again[C.CONTRIBUTION].tolist() == df[C.CONTRIBUTION].tolist()  # seeded


def test_masks_never_empty_a_layer():
    pa = PathAttribution(tiny_model("gumbel_v2"))
    feats = pa.features()
    ab = pa.ablation_for([False] * len(feats), feats)
    ab.validate(pa.model.routing_layers())  # raises if a layer lost every option
    assert all(0 not in [o for l, o in ab.drop if l == layer] for layer in pa.layers)


def test_attribution_errors():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="no routing layers"):
        PathAttribution(model)
    with pytest.raises(ValueError, match="outside the input"):
        TokenAttribution(model).attribute(IDS, target_position=40)
    with pytest.raises(ValueError, match="baseline"):
        TokenAttribution(model).attribute(IDS, baseline="mean")
    with pytest.raises(ValueError, match="method"):
        PathAttribution(tiny_model("pgpt")).attribute(IDS, method="lime")


def test_exact_ablation_reports_progress_and_stops_on_request():
    from routescope.analysis.runs.attribution import Stopped

    model = tiny_model("moep")
    seen = []
    df = PathAttribution(model).attribute(IDS, target_position=4, method="ablation",
                                          progress=lambda done, total: seen.append((done, total)))
    n = sum(model.routing_layers().values())
    assert seen == [(i, n) for i in range(1, n + 1)]
    pd.testing.assert_frame_equal(df, PathAttribution(model).attribute(IDS, target_position=4, method="ablation"))
    calls = []
    with pytest.raises(Stopped, match=f"stopped after 3 of {n} ablations"):
        PathAttribution(model).attribute(IDS, target_position=4, method="ablation",
                                         stop=lambda: calls.append(1) or len(calls) > 3)
