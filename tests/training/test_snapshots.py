"""`train(snapshots=...)` / `routescope train --snapshots`: checkpoints kept along one run, each with a
card giving its step and validation loss, and a run that is otherwise the same as one without them."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from routescope.cli.train import parse_snapshots
from routescope.core_models.checkpoint import load_checkpoint, load_tokenizer_file
from routescope.core_models.training.trainer import TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]
CONFIG = dict(preset="olmoe-tiny", steps=3, batch_size=2, seq_len=16, eval_every=100, eval_docs=2, warmup=1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tok = load_tokenizer_file(ROOT / "checkpoints" / "tokenizer.json")
    base = tmp_path_factory.mktemp("snapshots")
    kept = train(TrainConfig(**CONFIG), tok, base / "run", resume=False, progress=False, snapshots=[2, 1])
    plain = train(TrainConfig(**CONFIG), tok, base / "plain", resume=False, progress=False)
    return base, kept, plain


def _card_losses(card: str) -> dict[str, float]:
    return {d: float(v) for d, v in re.findall(r"^\| (\w+) \| ([0-9.]+) \| [0-9.]+ \|$", card, re.M)}


def test_snapshots_are_checkpoints_with_their_step_and_validation_loss(runs):
    base, kept, _ = runs
    run = base / "run"
    names = sorted(p.name for p in run.iterdir() if p.is_dir())
    assert names == ["step-0001", "step-0002", "step-0003"]  # the last step is always kept
    assert (run / "tokenizer.json").is_file() and not (run / "step-0001" / "tokenizer.json").exists()
    record = json.loads((run / "run.json").read_text())
    assert record["snapshots"] == names
    history = {h["step"]: h for h in record["history"]}
    for name in names:
        step = int(name[5:])
        card = (run / name / "README.md").read_text()
        assert f"- steps: {step} (batch 2 x 16 tokens)" in card
        assert f"- snapshot: step {step} of a 3-step run" in card
        losses = _card_losses(card)
        assert set(losses) == {"story", "math"}
        for d, v in losses.items():  # the card's 4 digits are the run's own evaluation at that step
            assert abs(v - history[step][f"val_{d}"]) < 6e-5, (name, d)
        model, tok = load_checkpoint(run / name)
        assert tok is None and model.config.label == "olmoe"
    last = load_file(run / "step-0003" / "model.safetensors")
    first = load_file(run / "step-0001" / "model.safetensors")
    assert any(not torch.equal(last[k], first[k]) for k in last)


def test_keeping_snapshots_leaves_the_run_unchanged(runs):
    base, kept, plain = runs
    a = load_file(base / "run" / "step-0003" / "model.safetensors")
    b = load_file(base / "plain" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert kept["val_loss"] == plain["val_loss"]


def test_bad_snapshot_steps_are_one_line():
    tok = load_tokenizer_file(ROOT / "checkpoints" / "tokenizer.json")
    with pytest.raises(ValueError, match=r"snapshots \[1, 9\]: steps must be within 1 \.\. steps \(3\)"):
        train(TrainConfig(**CONFIG), tok, "unused", resume=False, progress=False, snapshots=[9, 1])
    assert parse_snapshots("50,100") == [50, 100] and parse_snapshots("") == []
    for bad in ("0,5", "a", "5,,6"):
        with pytest.raises(ValueError, match="--snapshots"):
            parse_snapshots(bad)
