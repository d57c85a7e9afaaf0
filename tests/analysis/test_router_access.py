"""`rs.routing(model, run_or_trace)[layer]` against transformers' own router outputs
(`output_router_logits`) and a hand computation of each expert's MLP, on tiny saved models."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import routescope as rs
from hf_models import saved_models
from routescope.core_models.checkpoint import load_checkpoint
from routescope.core_models.router_access import RoleUnavailable, routing
from routescope.core_models.trace import tracing

IDS = [[11, 57, 3, 99, 140, 7, 250, 31, 64, 8, 200, 12], [5, 9, 23, 77, 1, 2, 180, 33, 41, 90, 6, 14]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    return saved_models(tmp_path_factory, tokenizer)


def plain(path):
    # transformers is optional (the hf extra); these tests need it
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path)).eval()


def test_the_accessor_gives_transformers_own_router_outputs_on_mixtral(saved):
    _, path = saved("mixtral")
    model, _ = load_checkpoint(path)
    ref = plain(path)
    x = torch.tensor(IDS)
    inputs, handles = [], []
    for name, mod in ref.named_modules():  # what each block hands its experts, on the plain model
        if name.endswith("mlp.experts"):
            handles.append(mod.register_forward_pre_hook(lambda m, a: inputs.append(a[0])))
    with torch.no_grad():
        want = ref(x, output_router_logits=True).router_logits  # one [B * T, n] per MoE layer
    for h in handles:
        h.remove()
    with torch.no_grad(), tracing() as tr:
        model(x)
    r = routing(model, tr, ids=IDS)
    assert rs.routing is routing and list(r) == list(model.routing_layers()) and len(r) == len(want)
    k = ref.config.num_experts_per_tok
    for i, layer in enumerate(r):
        rec, logits = r[layer], want[i].reshape(len(IDS), len(IDS[0]), -1)
        probs = F.softmax(logits.float(), dim=-1)
        top = probs.topk(k, dim=-1)  # Mixtral: top-k of the softmax, renormalised over the k
        assert rec.logits.shape == logits.shape and torch.equal(rec.logits, logits)
        assert torch.allclose(rec.probs, probs, atol=1e-6)
        assert torch.equal(rec.indices, top.indices)
        assert torch.allclose(rec.weights, top.values / top.values.sum(-1, keepdim=True), atol=1e-6)
        # each selected expert's MLP by hand, from its weights: down(silu(gate) * up)
        experts = ref.get_submodule(layer.rsplit(".", 1)[0] + ".experts")
        h = inputs[i].reshape(len(IDS), len(IDS[0]), -1)
        gate_up = torch.einsum("btkfd,btd->btkf", experts.gate_up_proj[rec.indices], h)
        g, u = gate_up.chunk(2, dim=-1)
        by_hand = torch.einsum("btkdf,btkf->btkd", experts.down_proj[rec.indices], F.silu(g) * u)
        out = rec.expert_outputs
        assert out.shape == (len(IDS), len(IDS[0]), k, h.shape[-1])
        assert torch.allclose(out, by_hand, atol=1e-5)
        with pytest.raises(RoleUnavailable, match="records no shared_output"):
            rec.shared_output


def test_a_role_the_type_does_not_record_gives_its_record_s_reason(saved):
    _, path = saved("gpt_oss")
    model, _ = load_checkpoint(path)
    with torch.no_grad(), tracing() as tr:
        model(torch.tensor(IDS))
    rec = next(iter(routing(model, tr).values()))
    assert "top-k logits only" in rec.why("probs")
    with pytest.raises(RoleUnavailable, match="top-k logits only"):
        rec.probs
    assert rec.why("logits") is None and rec.logits.shape[-1] == model.routing_modules[rec.name].n_experts
    with pytest.raises(RoleUnavailable, match="need the run's token ids"):  # a trace alone has none
        rec.expert_outputs


def test_the_shared_expert_s_output_is_what_transformers_computes(saved):
    _, path = saved("qwen2_moe")
    model, _ = load_checkpoint(path)
    ref = plain(path)
    got, handles = [], []
    for name, mod in ref.named_modules():
        if name.endswith("mlp.shared_expert"):
            handles.append(mod.register_forward_hook(lambda m, a, out: got.append(out)))
    with torch.no_grad():
        ref(torch.tensor(IDS))
    for h in handles:
        h.remove()
    with torch.no_grad(), tracing() as tr:
        model(torch.tensor(IDS))
    records = routing(model, tr)
    assert len(got) == len(records)
    for rec, out in zip(records.values(), got):
        assert torch.equal(rec.shared_output, out.reshape(len(IDS), len(IDS[0]), -1))


def test_a_run_gives_its_trace_ids_and_ablation(saved, tokenizer):
    _, path = saved("mixtral")
    model, _ = load_checkpoint(path)
    layer = list(model.routing_layers())[0]
    run = rs.run(model, tokenizer, "the cat sat on", max_new_tokens=3, drop=[f"{layer}:0"])
    rec = rs.routing(model, run)[layer]
    assert not (rec.indices == 0).any()  # the run's ablation
    out = rec.expert_outputs  # recomputed under the same ablation, over the traced positions
    assert out.shape[:3] == rec.indices.shape
    with torch.no_grad(), tracing([model.routing_modules[layer].roles["indices"]]) as tr:
        model(torch.tensor(run.generation.ids[:rec.indices.shape[1]])[None],
              ablation=run.ablation)
    assert torch.equal(tr[model.routing_modules[layer].roles["indices"]], rec.indices)
