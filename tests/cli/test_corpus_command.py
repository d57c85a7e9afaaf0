"""`routescope corpus`: every table as CSV (read back exactly) and Parquet, the page, provenance, a
comparison beside a second checkpoint; bad data and incomparable checkpoints refused in one line
with nothing written."""
from __future__ import annotations

import json

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from routescope.analysis.corpus import compare as CMP
from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus.columns import named_compared
from routescope.analysis.corpus.run import CorpusSettings, run_corpus
from routescope.analysis.export.csv_format import csv_kinds, read_frame_csv
from routescope.cli.main import main
from routescope.core_models.checkpoint import load_checkpoint
from routescope.analysis.export.plotly_bundle import plotly_js

ROOT = Path(__file__).resolve().parents[2]
CK = ROOT / "checkpoints"
TSV = "text\tdomain\tsource\n" + "".join(f"{t}\t{d}\t{s}\n" for t, d, s in [
    ("Once upon a time, there was a little girl named Lily.", "story", "a"),
    ("She loved to play in the park with her red ball.", "story", "@b"),
    ("Solve for x: 3x + 5 = 20.", "math", "a"),
    ("What is 12 divided by 4?", "math", "-c"),
])


def run(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_tables_page_and_comparison(tmp_path, capsys):
    data = tmp_path / "d.tsv"
    data.write_text(TSV, encoding="utf-8")
    out = tmp_path / "out"
    code, err = run(["corpus", CK / "papaformer-gumbel-v1", "--data", data, "--compare", CK / "papaformer-gumbel-v2",
                     "--out", out, "--min-count", "1", "--intended", "domain:story=0,math=1", "--quiet",
                     "--max-tokens", "32"], capsys)
    assert code == 0, err
    assert err.startswith("wrote ") and err.count("\n") == 1
    corpus = D.load_corpus(data)
    want = {}
    for name in ("papaformer-gumbel-v1", "papaformer-gumbel-v2"):
        model, tok = load_checkpoint(CK / name)
        res = run_corpus(model, tok, corpus, name=name, settings=CorpusSettings(max_tokens=32),
                         decode=lambda i, t=tok: t.decode([i]))
        want[name] = res.tables(min_count=1, intended={"domain": {"story": 0, "math": 1}})
    a = want["papaformer-gumbel-v1"]
    compared = CMP.compare_tables(a, want["papaformer-gumbel-v2"])
    expected = {**a, **{f"compare_{k}": v for k, v in compared.items()}}
    # the compared files name each measure's checkpoint (no `_a` / `_b`), values as compare_tables gives them
    raw = compared["utilisation"]
    back = read_frame_csv(out / "compare_utilisation.csv",
                          csv_kinds(named_compared({"utilisation": raw}, ("papaformer-gumbel-v1", "papaformer-gumbel-v2"))[
                              "utilisation"]))
    for side, name in (("a", "papaformer-gumbel-v1"), ("b", "papaformer-gumbel-v2")):
        np.testing.assert_array_equal(back[f"slot_share ({name})"], raw[f"slot_share_{side}"])
    np.testing.assert_allclose(back["slot_share (papaformer-gumbel-v2 − papaformer-gumbel-v1)"],
                               raw["slot_share_diff"], rtol=1e-12)
    assert not any(str(c).endswith(("_a", "_b", "_diff")) for c in back.columns if c not in ("layer_a", "layer_b",
                                                                                              "option_a", "option_b"))
    expected = {k: (v if not k.startswith("compare_") else named_compared({k[8:]: v}, ("papaformer-gumbel-v1",
                                                                                       "papaformer-gumbel-v2"))[k[8:]])
                for k, v in expected.items()}
    expected.pop("summary")  # holds the run's seconds
    for name, df in expected.items():
        back = read_frame_csv(out / f"{name}.csv", csv_kinds(df))
        pd.testing.assert_frame_equal(back, df, check_dtype=False)
        pd.testing.assert_frame_equal(pd.read_parquet(out / f"{name}.parquet"), df, check_dtype=False)
    assert {"accuracy", "compare_accuracy", "co_routing", "specialisation"} <= set(expected)
    assert (out / "corpus.html").read_text().count(plotly_js()[:300]) == 1
    doc = json.loads((out / "corpus.json").read_text())
    assert doc["a"]["model"] == "papaformer-gumbel-v1" and doc["b"]["model"] == "papaformer-gumbel-v2"
    assert doc["a"]["dataset_sha256"] == corpus.digest and doc["a"]["rows"] == 4
    # text cells that look like formulas are neutralised in the CSV (the one writer)
    raw = (out / "label_shares.csv").read_text(encoding="utf-8")
    assert "'@b" in raw and "'-c" in raw and ",@b" not in raw
    # a rerun says it replaced the files
    code, err = run(["corpus", CK / "papaformer-gumbel-v1", "--data", data, "--out", out, "--quiet"], capsys)
    assert code == 0 and "replaced" in err


def test_shipped_dataset_and_a_family_without_routes(tmp_path, capsys):
    out = tmp_path / "pgpt"
    code, err = run(["corpus", CK / "pgpt", "--shipped", "table6", "--out", out, "--quiet", "--format", "csv"], capsys)
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["call_values.csv", "corpus.html", "corpus.json", "summary.csv"]
    assert "no per-token routes" in (out / "corpus.html").read_text()


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("setup,argv_tail,fragment", [
    ("text\tdomain\nhello\tstory\textra\n", [], "line 2 has 3 tab-separated fields"),
    ("words\tdomain\nhello\tstory\n", [], "no text column"),
    (TSV, ["--compare", CK / "papaformer-share-linear"],
     "cannot compare papaformer-gumbel-v2 with papaformer-share-linear: parallel.0 has 3 options"),
    (TSV, ["--compare", CK / "pgpt"], "papaformer-gumbel-v2 has per-token routes and pgpt only per-call values"),
    (TSV, ["--intended", "domain:story"], "intended options 'domain:story'"),
    (TSV, ["--intended", "topic:x=1"], "no label column 'topic'"),
    (TSV, ["--intended", "domain:story=7"], "option 7 is out of range"),
    (TSV, ["--format", "xlsx"], "--format 'xlsx'"),
    (TSV, ["--labels", "nope"], "no label column(s) nope"),
])
def test_refused_in_one_line_with_nothing_written(tmp_path, capsys, setup, argv_tail, fragment):
    data = tmp_path / "d.tsv"
    data.write_text(setup, encoding="utf-8")
    before = listing(tmp_path)
    code, err = run(["corpus", CK / "papaformer-gumbel-v2", "--data", data, "--out", tmp_path / "out", "--quiet",
                     *argv_tail], capsys)
    assert code == 2, err
    assert err.startswith("routescope corpus: ") and err.count("\n") == 1 and "Traceback" not in err
    assert fragment in err, err
    assert listing(tmp_path) == before


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    code, err = run(["corpus", CK / "pgpt", "--shipped", "table6", "--out", f, "--quiet"], capsys)
    assert code == 2 and "exists and is not a directory" in err
    code, err = run(["corpus", CK / "pgpt", "--shipped", "nope", "--out", tmp_path / "o", "--quiet"], capsys)
    assert code == 2 and "no shipped dataset 'nope'" in err and not (tmp_path / "o").exists()
