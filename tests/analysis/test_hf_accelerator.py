"""Transformers MoE models on an accelerator (CUDA; skipped on a machine without one): RouteScope
loads them straight onto the device in the dtype asked for, and what it records and generates
equals transformers' own model on the same device: logits, each router's top-k, greedy tokens; and
a model spread over the GPU and the CPU by `device_map="auto"` equals it loaded whole."""
from __future__ import annotations

import pytest
import torch

from hf_models import MOE_TYPES, saved_models
from routescope.core_models.checkpoint import load_checkpoint
from routescope.core_models.generate import generate
from routescope.core_models.trace import tracing

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
IDS = [[11, 57, 3, 99, 140, 7, 250, 31, 64, 8, 200, 12]]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    """model_type -> (transformers model, its saved directory)."""
    return saved_models(tmp_path_factory, tokenizer)


def own_routes(m, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """transformers' logits and each router's own top-k indices, on a plain forward."""
    got, handles = {}, []
    for name, mod in m.named_modules():
        if name.endswith((".mlp.gate", ".mlp.router")) and hasattr(mod, "top_k"):
            handles.append(mod.register_forward_hook(lambda mod, a, out, name=name: got.__setitem__(name, out[2])))
    try:
        with torch.no_grad():
            logits = m(ids).logits
    finally:
        for h in handles:
            h.remove()
    return logits, got


@CUDA
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_on_cuda_routes_and_logits_equal_transformers_own(saved, model_type, dtype):
    from transformers import AutoModelForCausalLM

    _, path = saved(model_type)
    # plain transformers as a user loads it (`.to(bfloat16)` of a float32 model would round its float32
    # rotary tables too, which from_pretrained keeps: a different model, seen on an H200)
    plain = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype], device_map="cuda",
                                                 trust_remote_code=False).eval()
    model, _ = load_checkpoint(path, device="cuda", dtype=dtype)
    assert model.device.type == "cuda" and all(p.device.type == "cuda" for p in model.parameters())
    assert {p.dtype for p in model.parameters() if p.is_floating_point()} == {DTYPES[dtype]}
    ids = torch.tensor(IDS, device="cuda")
    ref, routes = own_routes(plain, ids)
    first = next(iter(routes))
    with torch.no_grad(), tracing() as tr:
        out = model(torch.tensor(IDS))  # ids on the CPU: the model moves them
        inside = tr[f"{first}.indices"].clone()  # read before the trace closes: waits for its copies
    assert torch.equal(inside.reshape(routes[first].shape), routes[first].cpu())
    assert torch.equal(out.logits.cpu(), ref.float().cpu())  # the same kernels on the same values
    for layer, indices in routes.items():
        assert torch.equal(tr[f"{layer}.indices"].reshape(indices.shape), indices.cpu()), layer
    gen = generate(model, IDS[0], max_new_tokens=8)
    want = plain.generate(ids, max_new_tokens=8, do_sample=False)[0].tolist()
    assert gen.ids[:len(want)] == want


@CUDA
@pytest.mark.parametrize("model_type", ("olmoe", "deepseek_v3"))
def test_a_model_spread_over_gpu_and_cpu_equals_it_whole(saved, model_type):
    pytest.importorskip("accelerate")
    m, path = saved(model_type)
    whole, _ = load_checkpoint(path, device="cuda", dtype="float32")
    room = sum(p.numel() * 4 for p in m.parameters()) // 2  # half on the GPU, the rest on the CPU
    split, _ = load_checkpoint(path, device="cuda", dtype="float32", device_map="auto",
                               max_memory={0: room, "cpu": 2**34})
    assert {"cuda:0", "cpu"} <= set(split.placement.values()), split.placement
    assert split.device == torch.device("cuda", 0)
    with torch.no_grad(), tracing() as a:
        ref = whole(torch.tensor(IDS)).logits.cpu()
    with torch.no_grad(), tracing() as b:
        got = split(torch.tensor(IDS)).logits.cpu()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=0)
    for site in a.records:
        if site.endswith(".indices"):
            assert torch.equal(a[site], b[site]), site
