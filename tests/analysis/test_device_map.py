"""`--device-map auto`: accelerate spreads a transformers MoE model over the devices it is given (here
the CPU and disk, forced by a small `max_memory`), and every result equals the model loaded whole:
logits, recorded routes, an ablation, greedy generation and prefix reuse."""
from __future__ import annotations

import pytest
import torch

from hf_models import saved_models
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import CheckpointError, load_checkpoint
from routescope.core_models.devices import parse_max_memory
from routescope.core_models.generate import generate
from routescope.core_models.trace import tracing

pytest.importorskip("accelerate")
IDS = [[11, 57, 3, 99, 140, 7, 250, 31, 64, 8, 200, 12]]
TYPES = ("olmoe", "qwen2_moe", "deepseek_v3")  # plain top-k; a shared expert and a dense layer; group-limited


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tokenizer):
    """model_type -> (model loaded whole, the same split over CPU and disk)."""
    made, saved = {}, saved_models(tmp_path_factory, tokenizer)

    def make(model_type: str):
        if model_type not in made:
            m, path = saved(model_type)
            whole, _ = load_checkpoint(path, device="cpu", dtype="float32")
            # room for half the model (accelerate keeps the largest layer's size free besides): the
            # embedding and the first layers stay on the CPU, the rest must go to disk
            layer = max(sum(p.numel() * 4 for p in block.parameters()) for block in m.model.layers)
            room = sum(p.numel() * 4 for p in m.parameters()) // 2 + layer
            split, _ = load_checkpoint(path, device="cpu", dtype="float32", device_map="auto",
                                       max_memory={"cpu": room})
            made[model_type] = whole, split
        return made[model_type]
    return make


@pytest.mark.parametrize("model_type", TYPES)
def test_the_map_really_splits_the_model(pair, model_type):
    whole, split = pair(model_type)
    assert whole.placement == {}
    assert {"cpu", "disk"} <= set(split.placement.values()), split.placement
    assert split.device == torch.device("cpu")  # the embedding's device, though some parameters are on meta
    assert any(p.device.type == "meta" for p in split.hf.parameters())  # offloaded until their layer runs


@pytest.mark.parametrize("model_type", TYPES)
def test_split_forward_and_routes_equal_the_whole_model(pair, model_type):
    whole, split = pair(model_type)
    ids = torch.tensor(IDS)
    layer = list(whole.routing_layers())[-1]
    for ab in (Ablation(), Ablation.parse(drop=[f"{layer}:0-1"])):
        with torch.no_grad(), tracing() as a:
            ref = whole(ids, ablation=ab).logits
        with torch.no_grad(), tracing() as b:
            got = split(ids, ablation=ab).logits
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)  # same kernels on the same values
        assert sorted(a.records) == sorted(b.records)
        for site in a.records:
            torch.testing.assert_close(b[site], a[site], rtol=1e-6, atol=0)


@pytest.mark.parametrize("model_type", TYPES)
def test_split_generation_equals_the_whole_model(pair, model_type):
    whole, split = pair(model_type)
    assert generate(split, IDS[0], max_new_tokens=6).ids == generate(whole, IDS[0], max_new_tokens=6).ids


def test_prefix_reuse_under_the_map_equals_the_whole_model(pair):
    whole, split = pair("olmoe")
    ids = torch.tensor(IDS)
    layer = list(whole.routing_layers())[1]
    abl = [Ablation.parse(drop=[f"{layer}:{e}"]) for e in (0, 2)]
    with torch.no_grad():
        ref = whole.resume(whole.capture(ids), layer, abl)
        got = split.resume(split.capture(ids), layer, abl)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)


def test_max_memory_spec_and_refusals(tmp_path, pair):
    assert parse_max_memory("cpu=20GiB, 0=70GiB,cuda:1=1000") == {"cpu": "20GiB", 0: "70GiB", 1: 1000}
    for bad in ("cpu", "gpu=3GiB", "cpu=lots", ","):
        with pytest.raises(ValueError, match="max memory"):
            parse_max_memory(bad)
    with pytest.raises(ValueError, match="device map 'everywhere'"):
        load_checkpoint(tmp_path, device_map="everywhere")
    with pytest.raises(CheckpointError, match="--device-map auto"):
        load_checkpoint(tmp_path, max_memory="cpu=1GiB")


def test_own_checkpoints_load_whole_under_the_map():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "checkpoints" / "moep"
    a, _ = load_checkpoint(path, device="cpu", device_map="auto")
    b, _ = load_checkpoint(path, device="cpu")
    ids = torch.tensor([[5, 9, 12, 40]])
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)
