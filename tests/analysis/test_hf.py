"""Hugging Face MoE models opened from a local directory, on transformers' own classes: what
RouteScope records equals what transformers returns, ablations equal each layer recomputed by hand
with the expert's logit masked, and every view, the export and the app work on them."""
from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from hf_models import MOE_TYPES, saved_models
from routescope.analysis.export import columns as C
from routescope.analysis.export.table_files import read_csv
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import CheckpointError, load_checkpoint
from routescope.core_models.generate import generate
from routescope.core_models.hf import quirks
from routescope.core_models.trace import tracing
from tolerances import FORWARD_EPS, assert_close_to_scale

IDS = [[11, 57, 3, 99, 140, 7, 250, 31, 64, 8, 200, 12]]
ROUTER = {"gpt_oss": "router"}  # the router's name in its MoE block (else "gate")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    """model_type -> (transformers model, its saved directory)."""
    return saved_models(tmp_path_factory, tokenizer)


def moe_layer_indices(model_type: str, cfg) -> list[int]:
    """Which decoder layers are MoE, by each type's own config rule (written out here, independently)."""
    n = cfg.num_hidden_layers
    if model_type == "qwen2_moe":
        return [i for i in range(n) if i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0]
    if model_type == "qwen3_moe":
        return [i for i in range(n) if i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0]
    if model_type == "deepseek_v3":
        return list(range(cfg.first_k_dense_replace, n))
    return list(range(n))


def router_outputs(m, ids) -> dict[str, tuple]:
    """Each router module's own outputs (logits, weights, indices) on a plain transformers forward."""
    got, handles = {}, []
    for name, mod in m.named_modules():
        if name.endswith((".mlp.gate", ".mlp.router")) and hasattr(mod, "top_k"):
            handles.append(mod.register_forward_hook(lambda mod, a, out, name=name: got.__setitem__(name, out)))
    try:
        with torch.no_grad():
            m(torch.tensor(ids))
    finally:
        for h in handles:
            h.remove()
    return got


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_routing_layers_are_the_moe_blocks_routers(saved, model_type):
    m, path = saved(model_type)
    model, tok = load_checkpoint(path)
    want = [f"model.layers.{i}.mlp.{ROUTER.get(model_type, 'gate')}" for i in moe_layer_indices(model_type, m.config)]
    assert list(model.routing_layers()) == want  # dense layers in between are not routing layers
    assert model.config.label == model_type and tok is not None
    n = model.hf.get_submodule(want[0]).weight.shape[0]
    shared = model_type in ("qwen2_moe", "deepseek_v3")
    assert model.option_labels()[want[0]] == [f"expert {j}" for j in range(n)] + (["shared expert"] if shared else [])


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_recorded_router_outputs_equal_transformers_own(saved, model_type):
    m, path = saved(model_type)
    model, _ = load_checkpoint(path)
    with torch.no_grad(), tracing() as tr:
        out = model(torch.tensor(IDS))
    with torch.no_grad():
        ref = m(torch.tensor(IDS), output_router_logits=True)
    assert torch.equal(out.logits, ref.logits.float())
    own = router_outputs(m, IDS)
    layers = list(model.routing_layers())
    assert len(ref.router_logits) == len(layers) == len(own)
    B, T = len(IDS), len(IDS[0])
    for layer, ref_logits in zip(layers, ref.router_logits):
        logits, weights, indices = own[layer]
        assert torch.equal(tr[f"{layer}.logits"].reshape(B * T, -1), ref_logits.float())
        assert torch.equal(tr[f"{layer}.indices"].reshape(B * T, -1), indices)
        assert torch.equal(tr[f"{layer}.weights"].reshape(B * T, -1), weights.float())
        probs = f"{layer}.probs"
        if model_type == "gpt_oss":  # its router never computes probabilities over all experts
            assert probs not in tr
        elif model_type == "deepseek_v3":
            assert torch.equal(tr[probs].reshape(B * T, -1), logits.float().sigmoid())
        else:
            assert torch.equal(tr[probs].reshape(B * T, -1), F.softmax(logits.float(), dim=-1))
    if model_type == "qwen2_moe":  # the shared-expert gate's linear, as the block computes it
        gate = m.get_submodule("model.layers.0.mlp.shared_expert_gate")
        x = {}
        h = m.get_submodule("model.layers.0.mlp").register_forward_hook(lambda mod, a, o: x.setdefault("in", a[0]))
        with torch.no_grad():
            m(torch.tensor(IDS))
        h.remove()
        assert torch.equal(tr["model.layers.0.mlp.shared_expert_gate"], gate(x["in"]))


@pytest.mark.parametrize("model_type", MOE_TYPES + ("llama", "gpt2", "qwen2"))
def test_greedy_generation_equals_transformers_generate(saved, model_type, tokenizer):
    m, path = saved(model_type)
    model, _ = load_checkpoint(path)
    gen = generate(model, IDS[0], max_new_tokens=10)
    ref = m.generate(torch.tensor(IDS), max_new_tokens=10, do_sample=False)[0].tolist()
    assert gen.ids[:len(ref)] == ref  # transformers stops at its end-of-text token; ours runs on
    assert len(ref) == len(gen.ids) or ref[-1] in np.atleast_1d(m.generation_config.eos_token_id)
    if model_type in ("llama", "gpt2", "qwen2"):  # dense: no routing layers, and attribution works
        from routescope.analysis.runs.attribution import TokenAttribution

        assert model.routing_layers() == {}
        res = TokenAttribution(model).attribute(IDS[0], len(IDS[0]) - 1, 5, n_steps=16)
        assert res.attributions.shape == (len(IDS[0]),) and bool(torch.isfinite(res.attributions).all())


# --- ablations against the layer recomputed by hand -------------------------------------------------

def hand_routes(model_type: str, router, x: torch.Tensor, dropped: set[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, weights) of router `router` on x (N, d) with the dropped experts' logits masked,
    by each type's own rule, written out here with plain loops where it groups."""
    logits = F.linear(x.float(), router.weight.float(), getattr(router, "bias", None))
    logits[:, sorted(dropped)] = float("-inf")
    k = router.top_k
    if model_type == "gpt_oss":
        top, idx = logits.topk(k, dim=-1)
        return idx, F.softmax(top, dim=-1)
    if model_type == "deepseek_v3":
        scores = logits.sigmoid()
        n, groups = scores.shape[1], router.num_group
        size = n // groups
        idx_rows = []
        for row, s in zip(scores, scores + router.e_score_correction_bias):
            s = s.clone()
            s[sorted(dropped)] = -1e9  # excluded before selection (finite: the group sums stay ordered)
            group_score = [sorted(s[g * size:(g + 1) * size].tolist(), reverse=True)[:2] for g in range(groups)]
            keep = sorted(range(groups), key=lambda g: -sum(group_score[g]))[:router.topk_group]
            allowed = torch.full_like(s, float("-inf"))
            for g in keep:
                allowed[g * size:(g + 1) * size] = s[g * size:(g + 1) * size]
            idx_rows.append(allowed.topk(k).indices)
        idx = torch.stack(idx_rows)
        w = scores.gather(1, idx)
        if router.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * router.routed_scaling_factor
    probs = F.softmax(logits, dim=-1)
    top, idx = probs.topk(k, dim=-1)
    if model_type == "mixtral" or getattr(router, "norm_topk_prob", False):
        top = top / top.sum(-1, keepdim=True)
    return idx, top


def block_by_hand(model_type: str, block, x: torch.Tensor, dropped: set[int], shared_dropped: bool) -> torch.Tensor:
    """The MoE block's output on x (B, T, d): routes by hand, the experts through the block's own
    expert module, the shared expert as the block adds it."""
    router = getattr(block, "router", None) or block.gate
    flat = x.reshape(-1, x.shape[-1])
    idx, w = hand_routes(model_type, router, flat, dropped)
    out = block.experts(flat, idx, w.to(flat.dtype))
    if model_type == "qwen2_moe" and not shared_dropped:
        out = out + torch.sigmoid(block.shared_expert_gate(flat)) * block.shared_expert(flat)
    if model_type == "deepseek_v3" and not shared_dropped:
        out = out + block.shared_experts(flat)
    return out.reshape(x.shape)


def block_io(model, layer: str, ablation: Ablation):
    """Input and output of the MoE block holding `layer`, in a call with `ablation`."""
    block = model.hf.get_submodule(layer.rsplit(".", 1)[0])
    io = {}
    h = block.register_forward_hook(lambda mod, a, o: io.update(x=a[0], y=o[0] if isinstance(o, tuple) else o))
    try:
        with torch.no_grad(), tracing() as tr:
            model(torch.tensor(IDS), ablation=ablation)
    finally:
        h.remove()
    return block, io["x"], io["y"], tr


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_dropping_an_expert_equals_the_layer_recomputed_with_its_logit_masked(saved, model_type):
    _, path = saved(model_type)
    model, _ = load_checkpoint(path)
    layer = list(model.routing_layers())[0]
    with torch.no_grad(), tracing() as base:
        model(torch.tensor(IDS))
    first = base[f"{layer}.indices"].flatten()
    e = int(torch.bincount(first).argmax())  # the expert used most: dropping it changes routes
    block, x, y, tr = block_io(model, layer, Ablation(drop=((layer, e),)))
    assert_close_to_scale(y, block_by_hand(model_type, block, x, {e}, False), FORWARD_EPS)
    idx = tr[f"{layer}.indices"].reshape(-1, model.routing_modules[layer].top_k)
    assert not (idx == e).any()  # excluded before selection: the router took its next choice
    want_idx, want_w = hand_routes(model_type, getattr(block, "router", None) or block.gate, x.reshape(-1, x.shape[-1]), {e})
    assert [sorted(r) for r in idx.tolist()] == [sorted(r) for r in want_idx.tolist()]
    got_w = tr[f"{layer}.weights"].reshape(idx.shape)
    assert_close_to_scale(got_w.sort(-1).values, want_w.sort(-1).values, FORWARD_EPS)


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_forcing_an_expert_gives_it_every_token(saved, model_type):
    _, path = saved(model_type)
    model, _ = load_checkpoint(path)
    layer = list(model.routing_layers())[-1]
    m = model.routing_modules[layer]
    block, x, y, tr = block_io(model, layer, Ablation(force=((layer, 1),)))
    others = set(range(m.n_experts)) - {1}
    assert_close_to_scale(y, block_by_hand(model_type, block, x, others, False), FORWARD_EPS)
    idx = tr[f"{layer}.indices"].reshape(-1, m.top_k)
    w = tr[f"{layer}.weights"].reshape(idx.shape)
    assert (idx == 1).any(-1).all()
    assert (w[idx != 1] == 0).all() and (w[idx == 1] > 0).all()  # the other slots carry no weight


@pytest.mark.parametrize("model_type", ["qwen2_moe", "deepseek_v3"])
def test_dropping_the_shared_expert_removes_its_term(saved, model_type):
    _, path = saved(model_type)
    model, _ = load_checkpoint(path)
    layer = list(model.routing_layers())[0]
    shared = model.routing_modules[layer].n_experts  # the layer's last option
    block, x, y, _ = block_io(model, layer, Ablation(drop=((layer, shared),)))
    assert_close_to_scale(y, block_by_hand(model_type, block, x, set(), True), FORWARD_EPS)
    with pytest.raises(ValueError, match="the shared expert always runs"):
        model(torch.tensor(IDS), ablation=Ablation(force=((layer, shared),)))


# --- opening a directory ----------------------------------------------------------------------------

def test_unsupported_moe_types_and_pickled_weights_are_refused(tmp_path, saved):
    import transformers

    from hf_zoo import tiny_moe

    other = tmp_path / "llama4"  # its experts take pre-scaled tokens, not (indices, weights): without its record
    tiny_moe("llama4_text", transformers.Llama4TextConfig, 256).save_pretrained(other)  # (routes read at the
    generic = dataclasses.replace(quirks.GENERIC, model_type="llama4_text")  # router) it is refused, saying so
    with mock.patch.dict(quirks.QUIRKS, {"llama4_text": generic}), \
            pytest.raises(CheckpointError, match=r"cannot follow: .*without the top-k indices and weights") as e:
        load_checkpoint(other)
    assert "\n" not in str(e.value)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no_such_moe", "num_experts": 8}))
    (unknown / "model.safetensors").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="'no_such_moe' is not a causal language model") as e:
        load_checkpoint(unknown)
    assert len(str(e.value)) < 300  # not transformers' list of every type it knows
    m, path = saved("mixtral")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((path / "config.json").read_text())
    marker = tmp_path / "unpickled"

    class Boom:  # unpickling this writes the marker: the loader must never get that far
        def __reduce__(self):
            return (Path.write_text, (marker, "ran"))
    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(CheckpointError, match="pickle-based weights .* refused"):
        load_checkpoint(pickled)
    assert not marker.exists()


def test_a_directory_s_own_code_never_runs(tmp_path, saved):
    """config.json naming code in the directory (auto_map): transformers is never allowed to run it,
    and nothing asks on stdin whether it may."""
    m, path = saved("mixtral")
    d = tmp_path / "remote"
    d.mkdir()
    for f in path.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    marker = tmp_path / "ran"
    (d / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    cfg = json.loads((d / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.Cfg", "AutoModelForCausalLM": "evil.Model"}
    (d / "config.json").write_text(json.dumps(cfg))
    try:
        model, _ = load_checkpoint(d)
    except CheckpointError as e:
        assert "\n" not in str(e)
    else:
        assert model.config.label == "mixtral"
    assert not marker.exists()


def test_the_catalog_lists_an_hf_directory(saved):
    from routescope.analysis.runs.catalog import describe

    m, path = saved("olmoe")
    info = describe(path)
    assert info.problem is None and info.family == "olmoe" and info.has_tokenizer
    assert info.params == sum(p.numel() for p in m.parameters())


# --- views, export, app -------------------------------------------------------------------------------

def test_views_and_export_rows_match_the_routers_outputs(saved, tmp_path):
    from routescope.analysis.runs.session import RunSettings, run_prompt
    from routescope.cli.main import main

    m, path = saved("mixtral")
    model, tok = load_checkpoint(path)
    prompt = "Once upon a time there was a tiny router"
    ids = tok.encode(prompt).ids
    own = router_outputs(m, [ids])
    out = tmp_path / "routes.csv"
    assert main(["export", str(path), "--prompt", prompt, "--out", str(out), "--quiet"]) == 0
    df = read_csv(out)
    assert set(df[C.FAMILY]) == {"mixtral"}
    for layer, (_, weights, indices) in own.items():
        rows = df[(df[C.LAYER] == layer) & (df[C.KIND] == "weight")].sort_values([C.POSITION, C.OPTION])
        got = rows.groupby(C.POSITION)[C.OPTION].apply(sorted).tolist()
        assert got == [sorted(r) for r in indices.tolist()]
    run = run_prompt(model, tok, prompt, settings=RunSettings(max_new_tokens=4))
    assert list(run.views) == ["topk_routes", "topk_utilisation", "topk_balance", "topk_coselection", "router_entropy"]
    u = run.views["topk_utilisation"].frame
    tr = run.generation.trace
    for layer in model.routing_layers():  # utilisation by a plain count over every token of the run
        counts = np.zeros(4, dtype=int)
        for row in tr[f"{layer}.indices"].reshape(-1, 2).tolist():
            for e in row:
                counts[e] += 1
        assert u[u[C.LAYER] == layer].sort_values(C.OPTION)[C.COUNT].tolist() == counts.tolist()


def test_attribution_on_an_hf_model(saved):
    """Token attribution (integrated gradients) is complete up to captum's delta, and dropping an
    expert (path attribution by exact ablation) changes the target's log-prob by what a direct
    forward with that expert dropped gives."""
    from routescope.analysis.runs.attribution import PathAttribution, TokenAttribution

    _, path = saved("qwen3_moe")
    model, _ = load_checkpoint(path)
    t = len(IDS[0]) - 1
    res = TokenAttribution(model).attribute(IDS[0], t, 5, n_steps=32)
    assert res.attributions.shape == (len(IDS[0]),)
    gap = res.target_log_prob - res.baseline_log_prob
    assert abs(gap) > 10 * abs(res.convergence_delta)  # completeness: the attributions account for the gap
    assert float(res.attributions.sum()) == pytest.approx(gap, rel=0.1)
    df = PathAttribution(model).attribute(IDS[0], target_position=t, target_token=5, method="ablation")
    layer = list(model.routing_layers())[0]

    def log_prob(ablation=None):
        with torch.no_grad():
            return float(torch.log_softmax(model(torch.tensor(IDS), ablation=ablation).logits[0, t], -1)[5])
    row = df[(df[C.LAYER] == layer) & (df[C.OPTION] == 2)]
    want = log_prob() - log_prob(Ablation(drop=((layer, 2),)))
    assert float(row[C.CONTRIBUTION].iloc[0]) == pytest.approx(want, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_batched_exact_ablation_equals_one_forward_per_ablation(saved, scope):
    """Exact ablation with several ablations per forward (rows of one call carry different drops)
    gives each option's contribution as one forward per ablation does, in fewer forwards, and its
    progress counts ablations, one report per forward."""
    from routescope.analysis.runs.attribution import PathAttribution

    _, path = saved("olmoe")
    model, _ = load_checkpoint(path)
    t = len(IDS[0]) - 1
    calls, seen = [], []
    hook = model.register_forward_pre_hook(lambda mod, args: calls.append(args[0].shape[0]))
    try:
        one = PathAttribution(model).attribute(IDS[0], t, 5, scope=scope, ablations_per_forward=1)
        n_one, calls[:] = len(calls), []
        many = PathAttribution(model).attribute(IDS[0], t, 5, scope=scope, ablations_per_forward=3,
                                                progress=lambda done, total: seen.append((done, total)))
    finally:
        hook.remove()
    n = len(one)
    assert n_one == n + 1 and len(calls) == 1 + -(-n // 3) and max(calls) == 3  # the full run, then batches
    assert seen == [(min(i + 3, n), n) for i in range(0, n, 3)]
    pd.testing.assert_frame_equal(many.drop(columns=[C.CONTRIBUTION, C.REFERENCE_LOG_PROB]),
                                  one.drop(columns=[C.CONTRIBUTION, C.REFERENCE_LOG_PROB]))
    scale = float(one[C.FULL_LOG_PROB].abs().max())  # float32 rounding of log-probs of this size
    np.testing.assert_allclose(many[C.REFERENCE_LOG_PROB], one[C.REFERENCE_LOG_PROB], rtol=0, atol=1e-5 * scale)
    assert (one[C.CONTRIBUTION].abs() > 1e-3).any()  # some expert matters: the comparison has content


def test_the_app_draws_routes_and_the_ablation_diff_of_an_hf_model(saved, monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from routescope.app import state as K

    _, path = saved("mixtral")
    st.cache_resource.clear()
    monkeypatch.setenv("ROUTESCOPE_CHECKPOINTS", str(Path(path).parent))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app" / "main.py"), default_timeout=120)
    at.run()
    at.selectbox(key=K.CHECKPOINT).set_value(str(path)).run()
    at.segmented_control(key=K.VIEW).set_value("Routing").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    routes = next(f for f in figs if "Top-k routing" in json.dumps(f["layout"].get("annotations", []))
                  or "Top-k routing" in str(f["layout"].get("title", {}).get("text", "")))
    assert "model.layers.0.mlp.gate" in json.dumps(routes["data"])
    at.checkbox(key=K.drop_global_key(str(path), 1)).check().run()
    at.segmented_control(key=K.VIEW).set_value("Ablation diff").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]


def test_one_instrumented_model_serves_concurrent_calls_with_their_own_ablations(saved):
    """Hooks keep nothing per call on a module: two threads calling one model at once, one with an
    expert dropped and tracing, one plain, each get exactly what they get alone."""
    import threading

    _, path = saved("deepseek_v3")
    model, _ = load_checkpoint(path)
    layer = list(model.routing_layers())[0]
    ab = Ablation(drop=((layer, 0),))
    x = torch.tensor(IDS)
    with torch.no_grad():
        alone_plain = model(x).logits
        with tracing([f"{layer}.indices"]) as tr:
            alone_ablated = model(x, ablation=ab).logits
    got, errors = {"plain": [], "ablated": []}, []

    def work(kind: str) -> None:
        try:
            for _ in range(15):
                with torch.no_grad():
                    if kind == "plain":
                        got[kind].append(torch.equal(model(x).logits, alone_plain))
                    else:
                        with tracing([f"{layer}.indices"]) as t:
                            same = torch.equal(model(x, ablation=ab).logits, alone_ablated)
                        got[kind].append(same and torch.equal(t[f"{layer}.indices"], tr[f"{layer}.indices"]))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in ("plain", "ablated", "plain", "ablated")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(got["plain"]) and all(got["ablated"]) and len(got["plain"]) == 30
    assert not (tr[f"{layer}.indices"] == 0).any()


def test_no_hook_sits_on_a_module_and_a_deep_copy_routes_by_its_own_weights(saved):
    """RouteScope wraps forwards instead of hooking modules (a hook sends every call of its module down
    torch's slow path): no module carries a hook. A wrapper calls the module it belongs to, so a deep
    copy routes, records and ablates by the copy's weights and leaves the original as it was."""
    import copy

    _, path = saved("qwen2_moe")  # a shared expert and its gate: every kind of wrapper
    model, _ = load_checkpoint(path)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.hf.modules())
    layer = list(model.routing_layers())[0]
    sites = [f"{layer}.logits", f"{layer}.indices"]
    x = torch.tensor(IDS)
    with torch.no_grad():
        before = model(x).logits
        twin = copy.deepcopy(model)
        twin.hf.get_submodule(layer).weight.neg_()  # the copy's router only
        with tracing(sites) as a:
            model(x)
        with tracing(sites) as b:
            twin(x)
        with tracing(sites) as dropped:
            twin(x, ablation=Ablation(drop=((layer, 0),)))
        after = model(x).logits
    assert torch.equal(b[f"{layer}.logits"], -a[f"{layer}.logits"])  # the first routing layer's input is shared
    assert not torch.equal(b[f"{layer}.indices"], a[f"{layer}.indices"])
    assert not (dropped[f"{layer}.indices"] == 0).any() and (b[f"{layer}.indices"] == 0).any()
    assert torch.equal(before, after)


def test_without_transformers_an_hf_directory_is_refused_in_one_line(saved, monkeypatch):
    """The README's set-up installs the hf extra; without it the shipped HF examples say what to install."""
    import sys

    _, path = saved("mixtral")
    for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(CheckpointError, match=r"needs the hf extra: pip install .*'\.\[hf\]'"):
        load_checkpoint(path)


def test_auto_loads_a_bfloat16_directory_as_bfloat16_as_transformers_does(saved, tmp_path):
    """dtype "auto" (the default) is the dtype the directory stores: transformers' own auto load
    agrees, and the logits are transformers' own at that dtype."""
    from transformers import AutoModelForCausalLM

    m, _ = saved("olmoe")
    path = tmp_path / "bf16"
    m.to(torch.bfloat16).save_pretrained(path)
    m.float()  # the shared fixture model stays float32
    model, _ = load_checkpoint(path)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype="auto").eval()
    assert next(model.parameters()).dtype == next(ref.parameters()).dtype == torch.bfloat16
    ids = torch.tensor([[3, 17, 5, 9, 30, 2]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    assert next(load_checkpoint(path, dtype="float32")[0].parameters()).dtype == torch.float32  # as asked


def test_a_model_that_cannot_fit_is_refused_before_any_weight_is_read(tmp_path):
    """An OLMoE-shaped config far past any machine's memory (built on the meta device only, never
    allocated): one line with both figures and the way out, before transformers reads the weights
    (the directory's one weight file holds none of the model's tensors)."""
    import transformers as T

    T.OlmoeConfig(vocab_size=50304, hidden_size=16384, intermediate_size=8192, num_hidden_layers=64,
                  num_attention_heads=64, num_key_value_heads=64, num_experts=256,
                  num_experts_per_tok=8, dtype="bfloat16").save_pretrained(tmp_path)
    from safetensors.torch import save_file

    save_file({"unrelated": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"needs about [\d.]+ GiB as bfloat16 \([\d.]+B parameters\) but [\d.]+ "
                                              r"GiB is available on cpu .*use a machine with more memory$"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"as float32 .*or load it as bfloat16 \(--dtype bfloat16\)$"):
        load_checkpoint(tmp_path, dtype="float32")


def test_a_tokenizer_far_smaller_than_the_vocabulary_gets_one_warning_line(saved, tmp_path, caplog):
    """Ids past a tokenizer decode to nothing: a transformers directory whose tokenizer covers less
    than 90% of its vocabulary loads, with one warning line naming both sizes."""
    import transformers as T

    from hf_models import hf_config

    m, path = saved("mixtral")
    n = json.loads((path / "tokenizer.json").read_text())
    vocab = len(n["model"]["vocab"]) + len(n.get("added_tokens", []))
    big = tmp_path / "big"
    cfg = hf_config("mixtral", 2 * vocab)
    torch.manual_seed(0)
    T.MixtralForCausalLM(cfg).save_pretrained(big)
    (big / "tokenizer.json").write_text((path / "tokenizer.json").read_text())
    with caplog.at_level("WARNING"):
        load_checkpoint(path)
        assert not caplog.records  # its own tokenizer: no word
        load_checkpoint(big)
    (rec,) = caplog.records
    assert f"tokens for a model of {2 * vocab} ids (50%)" in rec.getMessage() and "\n" not in rec.getMessage()
