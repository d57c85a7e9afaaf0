"""`routescope report` / analysis.report: the page has every section, embeds plotly.js (nothing
fetched), and its numbers equal independent recomputations from the model's raw outputs."""
from __future__ import annotations

import html
import json
import math
import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from routescope.analysis import domain as D
from routescope.analysis import report as R
from routescope.core_models import Ablation, tracing
from routescope.core_models.checkpoint import load_checkpoint

SECTIONS = ("shares", "accuracy", "selective", "drops")


@pytest.fixture(scope="module", params=["gumbel_v1", "share_linear", "moep"])
def made(request, checkpoint):
    path = checkpoint(request.param)
    model, tok = load_checkpoint(path)
    data = R.collect(model, tok, name=path.name, n_docs=2, seq_len=32, min_count=2, top=4)
    return model, tok, data, R.render_html(data)


def _embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def test_page_has_every_section_and_fetches_nothing(made):
    _, _, data, page = made
    for key in SECTIONS:
        assert f'<h2 id="{key}">' in page
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)  # plotly.js inline, no external script
    assert not re.search(r"<link[^>]*\bhref\s*=", page, re.I)
    assert page.count("Plotly.newPlot") == 2 + (not data.accuracy.empty)  # shares, (accuracy,) drops
    assert len(re.findall(r"<script[^>]*>", page)) >= 4 and "plotly.js v" in page  # the bundle itself
    assert _embedded(page)["name"] == data.name


def _first_choices(model, tr, layer: str) -> list[int]:
    """1-based route of every token at `layer`, from the raw recorded tensors: PaPaformer Gumbel:
    the router's choice; Share-Linear: the path output with the highest float64 cosine with the
    combined output; MoEP: the largest noise-free router probability (top-k's first choice)."""
    cfg = model.config
    if cfg.family == "moep":
        return (tr[f"{layer}.router.probs"].double().argmax(-1) + 1).ravel().tolist()
    if cfg.combiner == "share_linear":
        comb = tr[f"{layer}.combined"].double()
        cos = torch.stack([F.cosine_similarity(tr[f"{layer}.paths.{j}.out"].double(), comb, dim=-1)
                           for j in range(cfg.n_paths)])
        return (cos.argmax(0) + 1).ravel().tolist()
    return (tr[f"{layer}.router.choice"] + 1).ravel().tolist()


def test_route_shares_equal_a_plain_count_of_router_choices(made):
    model, tok, data, page = made
    rows = R.validation_rows(tok, 2, 32)
    reader = R.route_reader(model)
    want_layers = [f"parallel.{i}" for i in range(model.config.n_parallel_layers)]
    if model.config.family == "moep":
        want_layers = ["moe_shrink", *want_layers, "moe_grow"]
    assert reader.layers == want_layers and list(dict.fromkeys(data.shares["layer"])) == want_layers
    for dom, r in rows.items():
        with torch.inference_mode(), tracing() as tr:
            model(r[:, :-1])
        for layer in want_layers:
            routes = _first_choices(model, tr, layer)
            counts = Counter(routes)
            got = data.shares[(data.shares["domain"] == dom) & (data.shares["layer"] == layer)]
            for _, row in got.iterrows():
                assert row["count"] == counts.get(row["route"], 0)
                assert math.isclose(row["share"], counts.get(row["route"], 0) / len(routes), rel_tol=1e-12)
            assert list(got["label"]) == reader.labels
    emb = _embedded(page)["shares"]
    assert [e["count"] for e in emb] == list(data.shares["count"])


def test_moep_labels_name_both_option_kinds_and_accuracy_says_not_applicable(checkpoint):
    model, tok = load_checkpoint(checkpoint("moep"))
    assert R.route_reader(model).labels == ["expert 0 / block 0", "expert 1 / block 1", "expert 2 / block 2"]
    data = R.collect(model, tok, name="moep", n_docs=1, seq_len=24, min_count=1, top=2)
    page = R.render_html(data)
    assert data.accuracy.empty and data.probe_tables == {} and _embedded(page)["accuracy"] == []
    assert "Not applicable: the moep paper prints no expected route" in page
    assert page.count("Plotly.newPlot") == 2  # shares and drops; no accuracy figure


def test_accuracy_equals_routes_matching_the_expected_path(made):
    model, tok, data, page = made
    if model.config.family != "papaformer":
        pytest.skip("Table 6 accuracy is PaPaformer's (the MoEP case: the test above)")
    for set_name, source in R.PROBE_SETS.items():
        probes = D.read_probes(source)
        for at, majority in R.ROUTE_AT.items():
            routes = D.probe_routes(model, tok, probes, majority=majority)
            defined = routes[routes["route"].notna()]
            want = sum(int(r) == int(e) for r, e in zip(defined["route"], defined["expected_path"])) / len(defined)
            acc = data.accuracy
            got = acc[(acc["probe_set"] == set_name) & (acc["route_at"] == at) & (acc["source"] == "ours")
                      & (acc["metric"] == "accuracy")]["value"].item()
            assert math.isclose(got, want, rel_tol=1e-12)
            assert f"<td>{got:.1%}</td>" in page
    paper = data.accuracy[(data.accuracy["source"] == "paper") & (data.accuracy["probe_set"] == "Table 6")]
    want = {"gumbel_v1": 0.4, "share_linear": 0.5}[model.config.combiner]  # the paper's own Table 6 routes
    assert math.isclose(paper[paper["metric"] == "accuracy"]["value"].item(), want, rel_tol=1e-9)  # once
    assert set(paper["route_at"]) == {R.PAPER_READING}
    assert html.escape(R.PAPER_READING) in page
    assert not (data.accuracy["probe_set"] == "held-out").sum() == 0
    assert not ((data.accuracy["probe_set"] == "held-out") & (data.accuracy["source"] == "paper")).any()


def test_drop_losses_equal_a_float64_cross_entropy_with_the_ablation(made):
    model, tok, data, page = made
    rows = R.validation_rows(tok, 2, 32)
    for dom, r in rows.items():
        with torch.inference_mode():
            base = F.cross_entropy(model(r[:, :-1]).logits.double().flatten(0, 1), r[:, 1:].flatten()).item()
        for j in range(len(R.route_reader(model).labels)):
            ab = Ablation(drop=(("*", j),))
            with torch.inference_mode():
                logp = torch.log_softmax(model(r[:, :-1], ablation=ab).logits.double(), -1)
                loss = -logp.gather(-1, r[:, 1:, None]).mean().item()
            got = data.drops[(data.drops["domain"] == dom) & (data.drops["dropped"] == j)].iloc[0]
            assert math.isclose(got["loss"], loss, rel_tol=1e-5)
            assert math.isclose(got["base_loss"], base, rel_tol=1e-5)
            assert math.isclose(got["delta"], got["loss"] - got["base_loss"], rel_tol=1e-12)
            assert got["mean_kl"] >= 0
            assert f"<td>{got['loss']:.3f}</td>" in page


def test_selective_tokens_by_total_variation_from_the_layer(made):
    model, tok, data, _ = made
    rows = R.validation_rows(tok, 2, 32)
    per = {d: R.token_routes_of(model, r) for d, r in rows.items()}
    ids = torch.cat([r[:, :-1] for r in rows.values()]).ravel().tolist()
    reader = R.route_reader(model)
    n = len(reader.labels)
    for i, name in enumerate(reader.layers):
        routes = [int(x) for d in per for x in per[d][i].ravel()]
        pairs = [(t, r) for t, r in zip(ids, routes) if r > 0]
        if not pairs:
            continue
        layer = Counter(r for _, r in pairs)
        by_tok: dict[int, Counter] = {}
        for t, r in pairs:
            by_tok.setdefault(t, Counter())[r] += 1
        tv = {t: 0.5 * sum(abs(c[r] / sum(c.values()) - layer[r] / len(pairs)) for r in range(1, n + 1))
              for t, c in by_tok.items() if sum(c.values()) >= 2}
        got = data.selective[data.selective["layer"] == name]
        best = sorted(tv.values(), reverse=True)[:4]
        assert [round(v, 9) for v in got["selectivity"]] == [round(v, 9) for v in best]
        for t, v in zip(got["token_id"], got["selectivity"]):
            assert math.isclose(v, tv[t], rel_tol=1e-9)
        assert list(got["token"]) == [tok.decode([int(t)]) for t in got["token_id"]]


def test_command_writes_the_page_and_refuses_bad_outputs(cli, checkpoint, tmp_path):
    ck = checkpoint("gumbel_v2")
    out = tmp_path / "r.html"
    assert cli(["report", ck, "--out", out, "--docs", "1", "--seq-len", "24", "--min-count", "1"]) == 0
    page = out.read_text()
    assert all(f'<h2 id="{k}">' in page for k in SECTIONS)
    for bad, msg in ((tmp_path / "r.txt", "ending in .html"), (tmp_path / "no" / "r.html", "does not exist"),
                     (tmp_path, "is a directory")):
        with pytest.raises(ValueError, match=msg):
            cli(["report", ck, "--out", bad])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]  # nothing else written
    for other in ("llama", "pgpt"):
        with pytest.raises(ValueError, match=f"{other} has no per-token routes to read \\(families with them: papaformer, moep\\)"):
            cli(["report", checkpoint(other), "--out", tmp_path / "x.html"])
    assert not (tmp_path / "x.html").exists()
