"""The exact sweep's ablated layer answered from the captured experts outputs (`resume`'s
`expert_outputs`, `measure_batch`'s `reuse`): `recombine` against a plain loop over a toy experts
module, a resumed forward against the whole ablated forward on olmoe-tiny, and a model whose experts
call is not a weighted sum refused by the sweep's check and by the estimate's."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from routescope.analysis.inputs import datasets as D
from routescope.analysis.reports.importance import ImportanceSettings, importance, reuse_reproduces
from routescope.analysis.reports.importance.estimate import estimate
from routescope.analysis.reports.importance.plan import scope_of, tokens_of
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint
from routescope.core_models.hf import HFModel
from routescope.core_models.hf import resume as R
from routescope.core_models.hf.resume import recombine, slot_outputs
from tolerances import EPS32, FORWARD_EPS, assert_close_to_scale

pytest.importorskip("transformers")

OLMOE = Path(__file__).resolve().parents[2] / "checkpoints" / "olmoe-tiny"
TEXTS = ["Once upon a time, there was a little girl named Lily. She loved her toys.",
         "Solve this problem: 3x + 5 = 20. Express your answer as a fraction.",
         "One day a little boy went to the park with his dog and a ball.",
         "Find the largest prime below fifty, then evaluate the sum."]


class ToyExperts:
    """experts(h, idx, w) = sum_s w_s tanh(h @ A_{idx_s}), by a plain loop; records each call's tokens."""

    def __init__(self, n: int, d: int) -> None:
        self.A = torch.randn(n, d, d, dtype=torch.float64)
        self.calls: list[int] = []

    def __call__(self, h, idx, w):
        self.calls.append(h.shape[0])
        out = torch.zeros_like(h)
        for t in range(h.shape[0]):
            for s in range(idx.shape[1]):
                out[t] += w[t, s] * torch.tanh(h[t] @ self.A[idx[t, s]])
        return out


@pytest.mark.parametrize("chunk", [None, 2 * 5 * 3])  # whole, or 3 tokens at a time
def test_recombine_equals_the_experts_call_and_runs_only_the_pairs_the_captured_routes_lack(chunk, monkeypatch):
    if chunk is not None:
        monkeypatch.setattr(R, "SLOT_CHUNK", chunk)
    torch.manual_seed(0)
    n, d, k, N, m = 6, 5, 2, 7, 3
    ex = ToyExperts(n, d)
    h = torch.randn(N, d, dtype=torch.float64)
    idx0 = torch.stack([torch.randperm(n)[:k] for _ in range(N)])
    out0 = slot_outputs(ex, h, idx0, torch.float64)
    for t in range(N):  # each slot's own output
        for s in range(k):
            assert torch.allclose(out0[t, s], torch.tanh(h[t] @ ex.A[idx0[t, s]]))
    idx = torch.stack([torch.randperm(n)[:k] for _ in range(m * N)])  # other routes for m copies of the batch
    w = torch.rand(m * N, k, dtype=torch.float64)
    ex.calls.clear()
    got = recombine(ex, idx0, out0, h.repeat(m, 1), idx, w)
    want = ex(h.repeat(m, 1), idx, w)
    assert torch.allclose(got, want, rtol=1e-12, atol=0)
    lacking = sum(int(j) not in set(idx0[t % N].tolist()) for t in range(m * N) for j in idx[t])
    assert sum(ex.calls[:-1]) == lacking and 0 < lacking < m * N * k  # the last call: `want`'s


def test_a_resumed_forward_with_the_captured_expert_outputs_equals_the_whole_ablated_forward():
    model, _ = load_checkpoint(OLMOE, dtype="float32")
    torch.manual_seed(1)
    x = torch.randint(0, model.vocab_size, (2, 24))
    with torch.inference_mode():
        prefix = model.capture(x)
        for layer in model.routing_layers():
            assert model.can_recombine(layer)
            abs_ = [Ablation(drop=((layer, 3),)), Ablation(drop=((layer, 5), (layer, 9)))]
            slots = model.expert_outputs(prefix, layer)
            got = model.resume(prefix, layer, [a for a in abs_ for _ in range(2)], expert_outputs=slots)
            for i, a in enumerate(abs_):
                assert_close_to_scale(got[2 * i:2 * i + 2], model(x, ablation=a).logits, FORWARD_EPS, msg=layer)


def _bent(model: HFModel) -> HFModel:
    """The same weights with every experts module's output bent (out * (1 + tanh(out))): no longer
    the weighted sum of its experts' outputs."""
    hf = model.detach()
    for l in model.routing_modules.values():
        ex = hf.get_submodule(l.block.experts)

        class Bent(type(ex)):
            def forward(self, hidden_states, top_k_index, top_k_weights):
                out = super().forward(hidden_states, top_k_index, top_k_weights)
                return out * (1 + torch.tanh(out))
        ex.__class__ = Bent
    return HFModel(model.config, hf).eval()


def test_an_experts_call_that_is_not_a_weighted_sum_is_refused_by_both_checks():
    model, tok = load_checkpoint(OLMOE, dtype="float32")
    x = torch.tensor([tok.encode(TEXTS[0]).ids])
    assert reuse_reproduces(model, x)
    bent = _bent(load_checkpoint(OLMOE, dtype="float32")[0])
    assert not reuse_reproduces(bent, x)
    data = D.rows_corpus("t", [D.CorpusRow(str(i), t, ()) for i, t in enumerate(TEXTS)], [])
    s = dict(max_tokens=80, batch_size=4, control_draws=0, prune_max=0, layers=(list(bent.routing_layers())[1],),
             options=(0, 1, 2))
    fast = importance(bent, tok, data, ImportanceSettings(method="exact", **s))
    naive = importance(bent, tok, data, ImportanceSettings(method="exact", sweep="naive", **s))
    assert fast.provenance["experts_outputs_reused"] is False
    assert any("runs all its experts again" in n for n in fast.notes)
    scale = naive.provenance["base_loss"] * 4
    d = np.abs(fast["importance"]["delta_nll"].to_numpy() - naive["importance"]["delta_nll"].to_numpy())
    assert d.max() <= FORWARD_EPS * EPS32 * scale
    ok = importance(model, tok, data, ImportanceSettings(method="exact", **s))
    assert ok.provenance["experts_outputs_reused"] is True
    toks = tokens_of(data, tok, model.context, 80)
    est = estimate(bent, toks, scope_of(bent, list(s["layers"]), None), 4)
    assert "not the experts call's weighted sum" in est.reasons[s["layers"][0]]
