"""Dropping more options than a top-k router can do without is refused in one line (issue 41, item 7):
with fewer unforced options left than its top-k, transformers' router picks a dropped expert at
weight 0 (and the export called it selected) and MoEP's router silently picked fewer. Checked on
a tiny saved transformers Mixtral (4 experts, top-2) and the shipped MoEP (top-2 of 4)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_models import saved_models
from routescope.core_models.ablation import Ablation, applicable
from routescope.core_models.checkpoint import load_checkpoint
from routescope.core_models.sites import INDICES, WEIGHTS
from routescope.core_models.specs import AblationError
from routescope.core_models.trace import tracing

ROOT = Path(__file__).resolve().parents[2]
MOEP = ROOT / "checkpoints" / "moep"
IDS = [[11, 57, 3, 99, 140, 7, 250, 31, 64, 8, 200, 12]]


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory, tokenizer):
    hf, path = saved_models(tmp_path_factory, tokenizer)("mixtral")
    model, _ = load_checkpoint(path)
    return hf, model


def refused(model, ablation: Ablation) -> str:
    with pytest.raises(AblationError) as e, torch.no_grad():
        model(torch.tensor(IDS), ablation=ablation)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


def picks(model, ablation: Ablation) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each routing layer's selected options and their weights, (tokens, k)."""
    with torch.no_grad(), tracing() as tr:
        model(torch.tensor(IDS), ablation=ablation)
    indices, weights = model.sites_of(INDICES), model.sites_of(WEIGHTS)  # the family's own site names
    return {layer: (tr[indices[layer]].reshape(-1, k), tr[weights[layer]].reshape(-1, k))
            for layer, (k, _) in model.routing_top_k().items()}


def test_mixtral_top_k_is_its_config(mixtral):
    hf, model = mixtral
    k, n = hf.config.num_experts_per_tok, hf.config.num_local_experts
    assert model.routing_top_k() == {layer: (k, n) for layer in model.routing_layers()}


def test_mixtral_dropping_three_of_four_experts_with_top_2_is_refused(mixtral):
    _, model = mixtral
    layer = list(model.routing_layers())[0]
    msg = refused(model, Ablation(drop=(("*", 1), ("*", 2), ("*", 3))))
    assert msg.startswith("invalid ablation: fewer options left than the router picks per token (top-2)")
    assert f"layer {layer!r} keeps 1 of 4" in msg
    refused(model, Ablation(drop=((layer, 0), (layer, 2), (layer, 3))))  # one layer is enough


def test_mixtral_dropping_down_to_top_k_or_forcing_still_runs_on_live_experts(mixtral):
    _, model = mixtral
    dropped = {1, 3}
    for layer, (idx, w) in picks(model, Ablation(drop=tuple(("*", o) for o in dropped))).items():
        assert not any(o in dropped for o in idx.flatten().tolist()), layer  # only the two live experts
        assert (w > 0).all(), layer
    forced = Ablation(drop=(("*", 1), ("*", 2), ("*", 3)), force=(("*", 0),))  # a forced route picks one
    for layer, (idx, w) in picks(model, forced).items():
        assert ((idx == 0) == (w > 0)).all() and (idx == 0).any(-1).all(), layer


def test_moep_top_k_is_its_config_and_three_of_four_dropped_is_refused():
    cfg = json.loads((MOEP / "config.json").read_text())
    model, _ = load_checkpoint(MOEP)
    want = {}
    for layer, m in model.routing_modules.items():  # parallel layers pick blocks, MoE layers experts
        want[layer] = ((cfg["expert_top_k"], cfg["n_experts"]) if m.option_noun == "expert"
                       else (cfg["top_k"], cfg["n_blocks"]))
    assert model.routing_top_k() == want and want
    layer = next(iter(want))
    k, n = want[layer]
    three = Ablation(drop=tuple((layer, o) for o in range(n - k + 1)))
    msg = refused(model, three)
    assert f"(top-{k}); drop at most {n - k}" in msg and f"layer {layer!r} keeps {k - 1} of {n}" in msg
    ok = Ablation(drop=tuple((layer, o) for o in range(n - k)))
    idx, w = picks(model, ok)[layer]
    assert set(idx.flatten().tolist()) <= set(range(n - k, n)) and (w > 0).all()
    # the app's spec box: the spec that leaves too few is left out, in one line, and the others apply
    ab, left_out = applicable([f"{layer}:0", f"{layer}:1-2"], layers=model.routing_layers(),
                              top_k=model.routing_top_k())
    assert ab == Ablation(drop=((layer, 0),)) and len(left_out) == 1
    assert left_out[0][0] == f"{layer}:1-2"
    assert left_out[0][1].startswith(f"fewer options left than the router picks per token (top-{k})")
