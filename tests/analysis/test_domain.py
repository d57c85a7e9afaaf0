"""Table 6 (path selection per parallel layer) against routes computed by hand."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from routescope.analysis.export import columns as C
from routescope.analysis.runs import domain as D
from routescope.core_models import from_name, tracing
from tiny_models import tiny_model


@pytest.fixture(scope="module")
def probes():
    return D.read_probes()


def hand_routes(model, tok, prompt: str, majority: bool = False) -> list[int]:
    """1-based route per parallel layer from the raw recorded tensors."""
    c = model.config
    with torch.no_grad(), tracing() as tr:
        model(torch.tensor([tok.encode(prompt).ids]))
    out = []
    for i in range(c.n_parallel_layers):
        if c.combiner == "share_linear":
            comb = tr[f"parallel.{i}.combined"][0]
            per_tok = [1 + max(range(c.n_paths), key=lambda j: float(
                F.cosine_similarity(tr[f"parallel.{i}.paths.{j}.out"][0, t], comb[t], dim=0)))
                for t in range(comb.shape[0])]
        else:
            logits = tr[f"parallel.{i}.router.logits"][0]
            per_tok = [1 + int(torch.argmax(logits[t])) for t in range(logits.shape[0])]
        if majority:
            counts = Counter(per_tok)
            out.append(min(r for r in counts if counts[r] == max(counts.values())))
        else:
            out.append(per_tok[-1])
    return out


@pytest.mark.parametrize("key", ["gumbel_v1", "share_linear"])
@pytest.mark.parametrize("majority", [False, True])
def test_table6_matches_hand_routes(tokenizer, vocab_size, probes, key, majority):
    model = tiny_model(key, vocab_size=vocab_size)
    routes = D.probe_routes(model, tokenizer, probes, majority=majority)
    c = model.config
    assert len(routes) == len(probes) * c.n_parallel_layers
    table = D.table6(routes, probes, D.paper_routes(probes, c.combiner))
    everything = []
    for _, row in table.iterrows():
        want = hand_routes(model, tokenizer, row[C.PROMPT], majority)
        assert row[C.ROUTES] == ">".join(map(str, want)), row[C.PROMPT_ID]
        everything += [(r, int(row[C.EXPECTED_PATH])) for r in want]
    assert table[C.PAPER_ROUTES].tolist() == probes[D.paper_column(c)].tolist()
    s = D.table6_summary(c, ours=routes)
    assert set(s[C.SOURCE]) == {"ours"}
    got = dict(zip(s[C.METRIC], s[C.VALUE]))
    n = len(everything)
    for j in range(1, c.n_paths + 1):
        assert got[f"route {j}"] == pytest.approx(sum(r == j for r, _ in everything) / n)
    assert got["accuracy"] == pytest.approx(sum(r == e for r, e in everything) / n)
    assert ("combined" in got) == (c.combiner != "share_linear")


def test_summary_of_the_papers_routes_reproduces_its_numbers(probes):
    def summary(combiner):
        config = from_name("papaformer-" + combiner.replace("_", "-"))  # a 3-path model: the paper's 2 still count
        s = D.table6_summary(config, paper=D.paper_routes(probes, combiner))
        assert set(s[C.SOURCE]) == {"paper"}
        return {m: round(v, 3) for m, v in zip(s[C.METRIC], s[C.VALUE])}

    assert summary("gumbel_v1") == {"route 1": 0.483, "route 2": 0.5, "combined": 0.017, "accuracy": 0.4,
                                    "n_routes": 60}
    v2 = summary("gumbel_v2")
    assert (v2["route 1"], v2["route 2"], v2["combined"]) == (0.233, 0.7, 0.067)
    assert v2["accuracy"] == 0.467  # 28 / 60 routes; the paper prints 46.5 %
    assert summary("share_linear") == {"route 1": 0.7, "route 2": 0.3, "accuracy": 0.5, "n_routes": 40}


def test_undefined_share_linear_layer_is_na():
    model = tiny_model("share_linear", fused_grow=True)
    with torch.no_grad(), tracing() as tr:
        model(torch.tensor([[1, 2, 3]]))
    r = D.layer_routes(tr, model)
    assert r[C.ROUTE].isna().tolist() == [False, True]


@pytest.mark.parametrize("header,missing", [
    ("prompt_id\tdomain\tprompt\n", "expected_path"),
    ("id\tdomain\texpected_path\tprompt\n", "prompt_id"),
    ("prompt_id\tdomain\texpected_path\tprompt\tpaper gumbel v1\n", "unknown column"),
])
def test_bad_probe_columns_are_named(tmp_path, header, missing):
    f = tmp_path / "p.tsv"
    f.write_text(header + "\t".join(["P1", "story", "1", "x", "2>2"][: header.count("\t") + 1]) + "\n")
    with pytest.raises(ValueError, match=missing):
        D.read_probes(f)


def test_bad_probe_values(tmp_path):
    f = tmp_path / "p.tsv"
    f.write_text("prompt_id\tdomain\texpected_path\tprompt\nP1\tstory\tone\thi\n")
    with pytest.raises(ValueError, match="expected_path"):
        D.read_probes(f)
    f.write_text("prompt_id\tdomain\texpected_path\tprompt\nP1\tstory\t1\thi\nP1\tmath\t2\tyo\n")
    with pytest.raises(ValueError, match="duplicate"):
        D.read_probes(f)
    f.write_text("")
    with pytest.raises(ValueError, match="empty"):
        D.read_probes(f)
    ok = tmp_path / "ok.tsv"
    ok.write_text("prompt_id\tdomain\texpected_path\tprompt\tpaper_gumbel_v1\nP1\tstory\t1\thi\t2>x\n")
    with pytest.raises(ValueError, match="not a route"):
        D.paper_routes(D.read_probes(ok), "gumbel_v1")
    assert D.paper_routes(D.read_probes(ok), "share_linear") is None


def test_non_papaformer_is_refused(tokenizer, vocab_size, probes):
    with pytest.raises(ValueError, match="PaPaformer"):
        D.probe_routes(tiny_model("moep", vocab_size=vocab_size), tokenizer, probes)
