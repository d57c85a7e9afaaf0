"""Ablation specs (core_models.specs' grammar): ranges, sets, globs, "all but" and the N most used,
parsed in one place and the same in the CLI, rs.run and export; errors name the reason first and stay
one short line for long spec lists. "top N" is checked against transformers' own router logits."""
from __future__ import annotations

import fnmatch
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

import routescope as rs
from routescope.analysis.runs.usage import ablation_for, run_usage
from routescope.core_models.ablation import Ablation
from routescope.core_models.specs import AblationError

ROOT = Path(__file__).resolve().parents[2]
OLMOE = ROOT / "checkpoints" / "olmoe-tiny"
LAYERS = {f"model.layers.{i}.mlp.gate": 128 for i in range(48)}


def pairs(drop, layers=LAYERS):
    """The (layer, option) pairs a plain loop makes of ((layer pattern, options), ...)."""
    return {(l, o) for pattern, options in drop for l in layers if fnmatch.fnmatchcase(l, pattern) for o in options}


@pytest.mark.parametrize("spec, want", [
    ("model.layers.3.mlp.gate:0-15", {("model.layers.3.mlp.gate", o) for o in range(16)}),
    ("*:0-3", {("*", o) for o in range(4)}),
    ("5", {("*", 5)}),
    ("model.layers.1.mlp.gate:0,4-6,9", {("model.layers.1.mlp.gate", o) for o in (0, 4, 5, 6, 9)}),
    ("model.layers.1?.mlp.gate:2", pairs([("model.layers.1?.mlp.gate", [2])])),
    ("model.layers.*.mlp.gate:!0-1", pairs([("*", range(2, 128))])),
    ("*:!7", pairs([("*", [o for o in range(128) if o != 7])])),
])
def test_specs_resolve_to_the_pairs_a_plain_loop_makes(spec, want):
    ab = Ablation.parse([spec], layers=LAYERS)
    assert set(ab.drop) == want
    ab.validate(LAYERS)
    assert Ablation.parse([p.removeprefix("drop ") for p in ab.parts()], layers=LAYERS) == ab  # describe() reads back


def test_top_n_ranks_by_the_usage_counts_ties_to_the_lower_option():
    rng = np.random.default_rng(0)
    counts = {l: rng.integers(0, 5, 128) for l in LAYERS}  # many ties
    ab = Ablation.parse(["*:top8"], layers=LAYERS, usage=lambda source: counts)
    for l, c in counts.items():
        want = sorted(range(128), key=lambda o: (-c[o], o))[:8]  # a plain ranking
        assert sorted(o for layer, o in ab.drop if layer == l) == sorted(want)
    seen = []
    Ablation.parse(["model.layers.0.mlp.gate:top2@corpus"], layers=LAYERS,
                   usage=lambda source: seen.append(source) or counts)
    assert seen == ["corpus"]


def test_top_n_counts_the_picks_of_transformers_own_router():
    """The usage "top N" ranks by equals the top-k of transformers' router logits, counted by hand."""
    from transformers import AutoModelForCausalLM

    model, tok = rs.load(str(OLMOE), dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(OLMOE, dtype=torch.float32).eval()
    ids = tok.encode("Once upon a time, there was a little girl named Lily. She loved to play.").ids
    got = run_usage(model, [ids])
    with torch.no_grad():
        logits = hf(torch.tensor([ids]), output_router_logits=True).router_logits
    k = hf.config.num_experts_per_tok
    for i, layer_logits in enumerate(logits):
        want = np.zeros(hf.config.num_experts, dtype=np.int64)
        for row in layer_logits.reshape(-1, hf.config.num_experts):
            for e in torch.topk(row, k).indices.tolist():
                want[e] += 1
        assert got[f"model.layers.{i}.mlp.gate"].tolist() == want.tolist()
    ab = ablation_for(model, ["*:top3"], run_ids=lambda: [ids])
    for layer, c in got.items():
        assert sorted(o for l, o in ab.drop if l == layer) == sorted(sorted(range(len(c)), key=lambda o: (-c[o], o))[:3])


def test_rs_run_and_the_cli_take_the_same_specs(tmp_path, capsys):
    from routescope.analysis.export.table_files import read_csv
    from routescope.cli.main import main

    model, tok = rs.load(str(OLMOE))
    prompt = "Once upon a time"
    ranged = rs.run(model, tok, prompt, max_new_tokens=3, drop=["model.layers.1.mlp.gate:0-5"])
    listed = rs.run(model, tok, prompt, max_new_tokens=3, drop=[f"model.layers.1.mlp.gate:{o}" for o in range(6)])
    assert ranged.ablation == listed.ablation and ranged.generation.new_ids == listed.generation.new_ids
    top = rs.run(model, tok, prompt, max_new_tokens=0, drop=["*:top2"])
    counts = run_usage(model, [tok.encode(prompt).ids])
    assert set(top.ablation.drop) == {(l, o) for l, c in counts.items()
                                      for o in sorted(range(len(c)), key=lambda o: (-c[o], o))[:2]}
    outs = []
    for k, drops in enumerate((["model.layers.1.mlp.gate:0-5"], [f"model.layers.1.mlp.gate:{o}" for o in range(6)])):
        out = tmp_path / f"{k}.csv"
        argv = ["export", str(OLMOE), "--prompt", prompt, "--out", str(out), "--quiet"]
        assert main(argv + [x for d in drops for x in ("--drop", d)]) == 0
        outs.append(read_csv(out))
    assert outs[0].equals(outs[1]) and set(outs[0]["ablation"]) == {"drop model.layers.1.mlp.gate:0-5"}


def test_errors_name_the_reason_first_and_summarise_long_lists():
    many = [f"model.layers.{i}.mlp.gate:200" for i in range(48)]
    with pytest.raises(AblationError) as e:
        Ablation.parse(many).validate(LAYERS)
    msg = str(e.value)
    assert msg.startswith("invalid ablation: option out of range 0..127: drop model.layers.0.mlp.gate:200")
    assert "and 45 more" in msg and len(msg) < 300 and "\n" not in msg
    with pytest.raises(AblationError) as e:
        Ablation.parse([f"x{i}:y" for i in range(100)])
    assert str(e.value).startswith("invalid ablation spec: cannot read the options: drop 'x0:y'") and len(str(e.value)) < 500
    for bad, reason in [("*:5-1", "runs backwards"), ("*:top0", "N >= 1"), ("*:top2@disk", "unknown usage source"),
                        (":3", "no layer before the colon"), ("a b:1", "bad layer name")]:
        with pytest.raises(AblationError, match=reason):
            Ablation.parse([bad])
    with pytest.raises(AblationError, match="no routing layer matches 'nope.\\*'"):
        Ablation.parse(["nope.*:1"], layers=LAYERS)
    with pytest.raises(AblationError, match="needs usage counts"):
        Ablation.parse(["*:top2"], layers=LAYERS)
    with pytest.raises(AblationError, match="one option per layer"):
        Ablation.parse(force=["*:1-2"])
    with pytest.raises(AblationError, match="every option of the layer dropped"):
        Ablation.parse(["*:!200"], layers=LAYERS).validate(LAYERS)  # all but an option it lacks: all


def test_summary_groups_layers_and_stays_short():
    ab = Ablation.parse(["*:!5"], layers=LAYERS)
    assert len(ab.drop) == 48 * 127
    assert ab.summary() == "drop 0-4,6-127 in 48 layers (model.layers.0.mlp.gate .. model.layers.47.mlp.gate)"
    many = Ablation(drop=tuple((l, o) for l, o in itertools.product(LAYERS, range(3)) if hash(l) % 2 or o))
    assert len(many.summary()) < 400


def test_cli_corpus_drop_switches_the_expert_off_and_records_it(tmp_path, capsys):
    import json

    import pandas as pd

    from routescope.analysis.export.batch import weights_sha256
    from routescope.analysis.export.table_files import read_provenance
    from routescope.cli.main import main

    out = tmp_path / "c"
    layer = "model.layers.2.mlp.gate"
    assert main(["corpus", str(OLMOE), "--shipped", "table6", "--drop", f"{layer}:0-3", "--compare",
                 str(ROOT / "checkpoints" / "olmoe-tiny"), "--out", str(out), "--quiet"]) == 0
    util = pd.read_csv(out / "utilisation.csv")
    dropped = util[(util["layer"] == layer) & util["option"].isin(range(4))]
    assert len(dropped) == 4 and (dropped["tokens"] == 0).all() and not dropped["overloaded"].any()
    assert util[(util["layer"] == layer) & ~util["option"].isin(range(4))]["tokens"].sum() > 0
    doc = json.loads((out / "corpus.json").read_text())
    for side in ("a", "b"):
        assert doc[side]["ablation"] == f"drop {layer}:0-3" and doc[side]["weights_sha256"] == weights_sha256(OLMOE)
        assert doc[side]["dataset_sha256"] and doc[side]["ablation_specs"] == [f"{layer}:0-3"]
    meta = read_provenance(out / "compare_utilisation.parquet")  # both checkpoints, in each Parquet file
    assert meta["a"] == doc["a"] and meta["b"] == doc["b"]
    summary = pd.read_csv(out / "summary.csv").set_index("metric")["value"]
    assert summary["ablation"] == f"drop {layer}:0-3" and summary["weights_sha256"] == weights_sha256(OLMOE)
    assert f"drop {layer}:0-3" in (out / "corpus.html").read_text()
