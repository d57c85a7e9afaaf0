"""Parity with the papers' own code (fixtures in ../shared/fixtures/reference) and importer checks."""
import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from routescope.core_models import Ablation, tracing
from routescope.core_models.checkpoint import load_checkpoint
from routescope.core_models.generate import generate
from routescope.core_models.importers import ImportError_, convert, import_checkpoint

from reference_forward import papaformer_forward, papaformer_keys, pgpt_forward, pgpt_keys
from tolerances import EPS32, assert_close_to_scale

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "reference"
CASES = {"papaformer_share_linear": "papaformer-share-linear", "papaformer_gumbel_v1": "papaformer-gumbel-v1",
         "papaformer_gumbel_v2": "papaformer-gumbel-v2", "pgpt": "pgpt"}
# The parity bound max |dlogits| <= 1e-5, as a fraction of the reference's largest |value|: the
# reference was computed with another machine's kernels, whose rounding is a few eps of the values'
# scale (measured: 4.5 eps of max |logits| = 2.3, i.e. 1.2e-6). 1e-5 of the scale is 84 eps.
PARITY_RTOL = 1e-5


def assert_parity(got: torch.Tensor, ref: torch.Tensor, what: str = "logits") -> None:
    assert_close_to_scale(got, ref, PARITY_RTOL / EPS32, msg=what)

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"parity fixtures not found at {FIXTURES}")


def _site_for(io_name: str) -> str | None:
    """RouteScope site holding the fixture's intermediate tensor."""
    parts = io_name.split(".")
    if io_name.startswith("parallel."):
        i, what = parts[1], ".".join(parts[2:])
        return {"combined": f"parallel.{i}.combined", "moe_out": f"parallel.{i}.routed", "out": f"parallel.{i}.out",
                "route": f"parallel.{i}.router.choice", "router_logits": f"parallel.{i}.router.logits",
                "path.0": f"parallel.{i}.paths.0.out", "path.1": f"parallel.{i}.paths.1.out"}.get(what)
    return {"path.0": "paths.0.out", "path.1": "paths.1.out", "mixed": "mixed"}.get(io_name)


def _load(name):
    cfg = json.loads((FIXTURES / name / "config.json").read_text())
    return cfg, convert(CASES[name], load_file(FIXTURES / name / "weights.safetensors"), cfg)


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_and_intermediates_match_reference(name):
    _, model = _load(name)
    io = load_file(FIXTURES / name / "io.safetensors")
    with tracing() as tr, torch.no_grad():
        logits = model(io["input_ids"]).logits
    assert_parity(logits, io["logits"])
    compared = 0
    for key, ref in io.items():
        site = _site_for(key)
        if site is None:
            continue
        if ref.dtype == torch.int64:  # Gumbel routes: identical
            assert torch.equal(tr[site], ref), key
        else:
            assert_parity(tr[site], ref, key)
        compared += 1
    assert compared >= 3


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if n.startswith("papaformer")])
def test_padded_input_matches_reference(name):
    _, model = _load(name)
    io = load_file(FIXTURES / name / "io_padded.safetensors")
    with tracing() as tr, torch.no_grad():
        logits = model(io["input_ids"]).logits
    assert_parity(logits, io["logits"])
    for key in io:
        if key.endswith(".route"):
            assert torch.equal(tr[_site_for(key)], io[key]), key


def test_pgpt_dropping_a_path_gives_the_single_path_logits():
    _, model = _load("pgpt")
    io = load_file(FIXTURES / "pgpt" / "io.safetensors")
    for keep in (0, 1):
        with torch.no_grad():
            logits = model(io["input_ids"], ablation=Ablation(drop=(("paths", 1 - keep),))).logits
        assert_parity(logits, io[f"logits_path{keep}_only"], f"path {keep} alone")
    with tracing(["mixer.weights"]) as tr:
        model(io["input_ids"])
    assert math.isclose(float(tr["mixer.weights"][0]), float(io["mix_weight"][0]), rel_tol=4 * EPS32)


def test_pgpt1_reference_mode_is_the_authors_evaluation():
    """The authors' pgpt-1 (models.py forward(train=False), Table 4): the path with sigmoid(wt) >= 0.5
    (else the other) straight to lm_head, no ln_f. Expected: the fixture's own recorded path output
    times the stored lm_head weight."""
    cfg, model = _load("pgpt")
    io = load_file(FIXTURES / "pgpt" / "io.safetensors")
    sd = load_file(FIXTURES / "pgpt" / "weights.safetensors")
    w = float(torch.sigmoid(sd["transformer.wt"]))
    assert math.isclose(w, float(io["mix_weight"][0]), rel_tol=4 * EPS32)
    chosen = 0 if w >= 0.5 else 1
    expect = io[f"path.{chosen}"].double() @ sd["lm_head.weight"].double().T  # (B, T, V)
    mode = Ablation(modes=("pgpt1-reference",))
    with torch.no_grad(), tracing(["mixer.weights"]) as tr:
        logits = model(io["input_ids"], ablation=mode).logits
    assert_parity(logits, expect.float(), "authors' pgpt-1")
    assert tr["mixer.weights"].tolist() == [1.0 if j == chosen else 0.0 for j in range(2)]  # one path, weight 1
    with torch.no_grad():  # the default pgpt-1 applies ln_f: it is another model
        default = model(io["input_ids"], ablation=Ablation(drop=(("paths", 1 - chosen),))).logits
    assert (default - logits).abs().max() > 1e-2 * logits.abs().max()
    assert_parity(default, io[f"logits_path{chosen}_only"], "default pgpt-1")
    with torch.no_grad():  # dropping the higher-weight path leaves the mode the other one
        other = model(io["input_ids"], ablation=Ablation(drop=(("paths", chosen),), modes=mode.modes)).logits
    assert_parity(other, (io[f"path.{1 - chosen}"].double() @ sd["lm_head.weight"].double().T).float(), "other path")


@pytest.mark.parametrize("name", sorted(CASES))
def test_independent_forward_agrees_with_fixture(name):
    """The test-side forward used below for other configs is itself right on the fixtures."""
    cfg, _ = _load(name)
    sd = load_file(FIXTURES / name / "weights.safetensors")
    io = load_file(FIXTURES / name / "io.safetensors")
    if name == "pgpt":
        logits = pgpt_forward(sd, cfg["gpt_config"], io["input_ids"])
    else:
        logits, _ = papaformer_forward(sd, cfg["args"], cfg["args_paraller"], CASES[name].split("-", 1)[1]
                                       .replace("-", "_"), io["input_ids"])
    assert_parity(logits, io["logits"])


# second configurations: other widths, depths, vocabularies, pad ids and head counts
SECOND_PAPA = dict(args=dict(vocab_size=300, dim=48, n_layers=2, n_heads=3, head_dim=16, max_seq_len=40, pad_id=7,
                             attention_type="MultiH", ff_type="SwiGLU", norm="RMS", device="cpu"),
                   args_paraller=dict(dim=24, n_heads=2, head_dim=12, max_seq_len=40, n_parallel_blocks=2,
                                      attention_type="MultiH", ff_type="SwiGLU", norm="RMS", device="cpu"))


def _random_state(keys, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: (1.0 if k.endswith(("norm.weight", "norm_1.weight", "norm_2.weight", "beta")) else 0.0)
            + 0.1 * torch.randn(shape, generator=g) for k, shape in keys.items()}


@pytest.mark.parametrize("source", ["papaformer-share-linear", "papaformer-gumbel-v1", "papaformer-gumbel-v2"])
@pytest.mark.parametrize("n_paths", [2, 3])
def test_second_papaformer_config_converts_and_matches(source, n_paths):
    variant = source.split("-", 1)[1].replace("-", "_")
    if variant != "share_linear" and n_paths != 2:
        with pytest.raises(ImportError_, match="n_parallel_blocks"):
            convert(source, {}, {**SECOND_PAPA, "args_paraller": {**SECOND_PAPA["args_paraller"], "n_parallel_blocks": 3}})
        return
    cfg = {**SECOND_PAPA, "args_paraller": {**SECOND_PAPA["args_paraller"], "n_parallel_blocks": n_paths}}
    sd = _random_state(papaformer_keys(cfg["args"], cfg["args_paraller"], variant), seed=n_paths)
    model = convert(source, sd, cfg)
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    ids[ids == 7] = 8
    ids[1, 9] = 7  # one pad in the middle
    ref, routes = papaformer_forward(sd, cfg["args"], cfg["args_paraller"], variant, ids)
    with tracing() as tr, torch.no_grad():
        got = model(ids).logits
    assert_parity(got, ref)
    for k, r in routes.items():
        assert torch.equal(tr[_site_for(k)], r)


def test_second_pgpt_config_converts_and_matches():
    g = dict(block_size=40, vocab_size=300, n_layer=6, n_head=2, n_embd=32, dropout=0.0, bias=False)
    sd = _random_state(pgpt_keys(g), seed=3)
    model = convert("pgpt", sd, {"gpt_config": g})
    ids = torch.randint(0, 300, (2, 25))
    with torch.no_grad():
        assert_parity(model(ids).logits, pgpt_forward(sd, g, ids))


def test_conversion_lists_unknown_missing_and_misshaped_keys():
    cfg, _ = _load("papaformer_gumbel_v1")
    sd = load_file(FIXTURES / "papaformer_gumbel_v1" / "weights.safetensors")
    del sd["layers.1.MoE.router.bias"]
    sd["layers.9.extra"] = torch.zeros(2)
    sd["norm.weight"] = torch.ones(65)
    with pytest.raises(ImportError_) as e:
        convert("papaformer-gumbel-v1", sd, cfg)
    msg = str(e.value)
    assert "missing reference key layers.1.MoE.router.bias [3]" in msg
    assert "unknown reference key layers.9.extra" in msg
    assert "norm.weight has shape [65], expected [64]" in msg
    with pytest.raises(ImportError_, match="args_paraller"):
        convert("papaformer-gumbel-v1", sd, {"args": cfg["args"]})
    with pytest.raises(ImportError_, match="--from"):
        convert("papaformer-gumbel-v9", sd, cfg)


def test_imported_checkpoint_works_everywhere(tmp_path):
    name = "papaformer_gumbel_v2"
    out = import_checkpoint(CASES[name], FIXTURES / name / "weights.safetensors", FIXTURES / name / "config.json",
                            tmp_path / "imported")
    model, tok = load_checkpoint(out)
    assert tok is None  # no tokenizer given: works on ids
    io = load_file(FIXTURES / name / "io.safetensors")
    assert_parity(model(io["input_ids"]).logits, io["logits"])
    gen = generate(model, io["input_ids"][0, :8].tolist(), max_new_tokens=5,
                   ablation=Ablation.parse(drop=["parallel.0:1"]), trace_sites=None)
    assert len(gen.new_ids) == 5 and "parallel.1.router.choice" in gen.trace


def test_pickle_files_are_refused_unopened(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    cfg = json.loads((FIXTURES / "pgpt" / "config.json").read_text())
    with pytest.raises(ImportError_, match="pickle-based weights are not opened"):
        import_checkpoint("pgpt", tmp_path / "evil.pt", cfg, tmp_path / "out")
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()
    (tmp_path / "w.bin").write_bytes(b"not looked at")
    with pytest.raises(ImportError_, match="pickle-based"):
        import_checkpoint("pgpt", tmp_path / "w.bin", cfg, tmp_path / "out")
