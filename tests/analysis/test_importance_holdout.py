"""Pruning judged on held-out rows: the split is seeded, disjoint and covers every row; the experts are
ranked on the ranking rows only (checked against a plain transformers loop over those rows, each expert
masked at its router); the held-out curve is the loss of those rows only; under 20 rows no held-out
curve (a note in the API, one line and exit 2 on the command line)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from routescope.analysis.inputs import datasets as D
from routescope.analysis.reports.importance import ImportanceSettings, importance
from routescope.analysis.reports.importance.holdout import IN_SAMPLE, MIN_ROWS, split_rows
from routescope.cli.main import main
from routescope.core_models.checkpoint import load_checkpoint
from tolerances import EPS32, FORWARD_EPS

pytest.importorskip("transformers")
from hf_models import hf_model, save_hf  # noqa: E402

CK = Path(__file__).resolve().parents[2] / "checkpoints"
WORDS = ["Lily", "Tom", "the dog", "a bird", "the sun", "her mother", "the cat", "a boy"]
TOL = 1e-5  # nats: float32 forwards of a tiny model, batched and padded vs one row at a time; its experts'
# effects here are ~1e-4 .. 1e-3
TEXTS = [f"{WORDS[i % 8]} went to the park {i} times and saw {WORDS[(3 * i + 1) % 8]} near the tree."
         for i in range(24)]


def corpus(texts) -> D.CorpusData:
    return D.rows_corpus("t", [D.CorpusRow(f"r{i}", t, ()) for i, t in enumerate(texts)], [])


def test_the_split_is_seeded_disjoint_and_covers_every_row():
    a, b, c = split_rows(37, 0.5, 0), split_rows(37, 0.5, 0), split_rows(37, 0.5, 1)
    assert np.array_equal(a.heldout, b.heldout) and np.array_equal(a.ranking, b.ranking)  # seeded
    assert not np.array_equal(a.heldout, c.heldout)  # another seed, another split
    assert not set(a.heldout) & set(a.ranking) and sorted([*a.heldout, *a.ranking]) == list(range(37))
    assert len(a.heldout) == round(0.5 * 37) and len(split_rows(40, 0.25, 0).heldout) == 10
    with pytest.raises(ValueError, match=f"19 rows: a held-out pruning curve needs at least {MIN_ROWS} rows"):
        split_rows(19, 0.5, 0)


def _router_dropping(experts: set[int]):
    """OLMoE's router with these experts' logits at -inf before softmax and top-k (a plain rewrite of
    transformers' OlmoeTopKRouter.forward, for this independent computation only)."""
    def forward(self, hidden_states):
        logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
        logits[:, sorted(experts)] = float("-inf")
        top, idx = torch.topk(torch.softmax(logits, dtype=torch.float, dim=-1), self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(-1, keepdim=True)
        return logits, top.to(logits.dtype), idx
    return forward


def _nll(hf, rows: list[list[int]], drop: dict[str, set[int]]) -> float:
    """Sum of next-token NLL over `rows` (each run alone, no padding) with `drop` masked at the routers."""
    routers = {n: m for n, m in hf.named_modules() if n in drop}
    for n, m in routers.items():
        m.forward = _router_dropping(drop[n]).__get__(m)
    try:
        total = 0.0
        with torch.no_grad():
            for ids in rows:
                lp = torch.log_softmax(hf(input_ids=torch.tensor([ids])).logits[0, :-1].double(), -1)
                total -= float(lp.gather(-1, torch.tensor(ids[1:])[:, None]).sum())
        return total
    finally:
        for m in routers.values():
            del m.forward


def test_experts_are_ranked_on_the_ranking_rows_and_judged_on_the_others(tokenizer, tmp_path):
    hf = hf_model("olmoe", tokenizer.get_vocab_size())
    model, tok = load_checkpoint(save_hf(hf, tmp_path / "olmoe", tokenizer), dtype="float32")
    res = importance(model, tok, corpus(TEXTS), ImportanceSettings(control_draws=1, prune_draws=2, batch_size=6,
                                                                   in_sample_curve=True))
    hold = res.provenance["holdout"]
    ids = {f"r{i}": tok.encode(t).ids for i, t in enumerate(TEXTS)}
    ranking, heldout = [ids[r] for r in hold["ranked_on"]], [ids[r] for r in hold["evaluated_on"]]
    assert hold["ranking_rows"] == len(ranking) == 12 and hold["heldout_rows"] == len(heldout) == 12
    assert not set(hold["ranked_on"]) & set(hold["evaluated_on"])

    # the ranking: each expert dropped alone over the ranking rows only, in plain transformers
    n_rank = sum(len(x) - 1 for x in ranking)
    base = _nll(hf, ranking, {})
    for layer, order in hold["causal_order"].items():  # routing layers are named by their router module
        effect = {e: (_nll(hf, ranking, {layer: {e}}) - base) / n_rank for e in range(4)}
        assert sorted(order) == list(range(4))
        got = hold["ranking_delta_nll"][layer]
        for e in range(4):
            assert got[str(e)] == pytest.approx(effect[e], abs=TOL), (layer, e)
        ties = TOL  # two effects closer than rounding may come in either order
        assert all(effect[a] <= effect[b] + ties for a, b in zip(order, order[1:])), (layer, order, effect)
    # ... which differs from the effect over every row (what the table, over all rows, shows)
    table = res["importance"].set_index(["layer", "option"])["delta_nll"]
    assert len(table) == 3 * 4 and max(abs(table[(l, int(e))] - v) for l, g in hold["ranking_delta_nll"].items()
                                       for e, v in g.items()) > 10 * TOL

    # the held-out curve: the loss of the held-out rows only with the causal order's first N dropped
    curve = res["pruning_curve"]
    assert set(curve["evaluated_on"]) == {"heldout", IN_SAMPLE}
    assert (curve.loc[curve.evaluated_on == "heldout", "rows"] == 12).all()
    assert (curve.loc[curve.evaluated_on == IN_SAMPLE, "rows"] == 12).all()
    n_held = sum(len(x) - 1 for x in heldout)
    held_base = _nll(hf, heldout, {}) / n_held
    for r in curve[(curve.ranking == "causal") & (curve.evaluated_on == "heldout")].itertuples():
        drop = {l: set(o[:r.n_pruned]) for l, o in hold["causal_order"].items() if r.n_pruned}
        want = _nll(hf, heldout, drop) / n_held
        assert r.loss == pytest.approx(want, abs=TOL)
        assert r.delta_loss == pytest.approx(want - held_base, abs=TOL)
    pr = res["pruning"]
    assert {"evaluated_on", "rows"} <= set(pr.columns) and set(pr["evaluated_on"]) == {"heldout", IN_SAMPLE}

    # without --in-sample-curve: the held-out rows only, the same numbers
    only = importance(model, tok, corpus(TEXTS), ImportanceSettings(control_draws=1, prune_draws=2, batch_size=6))
    held = curve[curve.evaluated_on == "heldout"].reset_index(drop=True)
    assert set(only["pruning_curve"]["evaluated_on"]) == {"heldout"}
    assert np.allclose(only["pruning_curve"]["loss"], held["loss"], rtol=0, atol=FORWARD_EPS * EPS32 * 40)


def test_under_20_rows_there_is_no_held_out_curve(tmp_path, capsys):
    model, tok = load_checkpoint(CK / "olmoe-tiny", dtype="float32")
    res = importance(model, tok, corpus(TEXTS[:10]), ImportanceSettings(layers=("model.layers.0.mlp.gate",),
                                                                        control_draws=1, prune_draws=1, prune_max=1))
    assert "pruning_curve" not in res.tables and "merge_curve" not in res.tables
    assert any(n.startswith("no held-out pruning curve: 10 rows") for n in res.notes)
    data = tmp_path / "d.txt"
    data.write_text("\n".join(TEXTS[:10]) + "\n", encoding="utf-8")
    for flags in (["--prune", "2", "--prune-out", tmp_path / "p"], ["--merge", "2"]):
        code = main([str(a) for a in ["importance", CK / "olmoe-tiny", "--data", data, "--out", tmp_path / "out",
                                      "--quiet", *flags]])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"{flags[0]}: 10 rows: a held-out pruning curve needs at least 20 rows" in err
        assert not (tmp_path / "out").exists() and not (tmp_path / "p").exists()
