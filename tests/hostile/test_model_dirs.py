"""Hostile model directories (issue 29, item 5): a directory never runs its own code and never has
weights invented for it. Each case is a shipped checkpoint copied with one thing changed, refused
by `routescope generate` in one line, exit 2, naming the directory or file (transformers' load
report reduced to one line), with nothing run and nothing written."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from routescope.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CKS = ROOT / "checkpoints"
pytest.importorskip("transformers")


def copy(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    shutil.copytree(CKS / name, d)
    return d


def edit_weights(d: Path, change) -> None:
    state = load_file(d / "model.safetensors")
    change(state)
    save_file(state, d / "model.safetensors", metadata={"format": "pt"})


def refused(capsys, d: Path, *needles: str) -> str:
    before = sorted(p.name for p in d.parent.rglob("*"))
    code = main(["generate", str(d), "Once upon a time", "--max-new-tokens", "1"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and "Traceback" not in err and err.count("\n") == 1 and err.startswith("routescope generate: ")
    for n in needles:
        assert n in err, err
    assert sorted(p.name for p in d.parent.rglob("*")) == before
    return err


NORM = "model.layers.0.input_layernorm.weight"


def test_a_missing_tensor_is_refused_not_filled_with_random_values(tmp_path, capsys):
    d = copy(tmp_path, "mixtral-tiny")
    edit_weights(d, lambda s: s.pop(NORM))
    refused(capsys, d, "the weights do not match the model: 1 missing (" + NORM + ")")


def test_an_unexpected_tensor_is_refused(tmp_path, capsys):
    d = copy(tmp_path, "mixtral-tiny")
    edit_weights(d, lambda s: s.__setitem__("model.layers.0.extra.weight", torch.zeros(3)))
    refused(capsys, d, "1 unexpected (model.layers.0.extra.weight)")


def test_a_mismatched_tensor_is_refused(tmp_path, capsys):
    d = copy(tmp_path, "mixtral-tiny")
    edit_weights(d, lambda s: s.__setitem__(NORM, torch.ones(s[NORM].shape[0] + 1)))
    refused(capsys, d, f"{d}: the weights do not match the model: 1 mismatched ({NORM})")


@pytest.mark.parametrize("name", ["mixtral-tiny", "papaformer-gumbel-v2"])
@pytest.mark.parametrize("damage,fragment", [
    (lambda b: b[:len(b) // 2], "incomplete metadata"),  # truncated
    (lambda b: struct.pack("<Q", 2**60) + b[8:], "header too large"),  # a header that claims 2^60 bytes
    (lambda b: b[:5], "not a readable safetensors file"),
])
def test_truncated_or_oversized_safetensors(tmp_path, capsys, name, damage, fragment):
    d = copy(tmp_path, name)
    f = d / "model.safetensors"
    f.write_bytes(damage(f.read_bytes()))
    refused(capsys, d, f"{f}: not a readable safetensors file", fragment)


def test_a_directory_that_needs_its_own_code_is_refused_without_running_it(tmp_path, capsys):
    d = copy(tmp_path, "mixtral-tiny")
    marker = tmp_path / "ran"
    (d / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type="evil_moe", auto_map={"AutoConfig": "evil.Cfg", "AutoModelForCausalLM": "evil.Model"})
    (d / "config.json").write_text(json.dumps(cfg))
    refused(capsys, d, "needs the directory's own code (auto_map in config.json); RouteScope never runs")
    assert not marker.exists()
