"""An HFModel's wrappers and its lifetime: the transformers modules never keep the HFModel alive (its
wrapped forwards hold it weakly), and `detach` gives the transformers model its own forwards back."""
from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

from hf_models import saved_models
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint
from routescope.core_models.hf.instrument import Wrapped
from routescope.core_models.trace import tracing

IDS = [[11, 57, 3, 99, 140, 7, 250, 31, 64, 8, 200, 12]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    return saved_models(tmp_path_factory, tokenizer)


def wrappers(hf) -> list[str]:
    return [n for n, m in hf.named_modules() if isinstance(m.__dict__.get("forward"), Wrapped)]


@pytest.mark.parametrize("model_type", ["qwen2_moe", "deepseek_v3"])  # shared experts and gates; a biased router
def test_deleting_the_model_frees_it_without_the_garbage_collector(saved, model_type):
    _, path = saved(model_type)
    model, _ = load_checkpoint(path)
    hf = model.hf  # the transformers model outlives the wrapper: its modules must not hold it
    assert wrappers(hf)
    layer = list(model.routing_layers())[-1]
    with torch.no_grad():
        with tracing([f"{layer}.logits", f"{layer}.probs"]):
            model(torch.tensor(IDS))
        prefix = model.capture(torch.tensor(IDS))
        model.resume(prefix, layer, [Ablation(drop=((layer, 0),))])
    ref = weakref.ref(model)
    gc.disable()
    try:
        del model, prefix
        assert ref() is None  # freed by its reference count alone
    finally:
        gc.enable()
    with torch.no_grad():  # the orphaned wrappers call the modules' own forwards
        out = hf(torch.tensor(IDS)).logits
    assert torch.isfinite(out).all()


def test_a_deep_copy_of_the_transformers_model_alone_has_its_plain_forwards(saved):
    _, path = saved("qwen2_moe")
    model, _ = load_checkpoint(path)
    twin = copy.deepcopy(model.hf)
    assert wrappers(model.hf) and not wrappers(twin)
    with torch.no_grad():
        assert torch.equal(twin(torch.tensor(IDS)).logits, model.hf(torch.tensor(IDS)).logits)


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "deepseek_v3"])
def test_detach_gives_the_transformers_model_its_own_forwards_back(saved, model_type):
    # transformers is optional (the hf extra); these tests need it
    from transformers import AutoModelForCausalLM

    _, path = saved(model_type)
    model, _ = load_checkpoint(path)
    fresh = AutoModelForCausalLM.from_pretrained(str(path)).eval()  # never wrapped
    hf = model.detach()
    assert hf is model.hf
    assert not wrappers(hf)
    assert all("forward" not in m.__dict__ for m in hf.modules())  # each module calls its class's forward again
    with torch.no_grad():
        assert torch.equal(hf(torch.tensor(IDS)).logits, fresh(torch.tensor(IDS)).logits)
    with pytest.raises(ValueError, match="detached"):
        model(torch.tensor(IDS))
