"""The per-type records (`core_models.hf.quirks`) against the models transformers builds: each record
says what its type's block has (checked here independently of the record, by the module tree and the
zoo's own config values), a model that does not match its record is refused at load in one line, and
a role a type does not record carries its reason."""
from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch

from hf_models import saved_models
from hf_zoo import N_EXPERTS, OVERRIDES, REPRESENTATIVE, TOP_K, causal_lm, moe_types, shrink, tiny_moe
from routescope.core_models.checkpoint import CheckpointError, load_checkpoint
from routescope.core_models.hf import HFConfig, HFModel, UnsupportedMoE, moe_layout, quirks
from routescope.core_models.trace import tracing

TYPES = moe_types()
IDS = [[11, 57, 3, 99, 140, 7, 250, 31, 64, 8, 200, 12]]


def meta_model(model_type: str):
    cls = TYPES[model_type]
    try:
        cfg = cls(**shrink(cls().to_dict(), 256))
    except Exception as e:  # the zoo cannot make this type (test_hf_coverage reports it)
        pytest.skip(f"the zoo cannot build {model_type}: {type(e).__name__}")
    with torch.device("meta"):
        return causal_lm(model_type).from_config(cfg)


@pytest.mark.parametrize("model_type", [t if t in REPRESENTATIVE else pytest.param(t, marks=pytest.mark.slow)
                                        for t in sorted(TYPES)])
def test_each_record_matches_the_block_transformers_builds(model_type):
    m = meta_model(model_type)
    q = quirks.quirk(model_type)
    try:
        blocks = moe_layout(m)
    except UnsupportedMoE as e:  # refused: by its record, or because no experts call carries the routes
        assert "\n" not in str(e)
        assert q.refused is None or q.refused in str(e)
        return
    assert q.refused is None and blocks
    named = dict(m.named_modules())
    for b in blocks:
        block = named[b.router.rsplit(".", 1)[0]]
        router = named[b.router]
        # every child named shared* is the record's shared expert or its gate (none is left unread)
        shared = {n for n, c in block.named_children() if n.startswith("shared") and any(True for _ in c.parameters())}
        assert shared == {x for x in (q.shared, q.shared_gate) if x}, (shared, q)
        # every per-expert tensor named *bias or *biases (ZAYA's balancing_biases) of the block (router
        # included) other than a linear's own bias is the record's selection bias
        linear_biases = {f"{n}.bias" if n else "bias" for n, c in block.named_modules()
                         if isinstance(c, torch.nn.Linear) or c is router and hasattr(c, "weight")}
        biases = {n for n, t in [*block.named_parameters(), *block.named_buffers()]
                  if n.endswith(("bias", "biases")) and t.numel() == b.n_experts and n not in linear_biases}
        assert biases == ({q.choice_bias} if q.choice_bias else set()), (biases, q)
        # the zoo sets every experts-per-token field to TOP_K (but where a type's validation wants another)
        assert b.top_k == OVERRIDES.get(model_type, {}).get("num_experts_per_tok", TOP_K)
        zero = getattr(getattr(m.config, "text_config", None) or m.config, "zero_expert_num", None) or 0
        # LongCat-Flash's logits also cover its zero-computation experts, ZAYA's its skip class (Doge's zoo
        # model has a square count of its own)
        experts = OVERRIDES.get(model_type, {}).get("num_experts", N_EXPERTS)
        assert b.n_experts == (getattr(router, "num_router_classes", None) or experts + zero)
        if q.expert_count is not None:  # the field pruning lowers holds the expert count
            source = getattr(m.config, "text_config", None) or m.config
            for part in q.expert_count.split("."):
                source = getattr(source, part)
            assert source == N_EXPERTS


@pytest.mark.parametrize("model_type", ["mixtral", "gpt_oss", "deepseek_v3", "granitemoe", "dbrx", "phimoe"])
def test_probabilities_are_recorded_unless_the_record_says_why_not(model_type):
    model = HFModel(HFConfig.from_hf_dict(tiny_moe(model_type, TYPES[model_type], 256).config.to_dict()),
                    tiny_moe(model_type, TYPES[model_type], 256)).eval()
    for layer, m in model.routing_modules.items():
        with torch.no_grad(), tracing([m.roles["probs"]]) as tr:
            model(torch.tensor(IDS))
        why = m.unavailable.get("probs")
        assert (m.roles["probs"] in tr) == (why is None), why
        if why is None:  # the router's own normalisation of its logits: softmax sums to 1, sigmoid in (0, 1)
            with torch.no_grad(), tracing([m.roles["logits"]]) as lt:
                model(torch.tensor(IDS))
            logits, probs = lt[m.roles["logits"]].float(), tr[m.roles["probs"]].float()
            want = torch.sigmoid(logits) if model.quirk.scoring == "sigmoid" else torch.softmax(logits, -1)
            assert torch.allclose(probs, want, atol=1e-5)
        else:
            assert model_type in quirks.QUIRKS and why == quirks.QUIRKS[model_type].reason("probs")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    return saved_models(tmp_path_factory, tokenizer)


@pytest.mark.parametrize("change, expected", [
    (dict(shared="shared_expert"), "has no `shared_expert`"),
    (dict(choice_bias="gate.e_score_correction_bias"), "no selection bias `gate.e_score_correction_bias`"),
    (dict(top_k="config.no_such_field"), "config.no_such_field"),
    (dict(output=("weights", "logits", "indices")), "its record at 1"),
])
def test_a_model_that_does_not_match_its_record_is_refused_at_load_in_one_line(saved, change, expected):
    _, path = saved("mixtral")
    wrong = dataclasses.replace(quirks.quirk("mixtral"), **change)
    with mock.patch.dict(quirks.QUIRKS, {"mixtral": wrong}), pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    msg = str(e.value)
    assert "\n" not in msg and "'mixtral'" in msg and expected in msg, msg


def test_experts_called_without_their_routes_are_refused_never_recorded_as_nothing(saved):
    _, path = saved("mixtral")
    model, _ = load_checkpoint(path)
    layer = next(iter(model.routing_modules.values()))
    experts = model.hf.get_submodule(layer.block.experts)
    with pytest.raises(ValueError, match=r"called without top_k_index, top_k_weights; its record expects"):
        experts(torch.zeros(3, 32))


def test_the_reason_a_role_is_missing_is_on_the_routing_layer(saved):
    _, path = saved("gpt_oss")
    model, _ = load_checkpoint(path)
    for m in model.routing_modules.values():
        assert "top-k logits only" in m.unavailable["probs"]
    _, path = saved("mixtral")
    model, _ = load_checkpoint(path)
    assert all(not m.unavailable for m in model.routing_modules.values())
