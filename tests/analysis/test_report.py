"""`routescope report` / analysis.reports.report: the corpus view's page over the validation split for every
family, embedding plotly.js (nothing fetched), with probe accuracy and dropped options; its numbers
equal independent recomputations from the model's raw outputs."""
from __future__ import annotations

import html
import json
import math
import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from routescope.analysis.runs import domain as D
from routescope.analysis.reports import report as R
from routescope.analysis.runs.family_table import route_reader
from routescope.rendering.corpus_report import report_page
from routescope.core_models import Ablation, tracing
from routescope.core_models.checkpoint import load_checkpoint
from routescope.analysis.export.plotly_bundle import plotly_js
from tolerances import EPS32, FORWARD_EPS

ROUTED = ("summary", "utilisation", "label_shares", "specialisation", "co_routing", "probes", "drops")


@pytest.fixture(scope="module", params=["gumbel_v1", "share_linear", "moep"])
def made(request, checkpoint):
    path = checkpoint(request.param)
    model, tok = load_checkpoint(path)
    data = R.collect(model, tok, name=path.name, n_docs=2, seq_len=32, min_count=2, top=4)
    return model, tok, data, report_page(data)


def _embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="corpus-data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def test_page_has_every_section_and_fetches_nothing(made):
    model, _, data, page = made
    for key in ROUTED:
        assert f'<h2 id="{key}">' in page
    assert ('<h2 id="accuracy">' in page) == (model.config.family == "papaformer")  # intended: the probes' paths
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)  # plotly.js inline, no external script
    assert not re.search(r"<link[^>]*\bhref\s*=", page, re.I)
    assert page.count(plotly_js()[:300]) == 1  # the bundle, once
    emb = _embedded(page)
    assert emb["meta"]["a"]["model"] == data.name
    assert set(emb["tables"]) >= set(data.tables) | {"probe_accuracy", "drops"}


def _first_choices(model, tr, layer: str) -> tuple[list[int], list[bool]]:
    """1-based route of every token at `layer` from the raw recorded tensors, and whether each is
    decided beyond float noise (top-2 margin): PaPaformer Gumbel: the router's choice (its logits);
    Share-Linear: the path output with the highest float64 cosine with the combined output; MoEP:
    the largest noise-free router probability (top-k's first choice)."""
    cfg = model.config
    if cfg.family == "moep":
        score = tr[f"{layer}.router.probs"].double()
    elif cfg.combiner == "share_linear":
        comb = tr[f"{layer}.combined"].double()
        score = torch.stack([F.cosine_similarity(tr[f"{layer}.paths.{j}.out"].double(), comb, dim=-1)
                             for j in range(cfg.n_paths)], dim=-1)
    else:
        score = tr[f"{layer}.router.logits"].double()
        assert (score.argmax(-1) == tr[f"{layer}.router.choice"]).all()
    top2 = score.topk(2, -1).values
    clear = (top2[..., 0] - top2[..., 1]) > FORWARD_EPS * EPS32 * max(1.0, float(score.abs().max()))
    return (score.argmax(-1) + 1).ravel().tolist(), clear.ravel().tolist()


def test_route_shares_by_domain_equal_a_plain_count_of_router_choices(made):
    """Each validation document run alone, its first `seq_len` tokens: the page's shares by domain
    are the counts of the router's choices (exactly, where no decision is within float noise; a
    batched run may flip only those)."""
    from routescope.corpora.corpus import DOMAINS, validation_documents

    model, tok, data, page = made
    reader = route_reader(model)
    want_layers = [f"parallel.{i}" for i in range(model.config.n_parallel_layers)]
    if model.config.family == "moep":
        want_layers = ["moe_shrink", *want_layers, "moe_grow"]
    shares = data.tables["label_shares"]
    shares = shares[(shares["label_column"] == "domain") & (shares["reading"] == "token")]
    assert reader.layers == want_layers and list(dict.fromkeys(shares["layer"])) == want_layers
    for dom in DOMAINS:
        counts, unclear = {l: Counter() for l in want_layers}, Counter()
        for doc in validation_documents(dom, 2):
            with torch.inference_mode(), tracing() as tr:
                model(torch.tensor([tok.encode(doc).ids[:32]]))
            for layer in want_layers:
                routes, clear = _first_choices(model, tr, layer)
                counts[layer].update(r - 1 for r in routes)
                unclear[layer] += clear.count(False)
        for layer in want_layers:
            got = shares[(shares["label_value"] == dom) & (shares["layer"] == layer)]
            n = sum(counts[layer].values())
            for row in got.itertuples():
                assert abs(row.count - counts[layer][row.option]) <= unclear[layer], (dom, layer, row.option)
                if not unclear[layer]:
                    assert math.isclose(row.share, counts[layer][row.option] / n, rel_tol=1e-12)
            assert list(got["label"]) == model.option_labels()[layer]
    emb = _embedded(page)["tables"]["label_shares"]
    count = emb["columns"].index("count")
    assert [row[count] for row in emb["data"]] == list(data.tables["label_shares"]["count"])


def test_moep_labels_name_both_option_kinds_and_probe_accuracy_says_not_applicable(checkpoint):
    model, tok = load_checkpoint(checkpoint("moep"))
    assert route_reader(model).labels == ["expert 0 / block 0", "expert 1 / block 1", "expert 2 / block 2"]
    data = R.collect(model, tok, name="moep", n_docs=1, seq_len=24, min_count=1, top=2)
    page = report_page(data)
    assert data.accuracy.empty and data.probe_tables == {} and _embedded(page)["tables"]["probe_accuracy"]["data"] == []
    assert "Not applicable: the moep paper prints no expected route" in page
    assert "accuracy" not in data.tables  # no intended options for its domains
    u = data.tables["utilisation"]
    assert set(u["label"]) == {"expert 0", "expert 1", "expert 2", "block 0", "block 1", "block 2"}


@pytest.mark.parametrize("key", ["pgpt", "pagmlp", "llama"])
def test_every_family_gets_a_page(key, checkpoint):
    """Families without per-token routes: the page shows the values they export over the validation
    split (and says so); a dense model says it has nothing to route or drop."""
    model, tok = load_checkpoint(checkpoint(key))
    data = R.collect(model, tok, name=key, n_docs=1, seq_len=16)
    page = report_page(data)
    assert "no per-token routes" in page or "no routing layers" in page
    if model.routing_layers():
        cv = data.tables["call_values"]
        assert len(cv) and {"per token", "per call"} & set(cv["scope"])
        assert '<h2 id="call_values">' in page and len(data.drops) == 2 * len(R.droppable(model))
    else:
        assert "has no routing layers whose options can be dropped" in page and data.drops.empty


def test_accuracy_equals_routes_matching_the_expected_path(made):
    model, tok, data, page = made
    if model.config.family != "papaformer":
        pytest.skip("Table 6 accuracy is PaPaformer's (the MoEP case: the test above)")
    for set_name, source in D.PROBE_SETS.items():
        probes = D.read_probes(source)
        for at, majority in D.ROUTE_AT.items():
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
    assert set(paper["route_at"]) == {D.PAPER_READING}
    assert html.escape(D.PAPER_READING) in page
    assert not (data.accuracy["probe_set"] == "held-out").sum() == 0
    assert not ((data.accuracy["probe_set"] == "held-out") & (data.accuracy["source"] == "paper")).any()


def test_drop_losses_equal_a_float64_cross_entropy_with_the_ablation(made):
    model, tok, data, page = made
    rows = R.validation_rows(tok, 2, 32)
    for dom, r in rows.items():
        with torch.inference_mode():
            base = F.cross_entropy(model(r[:, :-1]).logits.double().flatten(0, 1), r[:, 1:].flatten()).item()
        for j in range(len(route_reader(model).labels)):
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


def test_command_writes_the_page_and_refuses_bad_outputs(cli, checkpoint, tmp_path):
    ck = checkpoint("gumbel_v2")
    out = tmp_path / "r.html"
    assert cli(["report", ck, "--out", out, "--docs", "1", "--seq-len", "24", "--min-count", "1"]) == 0
    page = out.read_text()
    assert all(f'<h2 id="{k}">' in page for k in ROUTED)
    for bad, msg in ((tmp_path / "r.txt", "ending in .html"), (tmp_path / "no" / "r.html", "does not exist"),
                     (tmp_path, "is a directory")):
        with pytest.raises(ValueError, match=msg):
            cli(["report", ck, "--out", bad])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]  # nothing else written
    for other in ("llama", "pgpt"):  # every family has a page
        assert cli(["report", checkpoint(other), "--out", tmp_path / f"{other}.html", "--docs", "1",
                    "--seq-len", "16"]) == 0
        assert "RouteScope routing report" in (tmp_path / f"{other}.html").read_text()
