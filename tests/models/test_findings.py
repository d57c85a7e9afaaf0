"""The findings table in checkpoints/README.md is what checkpoints/findings.json renders, and every
number in findings.json (but the one timing) is what the shipped checkpoints measure now."""
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from tolerances import EPS32

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("findings_table", ROOT / "scripts" / "findings_table.py")
findings = sys.modules["findings_table"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(findings)
CK = ROOT / "checkpoints"
pytestmark = pytest.mark.skipif(not (CK / findings.FINDINGS).is_file(), reason="no findings.json")
# A mean loss over ~30k tokens recomputed with another SIMD width or thread count: rounding of sums of
# terms of the loss's own size, a few eps relative; 64 eps leaves a margin and hides nothing (a changed
# checkpoint moves losses by percent).
LOSS_RTOL = 64 * EPS32


def stored() -> dict:
    return json.loads((CK / findings.FINDINGS).read_text())


def close(a, b, rtol: float, where: str = "") -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            close(a[k], b[k], rtol, f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            close(x, y, rtol, f"{where}[{k}]")
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=rtol, abs_tol=rtol), (where, a, b)
    else:
        assert a == b, (where, a, b)


def test_the_readme_block_is_what_findings_json_renders():
    assert findings.stale(CK) == []
    assert findings.main(["--check"], root=CK) == 0


def test_every_verdict_follows_from_the_numbers():
    rows = findings.rows(stored())
    assert len(rows) >= 14 and {r.paper for r in rows} == {"PaPaformer", "MoEP", "ParallelGPT", "Wiola", "PAGMLP"}
    assert all(r.holds in ("yes", "**no**") and r.conditions for r in rows)
    m = stored()  # verdicts recomputed by hand from the records
    pa, base = m["runs"]["pagmlp"]["val"], m["runs"]["llama-dense"]["val"]
    within = all(abs(pa[d] / base[d] - 1) <= 0.01 for d in ("story", "math"))
    assert next(r for r in rows if "comparable performance" in r.claim).holds == ("yes" if within else "**no**")
    split = m["wiola"]["split"]  # the leak-free positions decide "without information loss"
    no_loss = all(split[d]["paper_rest"] <= 1.01 * split[d]["off_rest"] for d in ("story", "math"))
    assert next(r for r in rows if r.claim.startswith("ATM reduces")).holds == ("yes" if no_loss else "**no**")
    sl, dense = m["runs"]["papaformer-share-linear"]["val"], m["runs"]["llama-dense-600"]["val"]
    row = next(r for r in rows if "Parallel_Share_Linear" in r.claim)
    assert "LLaMA_256" in row.claim and "llama-dense-600" in row.compared
    if any(sl[d] >= dense[d] for d in ("story", "math")):
        assert row.holds == "**no**"


def test_the_leak_split_covers_every_position():
    for d, s in stored()["wiola"]["split"].items():
        assert 0 < s["merged"] < s["positions"] == findings.LEAK_ROWS * findings.SEQ_LEN, d
        for variant in ("off", "paper", "causal"):  # all = the position-weighted mean of its two parts
            parts = (s[f"{variant}_merged"] * s["merged"] + s[f"{variant}_rest"] * (s["positions"] - s["merged"]))
            assert math.isclose(parts / s["positions"], s[f"{variant}_all"], rel_tol=LOSS_RTOL), (d, variant)


def test_rows_state_the_token_counts_of_unequal_comparisons():
    m = stored()
    assert findings.unstated_token_gaps(findings.rows(m), m) == []
    # the check itself: a verdict comparing pgpt (600 steps) with llama-dense (300) must name both counts
    bare = findings.Finding("X", "claim", "paper's conditions", "ours", "yes", "rule", ("pgpt", "llama-dense"))
    assert findings.unstated_token_gaps([bare], m) == ["claim"]
    stated = findings.Finding("X", "claim", "c", "ours", "yes", findings.token_statement(m, "pgpt", "llama-dense"),
                              ("pgpt", "llama-dense"))
    assert findings.unstated_token_gaps([stated], m) == []
    within = findings.Finding("X", "claim", "c", "ours", "yes", "rule", ("pgpt", "wiola-tiny"))  # equal tokens
    assert findings.unstated_token_gaps([within], m) == []


def test_check_fails_on_an_unstated_token_gap(monkeypatch):
    real = findings.rows

    def rows_hiding_tokens(m):
        out = real(m)
        return out + [findings.Finding("X", "a bare comparison", "c", "ours", "yes", "rule", ("moep", "llama-dense"))]

    monkeypatch.setattr(findings, "rows", rows_hiding_tokens)
    assert any("a bare comparison" in p for p in findings.stale(CK))


def test_training_summaries_are_the_shipped_ones():
    m = stored()
    for name, run in m["runs"].items():
        source = {"gpt2-dense-3": findings.DENSE_RUN, findings.EQUAL_TOKEN_RUN_NAME: findings.EQUAL_TOKEN_RUN,
                  findings.CAUSAL_RUN_NAME: findings.CAUSAL_RUN}.get(name, name)
        assert run == json.loads(json.dumps(findings._summary(CK, source))), name
    assert m["gumbel_runs"] == json.loads((CK / findings.GUMBEL_RUNS).read_text())["runs"]


@pytest.mark.slow
def test_measurements_are_the_shipped_checkpoints():
    import torch

    torch.set_num_threads(1)
    m = stored()
    close(findings.measure_table6(CK), m["table6"], 0.0, "table6")  # route counts: exact
    close(findings.measure_pagmlp(CK), m["pagmlp"], 4 * EPS32, "pagmlp")
    pgpt = findings.measure_pgpt(CK, timing=False)
    close(pgpt, {k: v for k, v in m["pgpt"].items() if k != "time_ratio"}, LOSS_RTOL, "pgpt")
    # merge decisions compare cosines with tau: another CPU's rounding may flip a pair at a near tie,
    # ~2e-4 of mu per pair here; losses as above
    wiola = findings.measure_wiola(CK)
    close(wiola["tau"], m["wiola"]["tau"], 1e-3, "wiola.tau")
    close({k: v for k, v in wiola.items() if k != "tau"}, {k: v for k, v in m["wiola"].items() if k != "tau"},
          LOSS_RTOL, "wiola")
