"""The MoE types issue 42 opened (Llama-4, Mistral-4, JetMoE, Doge, ZAYA, DeepSeek-V4) beyond the
coverage test's checks: what each record adds, checked against transformers' own modules."""
from __future__ import annotations

import pytest
import torch
import transformers

from hf_models import save_hf
from hf_zoo import moe_types, tiny_moe
from routescope.analysis.reports.importance import ImportanceSettings, importance
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint
from routescope.core_models.hf import HFConfig, HFModel
from routescope.core_models.hf.config import causal_lm_class
from routescope.core_models.trace import tracing
from test_hf_coverage import product_key_routes
from test_importance import corpus

TYPES = moe_types()
IDS = [[11, 57, 3, 99, 140, 7, 250, 31, 64, 8, 200, 12]]


def opened(model_type: str) -> HFModel:
    m = tiny_moe(model_type, TYPES[model_type], 256)
    return HFModel(HFConfig.from_hf_dict(m.config.to_dict()), m).eval()


@pytest.mark.parametrize("model_type", ["llama4_text", "mistral4", "jetmoe", "doge", "zaya", "deepseek_v4"])
def test_the_importance_sweep_runs_on_each_new_type(model_type, tokenizer, tmp_path):
    model, tok = load_checkpoint(save_hf(tiny_moe(model_type, TYPES[model_type], tokenizer.get_vocab_size()),
                                         tmp_path / model_type, tokenizer))
    res = importance(model, tok, corpus(), ImportanceSettings(max_tokens=60, batch_size=2, control_draws=1,
                                                              prune_draws=1, prune_max=0))
    assert len(res["importance"]) == sum(m.n_options for m in model.routing_modules.values())
    reap = res["proxies"]["reap"] if "reap" in res["proxies"] else None
    if reap is not None and model.quirk.reason("expert_outputs"):  # no per-expert outputs: REAP NaN where
        assert reap.isna().any() and (reap.isna() | (reap == 0)).all()  # an expert ran (0: it never did)


def test_llama4_expert_outputs_are_each_chosen_experts_mlp_on_the_token():
    """Llama-4's experts take tokens pre-scaled by the router's scores; `expert_outputs` is each chosen
    expert on the token itself (weight 1), computed here from the experts' stacked weights by hand."""
    model = opened("llama4_text")
    x = torch.tensor(IDS * 2)
    with torch.no_grad():
        prefix = model.capture(x)
        for layer in model.routing_layers():
            got = model.expert_outputs(prefix, layer)
            hidden, idx, _ = prefix.experts[layer]
            ex = model.hf.get_submodule(model.routing_modules[layer].block.experts)
            h, e = hidden.reshape(-1, hidden.shape[-1]), idx.reshape(-1, idx.shape[-1])
            gate, up = torch.einsum("th,tkhd->tkd", h, ex.gate_up_proj[e]).chunk(2, dim=-1)
            want = torch.einsum("tkd,tkdh->tkh", up * ex.act_fn(gate), ex.down_proj[e])
            assert torch.allclose(got.reshape(want.shape), want, atol=1e-5)


def test_doge_rows_with_different_ablations_equal_its_block_by_hand():
    """Row ablations on Doge (each row drops its own expert where its top-k chooses among every expert)
    equal the plain model whose first MoE block is computed by hand with each row's drop."""
    model = opened("doge")
    layer = next(iter(model.routing_layers()))
    x = torch.tensor([IDS[0], IDS[0][::-1]])
    with torch.no_grad():
        plain = model.hf(x).logits
    # the most used expert of each row, dropped in that row only
    with torch.no_grad(), tracing() as tr:
        model(x)
    idx = tr[model.routing_modules[layer].roles["indices"]].reshape(2, -1)
    drops = [int(idx[r].bincount().argmax()) for r in range(2)]
    with torch.no_grad():
        got = model(x, row_ablations=[Ablation(drop=((layer, d),)) for d in drops]).logits

    def by_hand(block, args, out):
        h = args[0]
        b, t, _ = h.shape
        logits = block.router_gate(h).view(2, b * t, -1)
        rows = [product_key_routes(block, logits[:, r * t:(r + 1) * t], (drops[r],)) for r in range(b)]
        i, w = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
        a = block.act_fn(torch.matmul(block.down_embed(i), h.view(b * t, -1, 1)).view(b * t, -1)) * w
        routed = torch.matmul(a.view(b * t, 1, -1), block.up_embed(i)).view(b, t, -1)
        return block.down_proj(block.act_fn(block.gate_proj(h)) * block.up_proj(h)) + routed, logits

    model.detach()
    handle = model.hf.get_submodule(layer).register_forward_hook(by_hand)
    try:
        with torch.no_grad():
            want = model.hf(x).logits
    finally:
        handle.remove()
    assert not torch.allclose(want, plain) and torch.allclose(got.float(), want.float(), atol=1e-5)


def test_option_labels_say_what_a_layer_routes_to():
    jet = opened("jetmoe")
    labels = {n: m.option_labels() for n, m in jet.routing_modules.items()}
    assert all(l[0] == ("attention expert 0" if ".self_attention." in n else "expert 0") for n, l in labels.items())
    zaya = opened("zaya")
    assert all(m.option_labels()[-1].startswith("skip") and len(m.option_labels()) == m.n_options
               for m in zaya.routing_modules.values())


def test_a_causal_lm_filed_elsewhere_is_found_by_its_own_type_only():
    assert causal_lm_class("mistral4", None) is transformers.Mistral4ForCausalLM  # image-text-to-text's entry
    assert causal_lm_class("mistral4", ["LlamaForCausalLM"]) is transformers.Mistral4ForCausalLM
    assert causal_lm_class("no_such_type", ["LlamaForCausalLM"]) is None  # a class for another type's config
    assert causal_lm_class("mixtral", None) is transformers.AutoModelForCausalLM
