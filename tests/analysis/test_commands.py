"""`routescope export | routes | attribute`, run in-process through their handlers."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from routescope.analysis.export import columns as C
from routescope.analysis.inputs.prompts import read_prompt_file
from routescope.cli.export import parse_shard, shard
from routescope.analysis.export.table_files import read_csv, read_parquet
from tolerances import FORWARD_EPS, assert_close_to_scale

PROMPTS = ["Once upon a time", "Solve this", "There was a little girl.", "Python code", "One day",
           "Find the largest", "She loved playing with", "=1+1 \"quoted\", tab\there"]


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """The same rows in the same order; values equal up to the rounding of another batching (other
    kernel blockings), in eps of each kind's largest |value|."""
    pd.testing.assert_frame_equal(a.drop(columns=C.VALUE), b.drop(columns=C.VALUE))
    for kind, values in a.groupby(C.KIND)[C.VALUE]:
        assert_close_to_scale(b[C.VALUE][values.index].to_numpy(), values.to_numpy(), FORWARD_EPS, msg=kind)


@pytest.fixture
def prompt_file(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(PROMPTS[:4] + [""] + PROMPTS[4:]) + "\n", encoding="utf-8")  # a blank line is skipped
    return f


def test_shards_partition_the_prompts(cli, checkpoint, prompt_file, tmp_path):
    ck = checkpoint("gumbel_v1")
    assert cli(["export", ck, "--prompts", prompt_file, "--out", tmp_path / "all.csv", "--quiet",
                "--batch-size", "3"]) == 0
    full = read_csv(tmp_path / "all.csv")
    ids = [pid for pid, _ in read_prompt_file(prompt_file)]
    assert list(dict.fromkeys(full[C.PROMPT_ID])) == ids and len(ids) == len(PROMPTS)
    parts = []
    for i in range(3):
        out = tmp_path / f"shard{i}.csv"
        assert cli(["export", ck, "--prompts", prompt_file, "--out", out, "--shard", f"{i}/3", "--quiet"]) == 0
        parts.append(read_csv(out))
    seen = [set(p[C.PROMPT_ID]) for p in parts]
    assert set().union(*seen) == set(ids)
    assert sum(len(s) for s in seen) == len(ids)  # each prompt in exactly one shard
    assert seen[1] == {ids[k] for k in range(len(ids)) if k % 3 == 1}
    merged = pd.concat(parts, ignore_index=True)
    key = [C.PROMPT_ID, C.POSITION, C.LAYER, C.KIND, C.OPTION]
    a = full.sort_values(key, ignore_index=True)
    b = merged.sort_values(key, ignore_index=True)
    assert_same_rows(a, b)  # batched vs alone


def test_export_rows_match_the_tokenizer(cli, checkpoint, prompt_file, tmp_path, tokenizer):
    ck = checkpoint("gumbel_v1")
    cli(["export", ck, "--prompts", prompt_file, "--out", tmp_path / "x.csv", "--out", tmp_path / "x.parquet",
         "--quiet", "--drop", "parallel.0:1", "--seed", "5"])
    df = read_csv(tmp_path / "x.csv")
    pd.testing.assert_frame_equal(df, read_parquet(tmp_path / "x.parquet"))
    last = df[df[C.PROMPT_ID] == "9"]  # the hostile prompt, on line 9 of the file
    ids = tokenizer.encode(PROMPTS[-1]).ids
    tok = last.drop_duplicates(C.POSITION).sort_values(C.POSITION)
    assert tok[C.TOKEN_ID].tolist() == ids
    assert "".join(tok[C.TOKEN]) == PROMPTS[-1]
    assert df[C.ABLATION].eq("drop parallel.0:1").all() and df[C.SEED].eq(5).all()
    assert df[C.MODEL].eq(ck.name).all() and df[C.FAMILY].eq("papaformer-gumbel-v1").all()  # config.label
    dropped = df[(df[C.KIND] == "prob") & (df[C.LAYER] == "parallel.0") & (df[C.OPTION] == 1)]
    assert dropped[C.VALUE].eq(0).all() and not dropped[C.SELECTED].any()


def test_export_with_generation_from_a_tsv(cli, checkpoint, tmp_path):
    f = tmp_path / "p.tsv"
    f.write_text("prompt_id\tprompt\textra\nA\tOnce upon a time\tx\nB\tSolve this\ty\n", encoding="utf-8")
    cli(["export", checkpoint("moep"), "--prompts", f, "--out", tmp_path / "g.parquet", "--max-new-tokens", "3",
         "--quiet"])
    df = read_parquet(tmp_path / "g.parquet")
    assert set(df[C.PROMPT_ID]) == {"A", "B"}
    for pid, g in df.groupby(C.PROMPT_ID):
        gen = g[g[C.PHASE] == "generated"]
        assert gen[C.POSITION].nunique() == 3
        assert gen[C.POSITION].min() == g[g[C.PHASE] == "prompt"][C.POSITION].max() + 1


def test_export_wiola_with_atm(cli, checkpoint, tmp_path):
    cli(["export", checkpoint("wiola", atm_tau=-1.0), "--prompt", "One day a little boy", "--out",
         tmp_path / "w.csv", "--option", "atm=true", "--quiet"])
    df = read_csv(tmp_path / "w.csv")
    assert {"gate_mean", "beta", "merge", "adjacent_cos"} <= set(df[C.KIND])
    assert df[df[C.KIND] == "merge"][C.SELECTED].any()


def test_export_run_options_are_the_models_own(cli, checkpoint, tmp_path):
    """--option values are checked against what the family's model declares, in its kind and range,
    before any prompt runs; a tau of 1.0 merges nothing, one below every cosine merges every pair."""
    ck = checkpoint("wiola")
    with pytest.raises(ValueError, match=r"option atm_tau = '2': expected a number in \[-1.0, 1.0\]"):
        cli(["export", ck, "--prompt", "hi", "--out", tmp_path / "x.csv", "--option", "atm_tau=2"])
    with pytest.raises(ValueError, match="option atm = 'maybe': expected true or false"):
        cli(["export", ck, "--prompt", "hi", "--out", tmp_path / "x.csv", "--option", "atm=maybe"])
    with pytest.raises(ValueError, match="--option atm: needs --max-new-tokens 0"):
        cli(["export", ck, "--prompt", "hi", "--out", tmp_path / "x.csv", "--option", "atm=true", "--max-new-tokens", "2"])
    assert not (tmp_path / "x.csv").exists()
    merged = {}
    for tau in ("0", "1"):
        out = tmp_path / f"t{tau}.csv"
        cli(["export", ck, "--prompt", "One day a little boy", "--out", out, "--option", "atm=true",
             "--option", f"atm_tau={tau}", "--quiet"])
        df = read_csv(out)
        merged[tau] = df[df[C.KIND] == "merge"][C.SELECTED].sum()
    assert merged["1"] == 0 < merged["0"]


@pytest.mark.parametrize("argv,message", [
    (["--shard", "3/3"], "shard"),
    (["--shard", "x"], "shard"),
    (["--out", "x.xlsx"], "unknown export format"),
    (["--option", "atm=true"], "atm: not an option of papaformer-gumbel-v1 models"),
    (["--drop", "parallel.9:0"], "parallel.9"),
])
def test_export_errors(cli, checkpoint, tmp_path, argv, message):
    args = ["export", checkpoint("gumbel_v1"), "--prompt", "hi"]
    if "--out" not in argv:
        args += ["--out", tmp_path / "o.csv"]
    with pytest.raises(ValueError, match=message):
        cli(args + argv)
    assert not (tmp_path / "o.csv").exists()


def test_export_refuses_models_without_routing_and_bad_prompt_files(cli, checkpoint, tmp_path):
    with pytest.raises(ValueError, match="no routing layers"):
        cli(["export", checkpoint("llama"), "--prompt", "hi", "--out", tmp_path / "o.csv"])
    bad = tmp_path / "bad.tsv"
    bad.write_text("id\ttext\n1\thi\n")
    with pytest.raises(ValueError, match="prompt_id"):
        cli(["export", checkpoint("gumbel_v1"), "--prompts", bad, "--out", tmp_path / "o.csv"])
    assert not (tmp_path / "o.csv").exists()


def test_shard_helpers():
    assert parse_shard(None) == (0, 1) and parse_shard("2/5") == (2, 5)
    items = list(range(11))
    parts = [shard(items, i, 4) for i in range(4)]
    assert sorted(sum(parts, [])) == items


def test_routes_json(cli, checkpoint, capsys):
    assert cli(["routes", checkpoint("gumbel_v1"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["prompts"]) == 20
    p = doc["prompts"][0]
    assert p["route"] == ">".join(map(str, p["routes"])) and len(p["routes"]) == 3 and "paper" in p
    assert set(doc["ours"]) == {"route 1", "route 2", "route 3", "combined", "accuracy", "n_routes"}
    assert doc["paper"]["accuracy"] == pytest.approx(0.4)
    routes = [r for q in doc["prompts"] for r in q["routes"]]
    correct = [r == q["expected_path"] for q in doc["prompts"] for r in q["routes"]]
    assert doc["ours"]["accuracy"] == pytest.approx(sum(correct) / len(routes))
    assert doc["ours"]["combined"] == pytest.approx(routes.count(4) / len(routes))


def test_routes_text_and_errors(cli, checkpoint, capsys, tmp_path):
    assert cli(["routes", checkpoint("share_linear"), "--majority"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "paper" in out and "majority" in out
    with pytest.raises(ValueError, match="(?i)papaformer"):
        cli(["routes", checkpoint("moep")])
    bad = tmp_path / "bad.tsv"
    bad.write_text("prompt_id\tdomain\tprompt\nP1\tstory\thi\n")
    with pytest.raises(ValueError, match="expected_path"):
        cli(["routes", checkpoint("gumbel_v1"), "--probes", bad])


@pytest.mark.parametrize("method", ["ig", "ablation", "shapley"])
def test_attribute(cli, checkpoint, capsys, method):
    argv = ["attribute", checkpoint("gumbel_v2"), "--prompt", "Once upon a time", "--method", method, "--json",
            "--n-steps", "8", "--n-samples", "2", "--token", " a"]
    assert cli(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target_token"] == " a"
    if method == "ig":
        assert len(doc["rows"]) == doc["target_position"] + 1 and "convergence_delta" in doc
    else:
        assert len(doc["rows"]) == 2 * 3  # 2 parallel layers x (2 paths + combined)
    with pytest.raises(ValueError, match="tokens"):
        cli(argv[:-1] + ["a long phrase of text"])


def test_sampled_routing_does_not_depend_on_batching(cli, checkpoint, prompt_file, tmp_path):
    ck = checkpoint("gumbel_v2")
    common = ["--prompts", prompt_file, "--routing", "sampled", "--seed", "11", "--quiet"]
    cli(["export", ck, *common, "--out", tmp_path / "a.csv", "--batch-size", "8"])
    cli(["export", ck, *common, "--out", tmp_path / "b.csv", "--batch-size", "1", "--shard", "1/2"])
    a, b = read_csv(tmp_path / "a.csv"), read_csv(tmp_path / "b.csv")
    a = a[a[C.PROMPT_ID].isin(set(b[C.PROMPT_ID]))].reset_index(drop=True)
    assert_same_rows(a, b)  # the same routes drawn; values up to the rounding of another batch size


@pytest.mark.parametrize("family", ["gumbel_v1", "moep", "pgpt", "wiola"])
def test_padded_batches_give_the_rows_of_single_prompts(cli, checkpoint, prompt_file, tmp_path, family):
    """Prompts of different lengths share one right-padded forward; padding never shows."""
    ck = checkpoint(family)
    common = ["--prompts", prompt_file, "--quiet"]
    cli(["export", ck, *common, "--out", tmp_path / "batched.csv", "--batch-size", "16"])
    cli(["export", ck, *common, "--out", tmp_path / "single.csv", "--batch-size", "1"])
    a, b = read_csv(tmp_path / "batched.csv"), read_csv(tmp_path / "single.csv")
    assert a[C.PROMPT_ID].nunique() > 1
    assert_same_rows(a, b)
