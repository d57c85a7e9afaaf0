"""Corpus statistics (analysis.corpus.stats, reductions, compare, run): every table recomputed from the raw
routes by plain loops over tokens, padding never counted; the model loop against each prompt run
alone; the Table 6 reading against analysis.runs.domain; comparisons."""
from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch

from routescope.analysis.corpus import stats as S
from routescope.analysis.corpus import compare as CMP
from routescope.analysis.corpus import reductions as RD
from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus import shipped as SH
from routescope.analysis.corpus import run as R
from routescope.analysis.corpus import values as V
from routescope.analysis.runs import domain as DOM
from routescope.analysis.runs.family_table import route_reader
from routescope.analysis.export.run_table import ExportMeta, RowMeta, routing_table
from routescope.core_models import tracing
from routescope.core_models.checkpoint import load_checkpoint
from tolerances import EPS32, FORWARD_EPS

N_OPTIONS = (4, 4, 3)
LAYERS = ("a.0", "a.1", "a.2")
VOCAB = 12
COLUMNS = ("domain", "expected_path")


def _batches(seed: int = 0, n_batches: int = 4, B: int = 5, T: int = 7, k: int = 2) -> list[dict]:
    """Random batches: routes 0..n_l (0 undefined) with top-k picks consistent with them, and
    garbage (non-zero routes, ids) at padded positions so a count that reads them is caught."""
    rng = np.random.default_rng(seed)
    L = len(LAYERS)
    out = []
    for _ in range(n_batches):
        lengths = rng.integers(1, T + 1, size=B)
        routes = np.zeros((L, B, T), dtype=np.int64)
        topk = np.zeros((L, B, T, k), dtype=np.int64)
        for l, n_l in enumerate(N_OPTIONS):
            for b in range(B):
                for t in range(T):
                    if t >= lengths[b]:
                        routes[l, b, t] = rng.integers(1, n_l + 1)  # padding: must never count
                        topk[l, b, t] = rng.integers(1, n_l + 1, size=k)
                        continue
                    if l == 2 and rng.random() < 0.15:
                        continue  # undefined
                    # option 3 of layer 0 is never picked (dead); option 0 of layer 1 most often
                    weights = np.array([0.3, 0.4, 0.3, 0.0]) if l == 0 else \
                        (np.array([0.8, 0.1, 0.05, 0.05]) if l == 1 else np.ones(n_l) / n_l)
                    size = 1 if l == 1 else min(k, n_l - (l == 0))  # layer 1 picks one: its k padded with 0
                    picks = rng.choice(n_l, size=size, replace=False,
                                       p=weights[:n_l] / weights[:n_l].sum())
                    routes[l, b, t] = picks[0] + 1
                    topk[l, b, t, :len(picks)] = picks + 1
        ids = rng.integers(0, VOCAB, size=(B, T))
        pred = (ids * 5 + 1 + rng.integers(0, 2, size=(B, T))) % VOCAB
        domains = [str(rng.choice(["story", "math", "code"])) for _ in range(B)]
        expected = ["1" if d == "story" else ("2" if d == "math" else "x") for d in domains]
        out.append(dict(routes=routes, lengths=lengths, ids=ids, pred=pred, topk=topk, labels=[domains, expected]))
    return out


def _stats(batches, k: int = 2) -> S.RouteStats:
    layout = S.Layout(LAYERS, N_OPTIONS, tuple(tuple(f"o{o}" for o in range(n)) for n in N_OPTIONS), k, COLUMNS)
    st = S.RouteStats(layout, VOCAB)
    for bt in batches:
        st.add(bt["routes"], bt["lengths"], input_ids=bt["ids"], predicted=bt["pred"], topk=bt["topk"],
               labels=bt["labels"])
    return st


def _tokens(batches):
    """Every real token: (batch dict, row b, position t, is the row's last token)."""
    for bt in batches:
        for b, n in enumerate(bt["lengths"]):
            for t in range(n):
                yield bt, b, t, t == n - 1


@pytest.fixture(scope="module")
def data():
    batches = _batches()
    return batches, _stats(batches)


def test_utilisation_and_flags_equal_plain_counts(data):
    batches, st = data
    got = RD.utilisation(st).set_index(["layer", "option"])
    for l, layer in enumerate(LAYERS):
        first, slots, defined = Counter(), Counter(), 0
        for bt, b, t, _ in _tokens(batches):
            r = bt["routes"][l, b, t]
            if r:
                defined += 1
                first[r - 1] += 1
            for p in bt["topk"][l, b, t]:
                if p:
                    slots[p - 1] += 1
        n_slots = sum(slots.values())
        for o in range(N_OPTIONS[l]):
            row = got.loc[(layer, o)]
            assert row["n_tokens"] == defined and row["first"] == first[o] and row["tokens"] == slots[o]
            assert math.isclose(row["first_share"], first[o] / defined, rel_tol=1e-12)
            assert math.isclose(row["token_share"], slots[o] / defined, rel_tol=1e-12)
            assert math.isclose(row["slot_share"], slots[o] / n_slots, rel_tol=1e-12)
            uniform = 1 / N_OPTIONS[l]
            assert row["dead"] == (slots[o] / n_slots < 0.01 * uniform)
            assert row["overloaded"] == (slots[o] / n_slots > 2 * uniform)
    assert got.loc[("a.0", 3), "dead"] and got.loc[("a.1", 0), "overloaded"]  # the data were made so
    assert not got.loc[("a.2", 0), "dead"] and not got.loc[("a.2", 0), "overloaded"]


def test_without_topk_slots_are_first_choices():
    batches = _batches(seed=1)
    layout = S.Layout(LAYERS, N_OPTIONS, tuple(tuple(f"o{o}" for o in range(n)) for n in N_OPTIONS), 1, ())
    st = S.RouteStats(layout, VOCAB)
    for bt in batches:
        st.add(bt["routes"], bt["lengths"], input_ids=bt["ids"])
    u = RD.utilisation(st)
    assert (u["slots"] == u["first"]).all() and np.allclose(u["slot_share"], u["first_share"])
    assert RD.specialisation(st, min_count=1)["by"].eq("input").all()  # no predicted tokens given


def test_label_shares_and_accuracy_equal_plain_counts(data):
    batches, st = data
    shares = RD.label_shares(st)
    intended = {"expected_path": {"1": 0, "2": 1}, "domain": {"story": 0, "code": 2}}
    acc = RD.accuracy(st, intended).set_index(["label_column", "label_value", "reading", "layer"])
    for c, column in enumerate(COLUMNS):
        counts = Counter()  # (value, reading, layer, option)
        for bt, b, t, last in _tokens(batches):
            for l in range(len(LAYERS)):
                r = bt["routes"][l, b, t]
                if r:
                    counts[(bt["labels"][c][b], "token", l, r - 1)] += 1
                    if last:
                        counts[(bt["labels"][c][b], "last token", l, r - 1)] += 1
        for row in shares[shares["label_column"] == column].itertuples():
            l = LAYERS.index(row.layer)
            n = sum(counts[(row.label_value, row.reading, l, o)] for o in range(N_OPTIONS[l]))
            assert row.count == counts[(row.label_value, row.reading, l, row.option)] and row.n == n
            assert math.isclose(row.share, row.count / n, rel_tol=1e-12) if n else math.isnan(row.share)
        assert set(shares[shares["label_column"] == column]["label_value"]) == {v for v, *_ in counts}
        for reading in S.READINGS:
            tot_c = tot_n = 0
            for value, o in intended[column].items():
                all_c = all_n = 0
                for l, layer in enumerate(LAYERS):
                    correct = counts[(value, reading, l, o)]
                    n = sum(counts[(value, reading, l, x)] for x in range(N_OPTIONS[l]))
                    row = acc.loc[(column, value, reading, layer)]
                    assert (row["correct"], row["n"], row["intended"]) == (correct, n, o)
                    assert math.isclose(row["accuracy"], correct / n, rel_tol=1e-12)
                    all_c, all_n = all_c + correct, all_n + n
                assert math.isclose(acc.loc[(column, value, reading, S.ALL_LAYERS), "accuracy"], all_c / all_n,
                                    rel_tol=1e-12)
                tot_c, tot_n = tot_c + all_c, tot_n + all_n
            assert math.isclose(acc.loc[(column, S.ALL, reading, S.ALL_LAYERS), "accuracy"], tot_c / tot_n,
                                rel_tol=1e-12)
    assert "x" not in set(acc.reset_index()["label_value"])  # a value with no intended option has no row


def test_co_routing_equals_plain_pair_counts(data):
    batches, st = data
    got = RD.co_routing(st).set_index(["layer_a", "option_a", "layer_b", "option_b"])
    pairs = [(i, j) for i in range(3) for j in range(i + 1, 3)]
    assert len(got) == sum(N_OPTIONS[i] * N_OPTIONS[j] for i, j in pairs)
    for i, j in pairs:
        c = Counter()
        for bt, b, t, _ in _tokens(batches):
            ri, rj = bt["routes"][i, b, t], bt["routes"][j, b, t]
            if ri and rj:
                c[(ri - 1, rj - 1)] += 1
        both = sum(c.values())
        for a in range(N_OPTIONS[i]):
            from_a = sum(c[(a, x)] for x in range(N_OPTIONS[j]))
            for b_ in range(N_OPTIONS[j]):
                row = got.loc[(LAYERS[i], a, LAYERS[j], b_)]
                assert row["count"] == c[(a, b_)]
                assert math.isclose(row["share"], c[(a, b_)] / both, rel_tol=1e-12)
                if from_a:
                    assert math.isclose(row["p_b_given_a"], c[(a, b_)] / from_a, rel_tol=1e-12)
                else:
                    assert math.isnan(row["p_b_given_a"])


def test_layer_pairs_beyond_the_limit_are_adjacent():
    assert S.layer_pairs(3) == [(0, 1), (0, 2), (1, 2)]
    assert S.layer_pairs(S.MAX_ALL_PAIRS + 2) == [(i, i + 1) for i in range(S.MAX_ALL_PAIRS + 1)]


def _g2(a, nt, no, N) -> float:
    cells = [(a, nt * no / N), (nt - a, nt * (N - no) / N), (no - a, (N - nt) * no / N),
             (N - nt - no + a, (N - nt) * (N - no) / N)]
    return 2 * sum(o * math.log(o / e) for o, e in cells if o > 0)


@pytest.mark.parametrize("min_count,top", [(1, 3), (3, 2)])
def test_specialisation_equals_plain_counts_and_g2(data, min_count, top):
    batches, st = data
    got = RD.specialisation(st, top=top, min_count=min_count, decode=lambda i: f"<{i}>")
    for by, key in (("input", "ids"), ("predicted", "pred")):
        for l, layer in enumerate(LAYERS):
            c = Counter()
            for bt, b, t, _ in _tokens(batches):
                r = bt["routes"][l, b, t]
                if r:
                    c[(r - 1, int(bt[key][b, t]))] += 1
            N = sum(c.values())
            for o in range(N_OPTIONS[l]):
                no = sum(v for (x, _), v in c.items() if x == o)
                rows = []
                for (x, tok), a in c.items():
                    nt = sum(v for (_, y), v in c.items() if y == tok)
                    if x == o and a > nt * no / N and a >= min_count:
                        rows.append((round(_g2(a, nt, no, N), 9), a, tok, nt))
                rows.sort(key=lambda r: (-r[0], -r[1], r[2]))
                want = rows[:top]
                g = got[(got["by"] == by) & (got["layer"] == layer) & (got["option"] == o)]
                assert list(g["token_id"]) == [r[2] for r in want], (by, layer, o)
                assert list(g["rank"]) == list(range(len(want)))
                assert list(g["token"]) == [f"<{r[2]}>" for r in want]
                for row, (g2, a, tok, nt) in zip(g.itertuples(), want):
                    assert (row.count, row.token_count) == (a, nt)
                    assert math.isclose(row.g2, g2, rel_tol=1e-9, abs_tol=1e-9)
                    assert math.isclose(row.lift, (a / nt) / (no / N), rel_tol=1e-12)
                    assert math.isclose(row.p_value, math.erfc(math.sqrt(g2 / 2)), rel_tol=1e-6)
    assert (got["g2"] > 0).all() and (got["lift"] > 1).all()


def test_sparse_counts_equal_dense_counts(monkeypatch, data):
    batches, dense = data
    monkeypatch.setattr(S, "DENSE_MAX", 0)  # a large vocabulary's path
    sparse = _stats(batches)
    assert sparse.spec["input"].dense is None
    for by in S.BY_KINDS:
        kd, cd = dense.spec[by].items()
        ks, cs = sparse.spec[by].items()
        assert kd.tolist() == ks.tolist() and cd.tolist() == cs.tolist()
    pd.testing.assert_frame_equal(RD.specialisation(dense, min_count=1), RD.specialisation(sparse, min_count=1))


def test_value_stats_equal_plain_sums():
    rng = random.Random(0)
    layout = S.Layout(("paths", "blocks.0.ffn"), (2, 2), (("p0", "p1"), ("s", "g")), 1, ("domain",), routes=False)
    st = V.ValueStats(layout)
    rows_seen = []
    for _ in range(3):
        B = 4
        lengths = [rng.randint(1, 5) for _ in range(B)]
        labels = [[rng.choice(["a", "b"]) for _ in range(B)]]
        recs = []
        for b in range(B):
            for t in range(6):  # positions past the length: padding
                for layer in layout.layers:
                    for o in range(2):
                        recs.append((b, t, layer, "contribution", o, rng.random(), rng.random() < 0.5))
            for o in range(2):
                recs.append((b, -1, "paths", "weight", o, 0.25 + o * 0.5, None))
            recs.append((b, -1, "blocks.0.ffn", "alpha", pd.NA, 0.7, None))
        df = pd.DataFrame(recs, columns=["batch", "position", "layer", "kind", "option", "value", "selected"])
        df["selected"] = df["selected"].astype("boolean")
        df["option"] = df["option"].astype("Int64")
        st.add(df, lengths, labels)
        rows_seen += [(r, lengths[r[0]], labels[0][r[0]]) for r in recs]
    got = V.call_values(st).set_index(["label_column", "label_value", "layer", "kind", "option", "scope"])
    groups: dict[tuple, list] = {}
    for (b, t, layer, kind, o, v, sel), n, dom in rows_seen:
        if t >= n:
            continue
        scope = "per call" if t < 0 else "per token"
        o = pd.NA if o is pd.NA else o
        for key in (("(all)", "(all)"), ("domain", dom)):
            groups.setdefault((*key, layer, kind, o, scope), []).append((v, sel))
    assert len(got) == len(groups)
    for key, vals in groups.items():
        row = got.loc[key]
        xs = [v for v, _ in vals]
        mean = sum(xs) / len(xs)
        assert row["n"] == len(xs)
        assert math.isclose(row["mean"], mean, rel_tol=1e-12)
        assert math.isclose(row["std"], math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)), rel_tol=1e-6,
                            abs_tol=1e-12)
        assert (row["min"], row["max"]) == (min(xs), max(xs))
        sel = [s for _, s in vals if s is not None]
        if sel:
            assert math.isclose(row["selected_share"], sum(sel) / len(sel), rel_tol=1e-12)
        else:
            assert math.isnan(row["selected_share"])


# --- the model loop ----------------------------------------------------------------------------------

def _prompts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    from routescope.corpora.corpus import iter_documents
    rng, docs = random.Random(seed), [iter_documents(d, seed) for d in ("story", "math")]
    out = []
    for i in range(n):
        words = next(docs[i % 2]).split()
        out.append((("story", "math")[i % 2], " ".join(words[: rng.randint(1, 30)])))
    return out


def _alone(model, tok, text: str, limit: int):
    """(routes (L, T), picks (L, T, k) or None, predicted (T,), ids (T,), clear): one prompt run alone
    with every site traced, read from the raw tensors: a Gumbel router's recorded choice, a top-k
    router's indices; clear = every decision (top-k margins, logit top-2) beyond float noise."""
    ids = tok.encode(text).ids[:limit]
    with torch.inference_mode(), tracing() as tr:
        logits = model(torch.tensor([ids])).logits[0].double()
    reader = route_reader(model)
    routes, picks, clear = [], [], True
    top2 = logits.topk(2, -1).values
    clear &= bool(((top2[:, 0] - top2[:, 1]) > FORWARD_EPS * EPS32 * logits.abs().max()).all())
    for layer in reader.layers:
        if f"{layer}.router.indices" in tr:
            probs = tr[f"{layer}.router.probs"][0].double()
            idx = tr[f"{layer}.router.indices"][0]
            k = idx.shape[-1]
            routes.append((idx[:, 0] + 1).tolist())
            picks.append((idx + 1).tolist())
            top = probs.topk(min(k + 1, probs.shape[-1]), -1).values
            clear &= bool(((top[:, :-1] - top[:, 1:]) > FORWARD_EPS * EPS32).all())
        else:
            logit = tr[f"{layer}.router.logits"][0].double()
            routes.append((tr[f"{layer}.router.choice"][0] + 1).tolist())
            t2 = logit.topk(2, -1).values
            clear &= bool(((t2[:, 0] - t2[:, 1]) > FORWARD_EPS * EPS32 * logit.abs().max()).all())
    return routes, picks or None, logits.argmax(-1).tolist(), ids, clear


@pytest.mark.parametrize("key", ["gumbel_v1", "moep"])
def test_run_corpus_counts_equal_prompts_run_alone(key, checkpoint, tmp_path):
    """Padded batches (odd batch and chunk sizes, rows sorted by length) count exactly what each
    prompt run alone gives, over prompts whose every decision is clear of float noise."""
    model, tok = load_checkpoint(checkpoint(key))
    limit = 20
    alone = {text: (dom, _alone(model, tok, text, limit)) for dom, text in _prompts(60)}
    keep = [(dom, text, a) for text, (dom, a) in alone.items() if a[4]]
    assert len(keep) >= 30, "too few prompts clear of float noise to compare"
    f = tmp_path / "d.tsv"
    f.write_text("text\tdomain\n" + "".join(f"{t}\t{d}\n" for d, t, _ in keep), encoding="utf-8")
    data = D.load_corpus(f)
    res = R.run_corpus(model, tok, data, name=key, settings=R.CorpusSettings(max_tokens=limit, batch_size=7,
                                                                             chunk_size=16))
    st = res.stats
    reader = route_reader(model)
    first, slots, spec_in, spec_pred, by_dom = Counter(), Counter(), Counter(), Counter(), Counter()
    for dom, _, (routes, picks, pred, ids, _) in keep:
        for l in range(len(reader.layers)):
            for t, r in enumerate(routes[l]):
                first[(l, r - 1)] += 1
                spec_in[(l, r - 1, ids[t])] += 1
                spec_pred[(l, r - 1, pred[t])] += 1
                by_dom[(dom, l, r - 1)] += 1
                for p in (picks[l][t] if picks else [r]):
                    slots[(l, p - 1)] += 1
    u = RD.utilisation(st)
    assert st.n_rows == len(keep) and st.n_tokens == sum(len(a[3]) for _, _, a in keep)
    assert [int(x) for x in u["first"]] == [first[(reader.layers.index(l), o)] for l, o in zip(u["layer"], u["option"])]
    assert [int(x) for x in u["slots"]] == [slots[(reader.layers.index(l), o)] for l, o in zip(u["layer"], u["option"])]
    picks_k = {len(a[1][l][0]) for _, _, a in keep if a[1] for l in range(len(reader.layers))}
    assert res.layout.k == max(picks_k, default=1)
    shares = RD.label_shares(st)
    tok_rows = shares[shares["reading"] == "token"]
    assert [int(x) for x in tok_rows["count"]] == [by_dom[(v, reader.layers.index(l), o)] for v, l, o in
                                                   zip(tok_rows["label_value"], tok_rows["layer"], tok_rows["option"])]
    V = st.vocab_size
    n1 = res.layout.n + 1
    for by, want in (("input", spec_in), ("predicted", spec_pred)):
        keys, counts = st.spec[by].items()
        got = {(int(k // V // n1), int(k // V % n1) - 1, int(k % V)): int(c) for k, c in zip(keys, counts)}
        assert got == dict(want)


def test_table6_reading_equals_domain_table6_summary():
    """On the shipped Table 6 probes, the corpus view's last-token reading over every probe and layer
    is Table 6's accuracy and route shares (analysis.runs.domain: each prompt's route at its last token)."""
    from pathlib import Path
    ck = Path(__file__).resolve().parents[2] / "checkpoints" / "papaformer-gumbel-v2"
    model, tok = load_checkpoint(ck)
    res = R.run_corpus(model, tok, SH.shipped("Table 6 probes"), name="v2", settings=R.CorpusSettings(batch_size=6))
    tables = res.tables()
    probes = DOM.read_probes(DOM.DEFAULT_PROBES)
    routes = DOM.probe_routes(model, tok, probes)
    summary = DOM.table6_summary(model.config, ours=routes).set_index("metric")["value"]
    acc = tables["accuracy"].set_index(["label_column", "label_value", "reading", "layer"])
    assert math.isclose(acc.loc[("expected_path", S.ALL, "last token", S.ALL_LAYERS), "accuracy"],
                        summary["accuracy"], rel_tol=1e-12)
    sh = tables["label_shares"]
    last = sh[(sh["label_column"] == "expected_path") & (sh["reading"] == "last token")]
    per_option = last.groupby("option")["count"].sum()
    n = per_option.sum()
    assert n == summary["n_routes"]
    for o in range(model.config.n_paths):
        assert math.isclose(per_option[o] / n, summary[f"route {o + 1}"], rel_tol=1e-12)


def test_families_without_routes_summarise_their_exported_values(checkpoint, tokenizer):
    """pgpt and PAGMLP: per-token rows counted once per real token, per-call rows once per prompt,
    means equal to the same rows of each prompt run alone (float noise of batching allowed)."""
    for key in ("pgpt", "pagmlp"):
        model, tok = load_checkpoint(checkpoint(key))
        prompts = _prompts(12, seed=1)
        rows = [D.CorpusRow(str(i), t, (d,)) for i, (d, t) in enumerate(prompts)]
        data = D.rows_corpus("p", rows, ["domain"])
        res = R.run_corpus(model, tok, data, name=key, settings=R.CorpusSettings(max_tokens=16, batch_size=5))
        assert not res.layout.routes and "no per-token routes" in res.description
        cv = res.tables()["call_values"]
        frames = []
        for (d, t) in prompts:
            ids = tok.encode(t).ids[:16]
            with torch.inference_mode(), tracing() as tr:
                model(torch.tensor([ids]))
            frames.append(routing_table(tr, model, meta=ExportMeta("m", [RowMeta("p", ids)])).assign(domain=d))
        table = pd.concat(frames, ignore_index=True)
        table["scope"] = np.where(table["position"].isna(), "per call", "per token")
        allrows = cv[cv["label_value"] == S.ALL]
        n_tokens = sum(len(tok.encode(t).ids[:16]) for _, t in prompts)
        for row in allrows.itertuples():
            opt = table["option"].isna() if row.option is pd.NA else table["option"] == row.option
            want = table[(table["layer"] == row.layer) & (table["kind"] == row.kind) & opt &
                         (table["scope"] == row.scope)]["value"]
            assert row.n == len(want) == (n_tokens if row.scope == "per token" else len(prompts))
            assert abs(row.mean - want.mean()) <= FORWARD_EPS * EPS32 * max(1.0, want.abs().max())
        assert set(cv["label_value"]) == {S.ALL, "story", "math"}


# --- intended options and comparison ------------------------------------------------------------------

def test_intended_options_parse_and_default():
    assert RD.parse_intended(["domain:story=0, math=1", "topic:x=2"]) == {"domain": {"story": 0, "math": 1},
                                                                         "topic": {"x": 2}}
    for bad in ("domain", "domain:story", "domain:story=one", ":a=1"):
        with pytest.raises(ValueError, match="intended options"):
            RD.parse_intended([bad])
    assert RD.default_intended(["expected_path", "domain"], {"expected_path": ["1", "2", "x", "0"]}) == \
        {"expected_path": {"1": 0, "2": 1}}
    lay = S.Layout(("l",), (3,), (("a", "b", "c"),), 1, ("domain",))
    with pytest.raises(ValueError, match="no label column 'topic'"):
        RD.check_intended({"topic": {"x": 0}}, lay)
    with pytest.raises(ValueError, match="option 3 is out of range"):
        RD.check_intended({"domain": {"x": 3}}, lay)


def test_comparable_names_the_difference():
    a = S.Layout(("p.0", "p.1"), (3, 3), (("x",) * 3,) * 2, 1, ())
    assert CMP.comparable(a, a) is None
    assert "p.1 has 3 options in A and 2 in B" == CMP.comparable(a, S.Layout(("p.0", "p.1"), (3, 2), (), 1, ()))
    assert "routing layers differ" in CMP.comparable(a, S.Layout(("q",), (3,), (), 1, ()))
    assert "per-call values" in CMP.comparable(a, S.Layout(("p.0", "p.1"), (3, 3), (), 1, (), routes=False))


def test_compare_tables_sets_both_side_by_side_with_the_difference(data):
    batches, st = data
    other = _stats(_batches(seed=5))
    ta = {"utilisation": RD.utilisation(st), "specialisation": RD.specialisation(st, min_count=1, decode=str)}
    tb = {"utilisation": RD.utilisation(other), "specialisation": RD.specialisation(other, min_count=1, decode=str)}
    c = CMP.compare_tables(ta, tb)
    u = c["utilisation"]
    assert len(u) == len(ta["utilisation"])
    for row, a, b in zip(u.itertuples(), ta["utilisation"].itertuples(), tb["utilisation"].itertuples()):
        assert (row.slot_share_a, row.slot_share_b) == (a.slot_share, b.slot_share)
        assert math.isclose(row.slot_share_diff, b.slot_share - a.slot_share, rel_tol=1e-12, abs_tol=1e-15)
        assert (row.dead_a, row.dead_b) == (a.dead, b.dead)
    sp = c["specialisation"]
    keys = lambda t: {(r.layer, r.option, r.by, r.token) for r in t.itertuples()}  # noqa: E731
    assert keys(sp) == keys(ta["specialisation"]) | keys(tb["specialisation"])
    only_a = keys(ta["specialisation"]) - keys(tb["specialisation"])
    assert sp.set_index(["layer", "option", "by", "token"]).loc[list(only_a), "count_b"].isna().all()


def test_key_counts_merged_in_several_compactions_equal_a_plain_count():
    """The sparse counter merges sorted runs (its compaction); compacting after every batch, at the
    end only, or never in between gives the counts of a plain Counter."""
    from collections import Counter

    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 5000, rng.integers(0, 400)) for _ in range(12)]
    want = Counter(int(k) for b in batches for k in b)
    for every in (1, 3, len(batches)):
        kc = S.KeyCounts(10**9)
        assert kc.dense is None
        for i, b in enumerate(batches):
            kc.add(b)
            if (i + 1) % every == 0:
                kc._compact()
        keys, counts = kc.items()
        assert keys.tolist() == sorted(want) and counts.tolist() == [want[k] for k in sorted(want)]
