"""Routing analyses, each checked against an independent computation from the raw tensors."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from routescope.analysis.export import columns as C
from routescope.analysis.runs import routing as R
from routescope.core_models import Ablation, tracing
from routescope.core_models.generate import generate
from routescope.core_models.sites import INDICES, LOGITS, OPTION_WEIGHTS, PROBS, ROLES, WEIGHTS
from tiny_models import TINY, tiny_model
from tolerances import assert_close_to_scale


def ids(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(seed))


def run(model, x, **kw):
    with torch.no_grad(), tracing() as tr:
        model(x, **kw)
    return tr


# --- Gumbel -----------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["gumbel_v1", "gumbel_v2"])
def test_gumbel_routes_match_recorded_logits(key):
    model = tiny_model(key)
    tr = run(model, ids(2, 6))
    df = R.gumbel_routes(tr, model)
    c = model.config
    assert len(df) == 2 * 6 * c.n_parallel_layers * (c.n_paths + 1)
    for i in range(c.n_parallel_layers):
        logits = tr[f"parallel.{i}.router.logits"]
        d = df[df[C.LAYER] == f"parallel.{i}"]
        for b in range(2):
            for t in range(6):
                rows = d[(d[C.BATCH] == b) & (d[C.POSITION] == t)].sort_values(C.OPTION)
                assert rows[C.ARGMAX].to_numpy().nonzero()[0].tolist() == [int(logits[b, t].argmax())]
                np.testing.assert_allclose(rows[C.PROB], torch.softmax(logits[b, t], -1).numpy(), rtol=1e-5, atol=1e-7)
                assert rows[C.SELECTED].sum() == 1
    assert df[C.STABILITY].isna().all()
    assert df[df[C.OPTION] == c.n_paths][C.LABEL].eq("combined").all()


def test_gumbel_selected_is_the_recorded_choice_under_sampling_and_forcing():
    model = tiny_model("gumbel_v1")
    tr = run(model, ids(1, 12), routing="sampled", seed=3)
    df = R.gumbel_routes(tr, model)
    choice = tr["parallel.1.router.choice"][0]
    sel = df[(df[C.LAYER] == "parallel.1") & df[C.SELECTED]].sort_values(C.POSITION)
    assert sel[C.OPTION].tolist() == choice.tolist()
    tr = run(model, ids(1, 5), ablation=Ablation(force=(("parallel.0", 3),)))
    df = R.gumbel_routes(tr, model)
    assert df[(df[C.LAYER] == "parallel.0") & df[C.SELECTED]][C.OPTION].eq(3).all()


def test_gumbel_stability_is_the_gumbel_max_probability():
    """Gumbel-max trick: P(argmax(logits + G) = i) = softmax(logits)_i, so the stability of a
    token estimates the probability of its noise-free argmax."""
    model = tiny_model("gumbel_v2")
    tr = run(model, ids(1, 4))
    n = 4000
    df = R.gumbel_routes(tr, model, n_samples=n, seed=7)
    top = df[df[C.ARGMAX]]
    p = top[C.PROB].to_numpy()
    sigma = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(top[C.STABILITY].to_numpy() - p) < 5 * sigma + 1e-3)
    again = R.gumbel_routes(tr, model, n_samples=n, seed=7)
    pd.testing.assert_frame_equal(df, again)  # seeded: reproducible


def test_gumbel_routes_rejects_other_models():
    with pytest.raises(ValueError, match="Gumbel"):
        R.gumbel_routes(run(tiny_model("share_linear"), ids(1, 3)), tiny_model("share_linear"))


# --- top-k ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["moep", "moep_swiglu"])
def test_topk_routes_utilisation_and_coselection(key):
    model = tiny_model(key)
    tr = run(model, ids(2, 7))
    routes = R.topk_routes(tr, model)
    util = R.topk_utilisation(tr, model)
    co = R.topk_coselection(tr, model)
    layers = ["moe_shrink", "parallel.0", "parallel.1", "moe_grow"]
    assert list(R.topk_layers(tr, model)) == layers
    for layer in layers:
        probs = tr[f"{layer}.router.probs"]
        n = probs.shape[-1]
        k = tr[f"{layer}.router.indices"].shape[-1]
        top = torch.topk(probs, k, dim=-1)
        d = routes[routes[C.LAYER] == layer]
        counts = [0] * n
        pairs = {p: 0 for p in itertools.combinations(range(n), 2)}
        for b in range(2):
            for t in range(7):
                r = d[(d[C.BATCH] == b) & (d[C.POSITION] == t)].sort_values(C.RANK)
                assert r[C.OPTION].tolist() == top.indices[b, t].tolist()
                np.testing.assert_allclose(r[C.PROB], top.values[b, t].numpy(), rtol=1e-6)
                np.testing.assert_allclose(r[C.WEIGHT], (top.values[b, t] / top.values[b, t].sum()).numpy(), rtol=1e-5)
                chosen = sorted(top.indices[b, t].tolist())
                for o in chosen:
                    counts[o] += 1
                for p in itertools.combinations(chosen, 2):
                    pairs[p] += 1
        u = util[util[C.LAYER] == layer].sort_values(C.OPTION)
        assert u[C.COUNT].tolist() == counts
        np.testing.assert_allclose(u[C.SHARE], np.array(counts) / 14)
        assert math.isclose(u[C.SHARE].sum(), k)
        cc = co[co[C.LAYER] == layer]
        assert {(a, b): c for a, b, c in zip(cc[C.OPTION_A], cc[C.OPTION_B], cc[C.COUNT])} == pairs


# --- cosine dominance -------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["share_linear", "gumbel_v1"])
def test_cosine_dominance_by_a_loop(key):
    model = tiny_model(key)
    tr = run(model, ids(2, 5))
    df = R.cosine_dominance(tr, model)
    c = model.config
    assert len(df) == 2 * 5 * c.n_parallel_layers * c.n_paths
    for i in range(c.n_parallel_layers):
        comb = tr[f"parallel.{i}.combined"]
        for b in range(2):
            for t in range(5):
                cos = [float(F.cosine_similarity(tr[f"parallel.{i}.paths.{j}.out"][b, t], comb[b, t], dim=0))
                       for j in range(c.n_paths)]
                rows = df[(df[C.LAYER] == f"parallel.{i}") & (df[C.BATCH] == b) & (df[C.POSITION] == t)]
                rows = rows.sort_values(C.OPTION)
                # a cosine is a dot product over |u| |v|: its rounding is eps of 1, whatever its value
                assert_close_to_scale(rows[C.COSINE].to_numpy(), cos, 16, scale=1.0, msg="cosine")
                assert rows[C.DOMINANT].tolist() == [j == int(np.argmax(cos)) for j in range(c.n_paths)]


def test_cosine_undefined_for_fused_grow_layer():
    model = tiny_model("share_linear", fused_grow=True)
    df = R.cosine_dominance(run(model, ids(1, 4)), model)
    last = df[df[C.LAYER] == "parallel.1"]
    assert last[C.COSINE].isna().all() and not last[C.DOMINANT].any()
    assert df[df[C.LAYER] == "parallel.0"][C.COSINE].notna().all()
    assert any("parallel.1" in n for n in df.attrs["notes"])


def test_cosine_skips_dropped_paths():
    model = tiny_model("share_linear")
    df = R.cosine_dominance(run(model, ids(1, 4), ablation=Ablation(drop=(("parallel.0", 1),))), model)
    assert sorted(set(df[df[C.LAYER] == "parallel.0"][C.OPTION])) == [0, 2]


# --- ParallelGPT ------------------------------------------------------------------------------

@pytest.mark.parametrize("key,drop", [("pgpt", None), ("pgpt3", None), ("pgpt_sigmoid", None), ("pgpt3", 1)])
def test_pgpt_norm_shares(key, drop):
    model = tiny_model(key)
    ab = Ablation(drop=(("paths", drop),)) if drop is not None else None
    tr = run(model, ids(2, 4), ablation=ab)
    df = R.pgpt_paths(tr, model)
    P = model.config.n_paths
    if model.config.mix == "sigmoid":
        s = torch.sigmoid(model.mixer.w.detach())
        w = torch.stack((s, 1 - s))
    else:
        w = torch.softmax(model.mixer.w.detach(), 0)
    if drop is not None:
        w[drop] = 0
        w = w / w.sum()
    for b in range(2):
        for t in range(4):
            norms = [0.0 if j == drop else float(torch.linalg.norm(w[j] * tr[f"paths.{j}.out"][b, t]))
                     for j in range(P)]
            rows = df[(df[C.BATCH] == b) & (df[C.POSITION] == t)].sort_values(C.OPTION)
            np.testing.assert_allclose(rows[C.WEIGHT], w.numpy(), rtol=1e-6)
            np.testing.assert_allclose(rows[C.SHARE], np.array(norms) / sum(norms), rtol=1e-5)
            assert rows[C.DOMINANT].tolist() == [j == int(np.argmax(norms)) for j in range(P)]


# --- Wiola --------------------------------------------------------------------------------------

def _cos(u: torch.Tensor, v: torch.Tensor) -> float:
    u, v = u.double().tolist(), v.double().tolist()
    dot = sum(a * b for a, b in zip(u, v))
    return dot / max(math.sqrt(sum(a * a for a in u)) * math.sqrt(sum(b * b for b in v)), 1e-8)


def _loop_pairs(hidden: torch.Tensor, tau: float) -> list[tuple[int, int]]:
    """Greedy left-to-right merging by a plain loop over hand-computed cosines."""
    T = hidden.shape[0]
    pairs, t = [], 0
    while t < T - 1:
        if _cos(hidden[t], hidden[t + 1]) > tau:
            pairs.append((t, t + 1))
            t += 2
        else:
            t += 1
    return pairs


@pytest.fixture(scope="module")
def wiola_atm():
    model = tiny_model("wiola", atm_tau=0.3)
    x = torch.tensor([[5, 5, 5, 9, 9, 1, 2, 2, 2, 2, 7, 3], [4, 8, 8, 8, 1, 1, 6, 0, 0, 3, 3, 3]])
    return model, run(model, x, atm=True)


def test_atm_merge_map_by_a_loop_at_the_models_tau_and_another(wiola_atm):
    model, tr = wiola_atm
    active = [f"blocks.{i}.atm" for i in model.config.atm_layers]
    df = R.atm_merges(tr, model)
    assert sorted(set(df[C.LAYER])) == active
    total_pairs = 0
    for layer in active:
        hidden, mm = tr[f"{layer}.hidden"], tr[f"{layer}.merge_map"]
        for b in range(2):
            rows = df[(df[C.LAYER] == layer) & (df[C.BATCH] == b)].sort_values(C.POSITION)
            want = _loop_pairs(hidden[b], model.config.atm_tau)
            total_pairs += len(want)
            got = [(t, int(p)) for t, p in zip(rows[C.POSITION], rows[C.PARTNER]) if p is not pd.NA and p > t]
            assert got == want
            recorded = [(t, t + 1) for t in range(mm.shape[1] - 1) if mm[b, t] == mm[b, t + 1]]
            assert recorded == want
            assert rows[C.GROUP].tolist() == mm[b].tolist()
            assert_close_to_scale(rows[C.ADJACENT_COS].to_numpy()[:-1],  # float32 vs a float64 loop: eps of 1
                                  [_cos(hidden[b, t], hidden[b, t + 1]) for t in range(11)], 16, scale=1.0)
            mu = len(want) / 12
            assert rows[C.MU].iloc[0] == pytest.approx(mu)
            assert rows[C.FLOP_SAVING].iloc[0] == pytest.approx(mu * (2 - mu))
    assert total_pairs > 0  # the input was built to merge
    for tau in (0.6, 0.95, -1.0):
        df = R.atm_merges(tr, model, tau=tau)
        s = R.atm_summary(tr, model, tau=tau)
        for layer in active:
            for b in range(2):
                rows = df[(df[C.LAYER] == layer) & (df[C.BATCH] == b)]
                want = _loop_pairs(tr[f"{layer}.hidden"][b], tau)
                got = [(t, int(p)) for t, p in zip(rows[C.POSITION], rows[C.PARTNER]) if p is not pd.NA and p > t]
                assert got == want
                srow = s[(s[C.LAYER] == layer) & (s[C.BATCH] == b)]
                assert int(srow[C.N_PAIRS].iloc[0]) == len(want)
                assert srow[C.MU].iloc[0] == pytest.approx(len(want) / 12)
    assert R.atm_summary(tr, model, tau=-1.0)[C.N_PAIRS].eq(6).all()  # everything merges: T / 2 pairs


def test_merge_pairs_never_overlap():
    assert R.merge_pairs([0.99, 0.99, 0.99, 0.1, 0.99], 0.9) == [(0, 1), (2, 3), (4, 5)]
    assert R.merge_pairs([0.1, 0.99, 0.99, 0.1], 0.9) == [(1, 2)]
    assert R.merge_pairs([], 0.5) == []


def test_dsff_gates_and_gcla_betas(wiola_atm):
    model, tr = wiola_atm
    df = R.dsff_gates(tr, model)
    assert len(df) == 2 * 12 * model.config.n_layers
    for i in range(model.config.n_layers):
        gate = tr[f"blocks.{i}.dsff.gate"]
        assert gate.shape[:2] == (2, 12)  # per token, also in ATM blocks
        rows = df[df[C.LAYER] == f"blocks.{i}.dsff"]
        for b in range(2):
            for t in range(12):
                g = gate[b, t]
                got = rows[(rows[C.BATCH] == b) & (rows[C.POSITION] == t)][C.GATE_MEAN].item()
                assert got == pytest.approx(float(g.mean()), rel=1e-5)
    betas = R.gcla_betas(tr, model)
    assert betas[C.LAYER].tolist() == [f"blocks.{i}.attn" for i in range(1, model.config.n_layers)]
    want = [float(torch.sigmoid(model.blocks[i].attn.phi.detach())) for i in range(1, model.config.n_layers)]
    np.testing.assert_allclose(betas[C.BETA], want, rtol=1e-6)


# --- PAGMLP -----------------------------------------------------------------------------------

def test_pagmlp_pathways_from_model_weights():
    model = tiny_model("pagmlp")
    tr = run(model, ids(2, 3))
    df = R.pagmlp_pathways(tr, model)
    for i, block in enumerate(model.blocks):
        ffn = block.ffn
        W = ffn.down.weight.detach()
        half = ffn.half
        s, g = tr[f"blocks.{i}.ffn.swiglu_out"], tr[f"blocks.{i}.ffn.geglu_out"]
        # the two contributions add up to the layer's down projection
        # the same sum in two parts (reassociated): a few eps of the output's scale (measured 1.9)
        assert_close_to_scale(s @ W[:, :half].T + g @ W[:, half:].T, ffn.down(torch.cat((s, g), -1)), 16,
                              msg="the down projection split in two")
        rows = df[df[C.LAYER] == f"blocks.{i}.ffn"]
        for b in range(2):
            for t in range(3):
                n0 = float(torch.linalg.norm(W[:, :half] @ s[b, t]))
                n1 = float(torch.linalg.norm(W[:, half:] @ g[b, t]))
                r = rows[(rows[C.BATCH] == b) & (rows[C.POSITION] == t)].sort_values(C.OPTION)
                np.testing.assert_allclose(r[C.OUT_NORM], [n0, n1], rtol=1e-5)
                np.testing.assert_allclose(r[C.SHARE], [n0 / (n0 + n1), n1 / (n0 + n1)], rtol=1e-5)
                np.testing.assert_allclose(r[C.ACT_NORM], [float(s[b, t].norm()), float(g[b, t].norm())], rtol=1e-5)
        np.testing.assert_allclose(rows[rows[C.OPTION] == 0][C.SCALE], float(torch.sigmoid(ffn.a.detach())), rtol=1e-6)
        np.testing.assert_allclose(rows[rows[C.OPTION] == 1][C.SCALE], float(torch.sigmoid(ffn.b.detach())), rtol=1e-6)


# --- the export table for every family --------------------------------------------------------

EXPECTED_KINDS = {
    "gumbel_v1": {"prob", "cosine"}, "gumbel_v2": {"prob", "cosine"}, "share_linear": {"cosine"},
    "moep": {"prob", "weight"}, "moep_swiglu": {"prob", "weight"}, "pgpt": {"weight", "contribution"},
    "pgpt3": {"weight", "contribution"}, "wiola": {"gate_mean", "beta"},
    "pagmlp": {"alpha", "beta", "norm", "contribution"}, "llama": set(),
}


@pytest.mark.parametrize("key", sorted(EXPECTED_KINDS))
def test_routing_table_schema_for_every_family(key):
    from routescope.analysis.export.run_table import ExportMeta, RowMeta, routing_table

    model = tiny_model(key)
    x = ids(2, 5, seed=1)
    tr = run(model, x)
    rows = [RowMeta(f"p{b}", x[b].tolist(), [f"<{i}>" for i in x[b].tolist()]) for b in range(2)]
    df = routing_table(tr, model, meta=ExportMeta(model="m", rows=rows, seed=3))
    assert list(df.columns) == list(C.EXPORT_SCHEMA)
    assert {c: str(t) for c, t in df.dtypes.items()} == C.EXPORT_SCHEMA
    assert set(df[C.KIND]) == EXPECTED_KINDS[key]
    assert set(df[C.KIND]) <= set(C.KINDS)
    tok = df[df[C.POSITION].notna()]
    for pid, pos, tid, text in zip(tok[C.PROMPT_ID], tok[C.POSITION], tok[C.TOKEN_ID], tok[C.TOKEN]):
        b = int(pid[1:])
        assert tid == int(x[b, pos]) and text == f"<{tid}>"
    assert tok[C.PHASE].eq("prompt").all()
    assert df[C.POSITION].isna().eq(df[C.PHASE].isna()).all()
    assert df[C.SEED].eq(3).all() and df[C.ABLATION].eq("none").all()


def test_routing_table_counts_for_gumbel():
    from routescope.analysis.export.run_table import ExportMeta, RowMeta, routing_table

    model = tiny_model("gumbel_v1")
    tr = run(model, ids(1, 4))
    df = routing_table(tr, model, meta=ExportMeta(model="m", rows=[RowMeta("a", list(range(4)))]))
    c = model.config
    assert (df[C.KIND] == "prob").sum() == 4 * c.n_parallel_layers * (c.n_paths + 1)
    assert (df[C.KIND] == "cosine").sum() == 4 * c.n_parallel_layers * c.n_paths
    prob = df[df[C.KIND] == "prob"]
    assert prob.groupby([C.POSITION, C.LAYER])[C.SELECTED].sum().eq(1).all()
    np.testing.assert_allclose(prob.groupby([C.POSITION, C.LAYER])[C.VALUE].sum(), 1.0, rtol=1e-5)


def test_routing_table_from_a_generation_trace_marks_generated_positions():
    from routescope.analysis.export.run_table import ExportMeta, RowMeta, routing_table

    model = tiny_model("moep")
    g = generate(model, [1, 2, 3], max_new_tokens=4, trace_sites=None)
    meta = ExportMeta(model="m", rows=[RowMeta("a", g.ids, n_prompt=len(g.prompt_ids))])
    df = routing_table(g.trace, model, meta=meta)
    assert sorted(set(df[C.POSITION].dropna().astype(int))) == list(range(7))
    gen = df[df[C.PHASE] == "generated"]
    assert sorted(set(gen[C.POSITION].astype(int))) == [3, 4, 5, 6]
    assert gen[C.TOKEN_ID].astype(int).tolist() == [g.ids[p] for p in gen[C.POSITION].astype(int)]


def test_routing_table_wiola_with_atm_has_merge_rows(wiola_atm):
    from routescope.analysis.export.run_table import ExportMeta, RowMeta, routing_table

    model, tr = wiola_atm
    rows = [RowMeta(str(b), list(range(12))) for b in range(2)]
    df = routing_table(tr, model, meta=ExportMeta(model="m", rows=rows))
    merges = R.atm_merges(tr, model)
    m = df[df[C.KIND] == "merge"]
    assert len(m) == len(merges)
    assert m[C.SELECTED].sum() == merges[C.MERGED].sum()
    assert (df[C.KIND] == "adjacent_cos").sum() == len(merges) - 2 * len(model.config.atm_layers)


# --- routing roles ------------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(TINY))
def test_every_role_names_a_site_the_forward_records(key):
    """A layer's roles name sites of its model, and a traced call records each (CHOICE and the
    Gumbel candidate weights at inference too); MoEP's top-k layers declare their picks."""
    model = tiny_model(key)
    tr = run(model, ids(1, 5))
    for layer, m in model.routing_modules.items():
        for role, site in m.roles.items():
            assert role in ROLES
            if role != OPTION_WEIGHTS or site in model.sites:  # the generic role is optional
                assert site in model.sites and site in tr, (layer, role, site)
        if key.startswith("moep"):  # every MoEP layer routes top-k
            assert {LOGITS, PROBS, INDICES, WEIGHTS} <= set(m.roles)


def test_the_merge_view_says_when_token_merging_is_not_causal():
    from routescope.analysis.families import wiola as A

    model = tiny_model("wiola")
    x = ids(1, 12)
    for options, said in (({"atm_tau": -1.0}, True), ({"atm_tau": -1.0, "atm_causal": True}, False)):
        second = A.wiola_merge_pass(model, x[0].tolist(), Ablation(), options)
        views = A.wiola_views(run(model, x), model, second=second, options=options)
        notes = views["atm_merges"].frame.attrs.get("notes", [])
        assert (A.NON_CAUSAL_ATM in notes) is said


@pytest.mark.parametrize("key", ["moep", "gumbel_v2", "pgpt"])
def test_router_entropy_per_layer_by_a_plain_loop(key):
    """The generic view over each layer's PROBS role: mean token entropy (nats and over log n) and
    the entropy of the mean distribution, against a loop over tokens; families whose routers record
    no probabilities (pgpt's learned mixes) get no such view."""
    model = tiny_model(key)
    x = ids(2, 7)
    tr = run(model, x)
    df = R.router_entropy(tr, model)
    with_probs = [(l, m.roles[PROBS]) for l, m in model.routing_modules.items() if m.roles.get(PROBS) in tr]
    if not with_probs:
        assert df is None
        return
    assert list(df["layer"]) == [l for l, _ in with_probs]
    for (layer, site), row in zip(with_probs, df.itertuples()):
        p = tr[site].double().numpy().reshape(-1, tr[site].shape[-1])
        n = p.shape[1]
        h = [-sum(q * math.log(q) for q in token if q > 0) for token in p]
        mean = p.mean(0)
        assert row.options == n and row.tokens == len(p)
        assert row.token_entropy == pytest.approx(sum(h) / len(h), rel=1e-9)
        assert row.token_entropy_norm == pytest.approx(sum(h) / len(h) / math.log(n), rel=1e-9)
        assert row.mean_entropy_norm == pytest.approx(-sum(q * math.log(q) for q in mean if q > 0) / math.log(n),
                                                      rel=1e-9)
        assert 0 <= row.token_entropy_norm <= row.mean_entropy_norm + 1e-12 <= 1 + 1e-12  # concavity of H
