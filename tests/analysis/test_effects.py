"""Ablation effects on next-token distributions and generation diffs."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from routescope.analysis.export import columns as C
from routescope.analysis.runs.effects import ablation_effects, first_divergence, generation_diff
from routescope.core_models import Ablation
from routescope.core_models.generate import generate
from tiny_models import tiny_model
from tolerances import EPS32, assert_close_to_scale


def test_ablation_effects_by_hand():
    model = tiny_model("share_linear")
    x = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(2))
    ab = Ablation(drop=(("parallel.0", 0), ("parallel.1", 2)))
    df = ablation_effects(model, x, ab)
    assert len(df) == 12
    with torch.no_grad():
        p = torch.softmax(model(x).logits, -1)
        q = torch.softmax(model(x, ablation=ab).logits, -1)
    for (b, t), row in df.set_index([C.BATCH, C.POSITION]).iterrows():
        kl = float(sum(p[b, t, v] * (torch.log(p[b, t, v]) - torch.log(q[b, t, v])) for v in range(97)))
        # KL sums p (log p - log q): its rounding is eps of sum p (|log p| + |log q|), not of the KL itself
        size = float((p[b, t] * (p[b, t].log().abs() + q[b, t].log().abs())).sum())
        assert_close_to_scale(row[C.KL], kl, 16, scale=size, msg=f"KL at {b}, {t}")
        assert row[C.KL] >= -16 * EPS32 * size  # non-negative up to that rounding
        top = int(p[b, t].argmax())
        assert row[C.BASE_TOP] == top and row[C.ABLATED_TOP] == int(q[b, t].argmax())
        assert row[C.FLIPPED] == (top != int(q[b, t].argmax()))
        assert row[C.BASE_PROB] == pytest.approx(float(p[b, t, top]), rel=1e-5)
        assert row[C.ABLATED_PROB] == pytest.approx(float(q[b, t, top]), rel=1e-5)
        assert row[C.TOKEN_ID] == int(x[b, t])
    assert df[C.KL].max() > 0
    # identical distributions: KL 0 up to the rounding above, whose size 2 H(p) is at most 2 log(vocab)
    same = ablation_effects(model, x[0].tolist(), Ablation())[C.KL]
    assert same.abs().max() <= 16 * EPS32 * 2 * math.log(97)


def test_generation_diff_alignment():
    df = generation_diff([1, 2, 3, 4, 5], [1, 2, 9, 4, 5, 6])
    assert df[C.OP].tolist() == ["equal", "equal", "replace", "equal", "equal", "insert"]
    assert df[C.CHANGED].tolist() == [False, False, True, False, False, True]
    assert df[C.BASE_INDEX].tolist()[-1] is pd.NA and df[C.ABLATED_TOKEN_ID].tolist()[-1] == 6
    assert first_divergence(df) == 2
    d = generation_diff([7, 8, 9], [7, 9])
    assert d[C.OP].tolist() == ["equal", "delete", "equal"] and first_divergence(d) == 1
    assert first_divergence(generation_diff([1, 2], [1, 2])) is None
    assert first_divergence(generation_diff([1, 2], [1, 2, 3])) == 2


def test_generation_diff_of_real_generations():
    model = tiny_model("pgpt3")
    base = generate(model, [3, 4, 5], max_new_tokens=8)
    abl = generate(model, [3, 4, 5], max_new_tokens=8, ablation=Ablation(drop=(("paths", 0),)))

    class Tok:
        def decode(self, ids):
            return "|".join(map(str, ids))

    df = generation_diff(base, abl, tokenizer=Tok())
    kept = df[df[C.BASE_INDEX].notna()]
    assert kept[C.BASE_TOKEN_ID].tolist() == base.new_ids
    assert kept[C.BASE_TOKEN].tolist() == [str(i) for i in base.new_ids]
    assert kept[C.BASE_PROB].tolist() == [s.prob for s in base.steps]
    same = df[~df[C.CHANGED]]
    assert (same[C.BASE_TOKEN_ID] == same[C.ABLATED_TOKEN_ID]).all()


class FixedLogits(torch.nn.Module):
    """A stand-in model whose logits are given: `base` unablated, `ablated` under any ablation."""

    def __init__(self, base: torch.Tensor, ablated: torch.Tensor) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # model_device reads a parameter
        self.base, self.ablated = base, ablated

    def forward(self, ids, ablation=None, **_):
        from types import SimpleNamespace

        return SimpleNamespace(logits=(self.base if ablation is None or ablation.is_empty else self.ablated).clone())


def test_a_flip_is_a_real_change_of_the_top_token_not_a_tie():
    """Positions: 0 a decisive swap (a flip); 1 the two top logits tied in the base model and one ulp
    apart after the ablation (argmax ids differ: rounding, no flip); 2 decisive in the base model, a
    rounding-level tie the other way after it (no flip); 3 nothing changes."""
    V = 6
    base = torch.zeros(1, 4, V)
    abl = torch.zeros(1, 4, V)
    base[0, 0, 1], abl[0, 0, 2] = 3.0, 3.0
    base[0, 1, [1, 2]] = 2.0
    abl[0, 1, 1], abl[0, 1, 2] = 2.0, torch.nextafter(torch.tensor(2.0), torch.tensor(3.0))
    base[0, 2, 1] = 2.0
    abl[0, 2, 1], abl[0, 2, 2] = 2.0, torch.nextafter(torch.tensor(2.0), torch.tensor(3.0))
    base[0, 3, 4] = abl[0, 3, 4] = 1.0
    df = ablation_effects(FixedLogits(base, abl), torch.zeros(4, dtype=torch.long), Ablation(drop=(("x", 0),)))
    assert (df[C.BASE_TOP] != df[C.ABLATED_TOP]).tolist() == [True, True, True, False]  # argmax ids
    assert df[C.FLIPPED].tolist() == [True, False, False, False]


def test_kl_is_never_negative_and_the_clamp_is_counted():
    """Near-identical distributions (rounding-level differences) over many rows: every KL >= 0, each
    equal to a float64 sum done by hand (clamped at 0), and the clamped rows counted in attrs."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 400, 50, generator=g) * 4
    abl = base + torch.randn(base.shape, generator=g) * 1e-7  # under an ulp of most logits: true KL ~1e-14
    df = ablation_effects(FixedLogits(base, abl), torch.zeros(400, dtype=torch.long), Ablation(drop=(("x", 0),)))
    p, q = torch.log_softmax(base.double(), -1)[0], torch.log_softmax(abl.double(), -1)[0]
    raw = [float(sum(p[t, v].exp() * (p[t, v] - q[t, v]) for v in range(50))) for t in range(400)]
    assert (df[C.KL] >= 0).all()
    scale = (p.exp() * (p.abs() + q.abs())).sum(-1)  # the size of the sum's rounding, in float64 eps
    eps64 = torch.finfo(torch.float64).eps
    for t in range(400):
        assert abs(df[C.KL].iloc[t] - max(0.0, raw[t])) <= 64 * eps64 * float(scale[t])
    # some sums came out below zero here (rounding): clamped, counted, and the lowest is rounding-sized
    assert df.attrs["kl_clamped"] > 0 and df.attrs["kl_lowest"] < 0
    assert -df.attrs["kl_lowest"] <= 64 * eps64 * float(scale.max())
    assert (df[C.KL] == 0).sum() >= df.attrs["kl_clamped"]
