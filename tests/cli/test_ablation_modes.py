"""Named ablation modes on the command line (`--mode`): pgpt's authors' pgpt-1 evaluation through
generate and export, and a mode the model lacks refused in one line (exit 2, nothing written)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from routescope.analysis.export.table_files import read_csv
from routescope.cli.main import main
from routescope.core_models.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2] / "checkpoints"
PROMPT = "Once upon a time, there was a little"


def run(argv, capsys):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_with_the_authors_pgpt1(capsys):
    code, out, err = run(["generate", ROOT / "pgpt", PROMPT, "--mode", "pgpt1-reference", "--max-new-tokens", "1",
                          "--json"], capsys)
    assert code == 0, err
    step = json.loads(out)["steps"][0]
    model, tok = load_checkpoint(ROOT / "pgpt")
    ids = torch.tensor([tok.encode(PROMPT).ids])
    with torch.no_grad():  # independent: the heavier path's output through the head, no ln_f
        j = int(torch.argmax(model.mixer.full()))
        probs = torch.softmax(model.head(model.paths[j](model.embed(ids)))[0, -1].double(), -1)
    assert step["token_id"] == int(probs.argmax())
    assert abs(step["prob"] - float(probs.max())) <= 1e-5 * float(probs.max())


def test_export_records_the_mode(capsys, tmp_path):
    out = tmp_path / "o.csv"
    code, _, err = run(["export", ROOT / "pgpt", "--prompt", PROMPT, "--out", out, "--mode", "pgpt1-reference"], capsys)
    assert code == 0, err
    df = read_csv(out)
    assert set(df["ablation"]) == {"mode pgpt1-reference"}


def test_a_mode_the_family_lacks_is_one_line(capsys, tmp_path):
    for argv in (["generate", ROOT / "moep", "hi", "--mode", "pgpt1-reference"],
                 ["export", ROOT / "moep", "--prompt", "hi", "--out", tmp_path / "o.csv", "--mode", "pgpt1-reference"]):
        code, out, err = run(argv, capsys)
        assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
        assert "invalid ablation: not an ablation mode of this model" in err and "mode 'pgpt1-reference'" in err
    assert not any(tmp_path.iterdir())


def test_python_run_takes_modes():
    import routescope as rs

    model, tok = rs.load(ROOT / "pgpt")
    run = rs.run(model, tok, PROMPT, modes=["pgpt1-reference"], max_new_tokens=1)
    assert run.ablation.describe() == "mode pgpt1-reference"
    plain = rs.run(model, tok, PROMPT, max_new_tokens=1)
    assert run.generation.steps[0].top_probs != plain.generation.steps[0].top_probs
