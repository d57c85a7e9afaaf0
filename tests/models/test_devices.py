"""Devices and dtypes: resolution of --device, models placed on a device (meta here; CUDA/MPS when the
machine has one), traces back on the CPU in float32, and bfloat16 within its stated tolerance."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from routescope.core_models import devices, tracing
from routescope.core_models.base import LMOutput
from routescope.core_models.checkpoint import load_checkpoint, save_checkpoint
from routescope.core_models.generate import generate
from tiny_models import TINY, tiny_model
from tolerances import FORWARD_EPS, assert_close_to_scale

ROOT = Path(__file__).resolve().parents[2]
IDS = [[3, 14, 15, 92, 65, 35, 89, 79]]
ACCELERATORS = [
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")),
    pytest.param("mps", marks=pytest.mark.skipif(not devices.mps_available(), reason="no Apple MPS device here")),
]


@pytest.fixture
def machine(monkeypatch):
    """machine(cuda=..., mps=..., n_cuda=...): what devices.resolve_device believes this machine has."""
    def set_(cuda: bool = False, mps: bool = False, n_cuda: int = 1) -> None:
        monkeypatch.setattr(devices, "cuda_available", lambda: cuda)
        monkeypatch.setattr(devices, "mps_available", lambda: mps)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n_cuda if cuda else 0)
    return set_


def saved(tmp_path: Path, key: str) -> Path:
    return save_checkpoint(tiny_model(key), tmp_path / key, dtype=torch.float32)


# --- resolution -------------------------------------------------------------------------------

@pytest.mark.parametrize("cuda, mps, want", [(True, True, "cuda"), (True, False, "cuda"), (False, True, "mps"),
                                             (False, False, "cpu")])
def test_auto_picks_cuda_then_mps_then_cpu(machine, cuda, mps, want):
    machine(cuda=cuda, mps=mps)
    assert devices.resolve_device("auto") == torch.device(want)
    assert devices.resolve_device(None) == torch.device(want)


def test_named_devices_resolve_when_present(machine):
    machine(cuda=True, mps=True, n_cuda=2)
    assert devices.resolve_device("cuda") == torch.device("cuda")
    assert devices.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert devices.resolve_device(" MPS ") == torch.device("mps")
    assert devices.resolve_device("cpu") == torch.device("cpu")
    assert devices.resolve_device("meta") == torch.device("meta")


@pytest.mark.parametrize("name, words", [("cuda", ["'cuda'", "not available", "--device cpu"]),
                                         ("cuda:0", ["'cuda:0'", "not available"]),
                                         ("mps", ["'mps'", "not available"]),
                                         ("tpu", ["'tpu'", "auto, cpu, cuda, mps"]),
                                         ("xla", ["'xla'", "auto, cpu, cuda, mps"])])
def test_a_device_this_machine_lacks_is_refused_in_one_line(machine, name, words):
    machine(cuda=False, mps=False)
    with pytest.raises(ValueError) as e:
        devices.resolve_device(name)
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_cuda_index_past_the_devices_is_refused(machine):
    machine(cuda=True, n_cuda=1)
    with pytest.raises(ValueError, match="has 1 CUDA device"):
        devices.resolve_device("cuda:3")


def test_dtypes_by_name_and_refusals():
    assert devices.resolve_dtype("bfloat16") is torch.bfloat16
    assert devices.resolve_dtype("torch.float16") is torch.float16
    assert devices.resolve_dtype(None) is None and devices.resolve_dtype("auto") is None  # as stored
    assert devices.resolve_dtype(torch.float32) is torch.float32
    for bad in ("float64", "int8", torch.float64):
        with pytest.raises(ValueError, match="expected one of auto, float32, bfloat16, float16"):
            devices.resolve_dtype(bad)


def test_auto_runs_what_the_checkpoint_stores():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert devices.run_dtype(None, torch.bfloat16, cpu) is torch.bfloat16
    assert devices.run_dtype(None, torch.float16, cpu) is torch.float32  # float16 on the CPU: float32
    assert devices.run_dtype(None, torch.float16, cuda) is torch.float16
    assert devices.run_dtype(None, None, cpu) is torch.float32
    assert devices.run_dtype(torch.float32, torch.bfloat16, cpu) is torch.float32  # asked for: as asked


def test_the_cli_refuses_a_missing_device_before_loading(machine, capsys, tmp_path):
    from routescope.cli.main import main

    machine(cuda=False)
    assert main(["generate", str(tmp_path / "no-checkpoint-needed"), "hi", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("routescope generate: device 'cuda': not available"), err


# --- placement --------------------------------------------------------------------------------

def _tied_groups(model) -> set[frozenset[str]]:
    groups: dict[int, set[str]] = {}
    for k, v in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(v), set()).add(k)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


@pytest.mark.parametrize("key", ["gumbel_v2", "wiola", "llama"])
def test_place_casts_parameters_keeps_tables_float32_and_ties(key):
    model = tiny_model(key)
    tables = {k: b.clone() for k, b in model.named_buffers()}
    ties = _tied_groups(model)
    devices.place(model, "cpu", torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    for k, b in model.named_buffers():  # RoPE / SRPE tables: not rounded to bfloat16
        assert b.dtype == torch.float32 and torch.equal(b, tables[k]), k
    assert _tied_groups(model) == ties


@pytest.mark.parametrize("key", sorted(TINY))
def test_load_on_meta_keeps_shapes_dtypes_and_ties(tmp_path, key):
    ck = saved(tmp_path, key)
    cpu, _ = load_checkpoint(ck)
    meta, _ = load_checkpoint(ck, device="meta", dtype="bfloat16")
    assert meta.device == torch.device("meta")
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in meta.parameters())
    assert all(b.is_meta and b.dtype == torch.float32 for b in meta.buffers())
    assert {k: v.shape for k, v in meta.state_dict().items()} == {k: v.shape for k, v in cpu.state_dict().items()}
    assert _tied_groups(meta) == _tied_groups(cpu)


@pytest.mark.parametrize("key", sorted(set(TINY) - {"moep", "moep_swiglu"}))
def test_a_meta_model_takes_cpu_ids_and_traces_every_site_with_its_cpu_shape(tmp_path, key):
    """Ids built on the CPU go to the model's device inside forward; the trace of a meta model holds
    meta tensors (shapes only) of every site the CPU run records, reduced floats widened to float32.
    (MoEP dispatches tokens to experts by data-dependent indices, which the meta device cannot run.)"""
    ck = saved(tmp_path, key)
    cpu, _ = load_checkpoint(ck)
    meta, _ = load_checkpoint(ck, device="meta", dtype="bfloat16")
    with torch.inference_mode(), tracing() as want:
        cpu(torch.tensor(IDS))
    with torch.inference_mode(), tracing() as got:
        out = meta(torch.tensor(IDS))
    assert out.logits.is_meta and out.logits.shape == (1, len(IDS[0]), cpu.vocab_size)
    assert got.names() == want.names()
    for name in want.names():
        g, w = got[name], want[name]
        assert g.is_meta and g.shape == w.shape, name
        assert g.dtype == (torch.float32 if w.is_floating_point() else w.dtype), name


def test_generate_builds_its_inputs_on_the_models_device(tmp_path, monkeypatch):
    """Every forward generate makes receives ids already on model.device (meta here), not on the CPU."""
    meta, _ = load_checkpoint(saved(tmp_path, "gumbel_v2"), device="meta")
    seen = []

    def forward(idx, **kw):
        seen.append(idx.device)
        logits = torch.zeros(idx.shape[0], idx.shape[1], meta.vocab_size)
        logits[..., 7] = 1.0  # greedy picks token 7
        return LMOutput(logits=logits)

    monkeypatch.setattr(meta, "forward", forward)
    gen = generate(meta, IDS[0], max_new_tokens=3)
    assert gen.new_ids == [7, 7, 7] and seen and set(seen) == {torch.device("meta")}


# --- traces from reduced precision ----------------------------------------------------------------

@pytest.mark.parametrize("key", ["gumbel_v2", "moep", "wiola", "pagmlp", "pgpt"])
def test_a_bfloat16_models_trace_is_its_values_widened_to_float32_on_the_cpu(key):
    """Each record equals the tensor the site saw (captured by an edit, before recording), widened
    exactly to float32; integer records keep their dtype."""
    model = devices.place(tiny_model(key), "cpu", torch.bfloat16)
    seen: dict[str, list[torch.Tensor]] = {}

    def keep(name):
        def edit(x):
            seen.setdefault(name, []).append(x.detach().clone())
            return x
        return edit

    with torch.inference_mode(), tracing(edits={n: keep(n) for n in model.site_names()}) as tr:
        model(torch.tensor(IDS))
    assert tr.names() and set(tr.names()) == set(seen)
    dtypes = set()
    for name in tr.names():
        for rec, raw in zip(tr.steps(name), seen[name], strict=True):
            dtypes.add(raw.dtype)
            assert rec.device.type == "cpu", name
            want = raw.float() if raw.is_floating_point() else raw
            assert rec.dtype == want.dtype and torch.equal(rec, want), name
    assert torch.bfloat16 in dtypes  # the model's activations were bfloat16, and came back float32


@pytest.mark.parametrize("key", ["gumbel_v2", "moep", "wiola", "pagmlp", "pgpt"])
def test_integrated_gradients_run_in_bfloat16_close_to_float32(key):
    """The blended embedding stays in the model's dtype (a float32 blend broke every bfloat16 layer);
    the attributions are those of float32 within BF16_TOL of their scale on these models."""
    from routescope.analysis.runs.attribution import TokenAttribution

    ids = IDS[0]
    want = TokenAttribution(tiny_model(key)).attribute(ids, n_steps=16)
    got = TokenAttribution(devices.place(tiny_model(key), "cpu", torch.bfloat16)).attribute(
        ids, n_steps=16, target_token=want.target_token)
    assert got.attributions.dtype == torch.float32 and got.attributions.device.type == "cpu"
    scale = float(want.attributions.abs().max())
    assert float((got.attributions - want.attributions).abs().max()) <= devices.BF16_TOL * scale


# --- bfloat16 against float32 on the shipped checkpoints ------------------------------------------

def _shipped() -> list[str]:
    root = ROOT / "checkpoints"
    return sorted(d.name for d in root.iterdir() if (d / "config.json").is_file()) if root.is_dir() else []


def flipped_decision_margins(ref_rows, low_rows) -> list[float]:
    """For each decision (prompt, position, layer, kind) whose selected options differ between the two
    exports: the float32 margin between the weakest selected and the strongest unselected option.
    Kinds whose rows exist only for selected options (MoEP top-k weights) are judged by their prob rows."""
    key = ["prompt_id", "position", "layer", "site", "kind", "option"]
    both = ref_rows.merge(low_rows, on=key, how="outer", suffixes=("_32", "_16"))
    both = both[both["selected_32"].notna() | both["selected_16"].notna()]
    margins = []
    for _, d in both.groupby(["prompt_id", "position", "layer", "kind"]):
        s32, s16 = d["selected_32"].fillna(False).astype(bool), d["selected_16"].fillna(False).astype(bool)
        if (s32 != s16).any() and s32.any() and (~s32 & d["value_32"].notna()).any():
            margins.append(float(d["value_32"][s32].min() - d["value_32"][~s32].max()))
    return margins


@pytest.mark.slow
@pytest.mark.parametrize("name", _shipped())
def test_bfloat16_is_within_the_stated_tolerance_of_float32(name):
    """README "Devices": with bfloat16 parameters, routing values and logits stay within
    devices.BF16_TOL of their scale (1 for probabilities/weights/cosines/shares; the largest |logit|),
    and a routing decision differs from float32 only where float32 had a near tie (margin <=
    BF16_TOL). Top-k routers (MoEP, the Hugging Face MoE models) are excepted for values and logits: a
    flipped near-tie expert choice moves everything downstream of it; so are the logits of a Gumbel
    prompt whose hard route flipped."""
    import pandas as pd

    from routescope.analysis.export import batch as B
    from routescope.analysis.runs.domain import iter_probes
    from routescope.analysis.export.run_table import TokenText

    ref, tok = load_checkpoint(ROOT / "checkpoints" / name)
    low, _ = load_checkpoint(ROOT / "checkpoints" / name, dtype="bfloat16")
    topk = any(n.endswith(".indices") for n in ref.site_shapes())  # top-k routers record their picks
    # Gumbel PaPaformer routes each token by a hard argmax: where bfloat16 flips a near-tie route,
    # that prompt's logits move with it (the flip itself is judged by the near-tie rule below)
    choices = [n for n in ref.site_shapes() if n.endswith("router.choice")]
    prompts = [(p.prompt_id, p.prompt) for p in iter_probes()]
    encoded = B.encode_prompts(tok, prompts, ref.context, B.ExportJob())
    with torch.inference_mode():
        for pid, ids in encoded:
            with tracing(choices) as route32:
                want = ref(torch.tensor([ids])).logits.float()
            with tracing(choices) as route16:
                got = low(torch.tensor([ids])).logits.float()
            flipped = any(not torch.equal(route32[n], route16[n]) for n in choices)
            assert topk or flipped or float((got - want).abs().max() / want.abs().max()) <= devices.BF16_TOL, pid
    if not ref.routing_layers():
        return

    def rows(model):
        job = B.ExportJob()
        return pd.concat([df for _, dfs in B.export_batches(model, encoded, TokenText(tok), job.ablation(model), job,
                                                            name) for df in dfs], ignore_index=True)

    a, b = rows(ref), rows(low)
    key = ["prompt_id", "position", "layer", "site", "kind", "option"]
    paired = a.merge(b, on=key, suffixes=("_32", "_16"))
    scale = paired.groupby("kind")["value_32"].transform(lambda v: v.abs().max()).replace(0, 1.0)
    assert topk or float(((paired["value_16"] - paired["value_32"]).abs() / scale).max()) <= devices.BF16_TOL
    assert all(m <= devices.BF16_TOL for m in flipped_decision_margins(a, b))


# --- on a real accelerator (skipped without one) ----------------------------------------------------

@pytest.mark.parametrize("device", ACCELERATORS)
@pytest.mark.parametrize("key", ["gumbel_v2", "moep", "wiola", "pagmlp"])
def test_on_an_accelerator_traces_come_back_on_the_cpu_and_match(tmp_path, device, key):
    ck = saved(tmp_path, key)
    cpu, _ = load_checkpoint(ck)
    acc, _ = load_checkpoint(ck, device=device)
    assert acc.device.type == device
    with torch.inference_mode(), tracing() as want:
        ref = cpu(torch.tensor(IDS)).logits
    with torch.inference_mode(), tracing() as got:
        out = acc(torch.tensor(IDS)).logits  # CPU ids: forward moves them
    assert out.device.type == device
    assert_close_to_scale(out.cpu(), ref, FORWARD_EPS, msg="logits")
    for name in want.names():
        assert got[name].device.type == "cpu", name
        if got[name].is_floating_point():
            assert_close_to_scale(got[name], want[name], FORWARD_EPS, msg=name)


@pytest.mark.parametrize("device", ACCELERATORS)
def test_on_an_accelerator_sampled_routes_and_generation_match_the_cpu(tmp_path, device):
    ck = saved(tmp_path, "gumbel_v2")
    cpu, _ = load_checkpoint(ck)
    acc, _ = load_checkpoint(ck, device=device)
    a = generate(cpu, IDS[0], max_new_tokens=4, routing="sampled", routing_seed=3, trace_sites=None,
                 keep_prompt_logits=True)
    b = generate(acc, IDS[0], max_new_tokens=4, routing="sampled", routing_seed=3, trace_sites=None,
                 keep_prompt_logits=True)
    assert b.prompt_logits.device.type == "cpu"
    assert_close_to_scale(b.prompt_logits, a.prompt_logits, FORWARD_EPS, msg="prompt logits")
    choice = [n for n in a.trace.names() if n.endswith("router.choice")]
    assert choice and all(torch.equal(a.trace[n], b.trace[n]) for n in choice)  # Gumbel noise is drawn on the CPU


def test_a_routescope_checkpoint_that_does_not_fit_is_refused_before_it_is_read(monkeypatch):
    """With less memory free than the model needs (the machine's figure replaced by a small one),
    a shipped checkpoint is refused in one line from its closed-form count, before a module is built
    or a weight read; with enough it loads. (tests/analysis/test_hf.py refuses a config that fits on
    no machine, built on the meta device only.)"""
    from pathlib import Path

    from routescope.core_models import checkpoint as ck
    from routescope.core_models.registry import param_count

    path = Path(__file__).resolve().parents[2] / "checkpoints" / "pgpt"
    n = param_count(ck.read_model_config(path))
    need = n * 4 + devices.HEADROOM  # stored float16, run as float32 on the CPU
    monkeypatch.setattr(devices, "available_memory", lambda device: (need - 1, "a test's figure"))
    monkeypatch.setattr(ck, "shape_model", lambda *a: pytest.fail("a module was built"))
    with pytest.raises(ck.CheckpointError, match=rf"needs about [\d.]+ GiB as float32 \({n / 1e9:.2f}B parameters\) "
                                                 r"but [\d.]+ GiB is available on cpu \(a test's figure\)"):
        ck.load_checkpoint(path)
    monkeypatch.undo()
    monkeypatch.setattr(devices, "available_memory", lambda device: (need, "a test's figure"))
    assert ck.load_checkpoint(path)[0].num_params() == n
