"""`routescope importance`: tables as CSV (read back exactly) and Parquet, one escaped offline page,
provenance; a pruned checkpoint that transformers opens as it is, with the ablated model's logits;
bad input refused in one line with nothing written."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from routescope.analysis.export.csv_format import read_frame_csv
from routescope.cli.main import main
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint
from tolerances import EPS32, FORWARD_EPS

pytest.importorskip("transformers")

CK = Path(__file__).resolve().parents[2] / "checkpoints"
TEXTS = ["Once upon a time, there was a little girl named Lily. She loved her toys.",
         "Solve this problem: 3x + 5 = 20. Express your answer as a fraction.",
         "One day a little boy went to the park with his dog and a ball.",
         "Find the largest prime below fifty, then evaluate the sum."]
TABLES = ("importance", "control", "control_summary", "proxies", "proxy_agreement", "pruning", "pruning_curve")


def run(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_tables_page_and_a_pruned_checkpoint_transformers_opens(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    data = tmp_path / "<b onmouseover=alert(1)>x.txt"  # a file name is data: the page escapes it
    rows = [f"{t} ({i})" for i in range(6) for t in TEXTS]  # 24 rows: --prune ranks on 12, judges on 12
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out, pruned = tmp_path / "out", tmp_path / "pruned"
    code, err = run(["--threads", "1", "importance", CK / "olmoe-tiny", "--data", data, "--out", out, "--draws", "2",
                     "--prune", "3", "--prune-out", pruned, "--quiet"], capsys)
    assert code == 0, err
    assert err.count("\n") == 1 and "pruned checkpoint" in err
    for name in TABLES:
        parquet = pd.read_parquet(out / f"{name}.parquet")
        csv = read_frame_csv(out / f"{name}.csv")
        assert list(csv.columns) == list(parquet.columns) and len(csv) == len(parquet)
    imp = pd.read_parquet(out / "importance.parquet")
    assert list(imp.columns) == ["layer", "option", "label", "delta_nll", "delta_nll_low", "delta_nll_high", "kl",
                                 "flip_rate", "usage", "delta_nll_estimate", "method"] and len(imp) == 4 * 16
    assert (pd.read_parquet(out / "control.parquet")["kind"] == "control").all()
    page = (out / "importance.html").read_text(encoding="utf-8")
    shown, data_block = page.split('<script type="application/json" id="corpus-data">')  # JSON: raw text, no "</"
    assert "<b onmouseover" not in shown and "&lt;b onmouseover=alert(1)&gt;x.txt" in shown
    assert "</" not in data_block.split("</script>")[0]
    prov = json.loads((out / "importance.json").read_text())
    assert prov["dataset_sha256"] and prov["weights_sha256"] and prov["effects_dtype"] == "float32"

    # the pruned checkpoint: transformers' own class opens it; 13 experts, router rows gone
    hf = AutoModelForCausalLM.from_pretrained(pruned, dtype=torch.float32).eval()
    assert hf.config.num_experts == 13 and hf.model.layers[0].mlp.gate.weight.shape[0] == 13
    meta = json.loads((pruned / "pruning.json").read_text())
    drop = {l: os_ for l, os_ in meta["dropped"].items()}
    assert all(len(v) == 3 for v in drop.values()) and len(drop) == 4
    order = prov["holdout"]["causal_order"]  # ranked on the ranking rows (tests/analysis/test_importance_holdout.py)
    assert {l: sorted(v) for l, v in drop.items()} == {l: sorted(o[:3]) for l, o in order.items()}
    assert meta["losses_heldout"]["before"] != prov["base_loss"]  # judged on the held-out rows, not on all
    model, tok = load_checkpoint(CK / "olmoe-tiny", dtype="float32")
    x = torch.tensor([tok.encode("Once upon a time there was a dragon who liked tea.").ids])
    with torch.inference_mode():
        want = model(x, ablation=Ablation(drop=tuple((l, o) for l, os_ in drop.items() for o in os_))).logits
        got = hf(input_ids=x).logits.float()
    assert (got - want).abs().max() <= FORWARD_EPS * EPS32 * want.abs().max()
    assert "pruned by RouteScope" in (pruned / "README.md").read_text() and (pruned / "tokenizer.json").is_file()


@pytest.mark.parametrize("args, message", [
    (["--layers", "model.layers.7.mlp.gate"], "no routing layer 'model.layers.7.mlp.gate'"),
    (["--options", "0,16"], "option 16 out of range 0..15"),
    (["--options", "x"], "is not an option number"),
    (["--prune", "2"], "--prune N and --prune-out DIR go together"),
    (["--prune", "13", "--prune-out", "{tmp}/p"], "prune 1..12"),
    (["--data", "{tmp}/empty.txt"], "no rows"),
    (["--checkpoint", str(CK / "llama-dense")], "has no routing layers"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    data = tmp_path / "d.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    checkpoint = CK / "olmoe-tiny"
    if args[0] == "--checkpoint":
        checkpoint, args = Path(args[1]), args[2:]
    if "--data" not in args:
        args += ["--data", data]
    out = tmp_path / "out"
    code, err = run(["importance", checkpoint, "--out", out, "--quiet", *args], capsys)
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "p").exists()


@pytest.mark.slow
def test_engine_ray_writes_the_tables_of_one_process(tmp_path, capsys):
    """`--engine ray --workers 2`: Ray actors measure the batches; the tables equal one process's exactly."""
    pytest.importorskip("ray", reason="ray is not installed (the distributed extra)")
    data = tmp_path / "d.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    common = ["--threads", "1", "importance", CK / "olmoe-tiny", "--data", data, "--draws", "2", "--batch-size", "1",
              "--layers", "model.layers.1.mlp.gate", "--quiet"]
    outs = {}
    for engine in ("local", "ray"):
        outs[engine] = tmp_path / engine
        code, err = run(common + ["--out", outs[engine], "--engine", engine, "--workers", "2"], capsys)
        # Ray may log its own lines (a token-authentication notice) before ours
        assert code == 0 and err.splitlines()[-1].startswith("wrote ") and "Traceback" not in err, err
    for name in ("importance", "control", "proxies"):
        a, b = (pd.read_parquet(outs[e] / f"{name}.parquet") for e in ("local", "ray"))
        pd.testing.assert_frame_equal(a, b, check_exact=True)
