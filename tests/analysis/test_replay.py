"""`routescope replay` / `rs.replay` against independent computations: a trace made from transformers'
own routing (router logits from a forward hook on its gate modules, the top-k by a plain topk), with
known edits, is found to hold exactly those edits; `routescope export`'s table replays at 100%; a
bfloat16 trace against the float32 reference shows its mismatches as near-ties; a trace of another
model is refused in one line naming the row."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from routescope.analysis.export.csv_format import read_frame_csv
from routescope.cli.main import main

pytest.importorskip("transformers")

CK = Path(__file__).resolve().parents[2] / "checkpoints"
TEXTS = ["Once upon a time, there was a little girl named Lily. She loved her toys.",
         "Solve this problem: 3x + 5 = 20. Express your answer as a fraction.",
         "One day a little boy went to the park with his dog and a ball.",
         "Find the largest prime below fifty, then evaluate the sum.",
         "The cat sat on the mat and looked at the bird in the tree."]
TABLES = ("agreement", "mismatches", "checks", "first_divergence", "rows")


def run(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def hf_routes(path: Path, ids: list[list[int]], dtype=torch.float32) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row (top-k ids [T, L, k], float32 logits [T, L, n]) from transformers' own model: a forward
    hook on each layer's gate module (OLMoE's router returns its logits first), each row run alone."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    k = hf.config.num_experts_per_tok
    out = []
    for x in ids:
        seen = []
        hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o, seen=seen: seen.append(o[0].detach().float()))
                 for layer in hf.model.layers]
        try:
            with torch.no_grad():
                hf(torch.tensor([x]))
        finally:
            for h in hooks:
                h.remove()
        logits = torch.stack(seen, dim=1)  # [T, L, n]
        out.append((torch.topk(logits, k, dim=-1).indices.numpy(), logits.numpy()))
    return out


def encode(texts=TEXTS) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(CK / "olmoe-tiny" / "tokenizer.json"))
    return [tok.encode(t).ids for t in texts]


def table(rows: dict[str, tuple[list[int], np.ndarray]]) -> pd.DataFrame:
    """The plain long trace table: row, position, token_id, layer (0-based index), k, expert."""
    recs = []
    for rid, (ids, experts) in rows.items():
        T, L, K = experts.shape
        for t in range(T):
            for l in range(L):
                for j in range(K):
                    recs.append((rid, t, ids[t], l, j, int(experts[t, l, j])))
    return pd.DataFrame(recs, columns=["row", "position", "token_id", "layer", "k", "expert"])


def read(out: Path) -> dict[str, pd.DataFrame]:
    tables = {n: pd.read_parquet(out / f"{n}.parquet") for n in TABLES}
    for n in TABLES:  # CSV beside each, the same table
        csv = read_frame_csv(out / f"{n}.csv")
        assert list(csv.columns) == list(tables[n].columns) and len(csv) == len(tables[n])
    return tables


def sets_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return set(a.tolist()) == set(b.tolist())


def test_an_edited_trace_of_transformers_routing_shows_exactly_its_edits(tmp_path, capsys):
    path = CK / "olmoe-tiny"
    ids = encode()
    routes = hf_routes(path, ids)
    k, n_exp = routes[0][0].shape[-1], routes[0][1].shape[-1]
    engine = {f"req-{i}": (x, r.copy()) for i, (x, (r, _)) in enumerate(zip(ids, routes))}
    # swapped experts: the reference's last pick replaced by its lowest-scored expert, at chosen places
    swaps = {("req-0", 2, 1), ("req-1", 5, 3), ("req-2", 0, 0), ("req-4", 7, 2)}
    for rid, t, l in swaps:
        r, logits = routes[int(rid[4:])]
        engine[rid][1][t, l, -1] = int(np.argmin(logits[t, l]))
    # one row of zeros
    engine["req-3"][1][:] = 0
    # one duplicated position: req-1 position p takes position p - 1's experts
    ref1 = routes[1][0]
    p = next(t for t in range(2, len(ref1)) if any(not sets_equal(ref1[t, l], ref1[t - 1, l]) for l in range(4))
             and ("req-1", t, 3) not in swaps and ("req-1", t - 1, 3) not in swaps)
    engine["req-1"][1][p] = engine["req-1"][1][p - 1]
    for rid, (x, e) in engine.items():  # the unedited routing holds no duplicate of its own (precondition)
        if rid not in ("req-1", "req-3"):
            assert not any((e[t] == e[t - 1]).all() for t in range(1, len(e)))
    trace = tmp_path / "trace.parquet"
    table(engine).to_parquet(trace, index=False)
    out = tmp_path / "out"
    code, err = run(["--threads", "1", "replay", path, "--trace", trace, "--out", out, "--dtype", "float32",
                     "--reference-dtype", "float32", "--quiet"], capsys)
    assert code == 0, err
    print(err)
    t = read(out)

    # the mismatches are exactly the edits: the swaps, and the duplicated position where the reference differs
    dup = {("req-1", p, l) for l in range(4) if not sets_equal(ref1[p, l], ref1[p - 1, l])}
    layers = list(t["agreement"]["layer"][:-1])
    found = {(r.row, int(r.position), layers.index(r.layer)) for r in t["mismatches"].itertuples()}
    assert found == swaps | dup
    checks = t["checks"].set_index("check")
    assert checks.loc["all_zeros", "rows"] == "req-3" and checks.loc["duplicated_position", "rows"] == "req-1"
    assert checks["count"].sum() == 2

    # margins: the float32 reference's k-th minus (k+1)-th logit, as the hook's logits give them
    for r in t["mismatches"].itertuples():
        logits = routes[int(r.row[4:])][1][r.position, layers.index(r.layer)]
        s = np.sort(logits)[::-1]
        assert r.margin == pytest.approx(s[k - 1] - s[k], abs=1e-5)
        # the swap gap: the lowest logit the engine left out minus the highest it took instead
        mine = set(engine[r.row][1][r.position, layers.index(r.layer)].tolist())
        ref = set(routes[int(r.row[4:])][0][r.position, layers.index(r.layer)].tolist())
        gap = min(logits[j] for j in ref - mine) - max(logits[j] for j in mine - ref)
        assert r.swap_gap == pytest.approx(gap, abs=1e-5) and r.swap_gap >= r.margin - 1e-6
        assert r.near_tie == (gap <= 8 * torch.finfo(torch.float32).eps * max(1.0, abs(s[k - 1])))
        assert not r.gone_in_float32  # the float32 reference is the reference here: nothing goes away
        e = json.loads(r.engine_experts)
        assert e == engine[r.row][1][r.position, layers.index(r.layer)].tolist()

    # agreement: a plain count over the rows compared (the row of zeros is left out)
    compared = [rid for rid in engine if rid != "req-3"]
    eq = {rid: np.array([[sets_equal(engine[rid][1][t_, l], routes[int(rid[4:])][0][t_, l]) for l in range(4)]
                         for t_ in range(len(engine[rid][0]))]) for rid in compared}
    over = {rid: np.array([[len(set(engine[rid][1][t_, l].tolist()) & set(routes[int(rid[4:])][0][t_, l].tolist()))
                            for l in range(4)] for t_ in range(len(engine[rid][0]))]) for rid in compared}
    E, O = np.concatenate(list(eq.values())), np.concatenate(list(over.values()))
    agr = t["agreement"]
    assert list(agr["tokens"]) == [len(E)] * 5
    np.testing.assert_allclose(agr["agreement"][:4], E.mean(0))
    np.testing.assert_allclose(agr["mean_overlap"][:4], O.mean(0) / k)
    assert agr["agreement"].iloc[4] == pytest.approx(E.all(1).mean())
    first = t["first_divergence"].set_index("layer")["tokens"]
    assert first["none"] == E.all(1).sum()
    for l, name in enumerate(layers):
        assert first[name] == sum(1 for row in E if not row.all() and np.argmax(~row) == l)
    assert f"{1 - E.all(1).mean():.2%} differ" in err and n_exp == 16
    page = (out / "replay.html").read_text(encoding="utf-8")
    assert "Routing replay" in page and "req-1" in page
    prov = json.loads((out / "replay.json").read_text())
    assert prov["mismatches"] == len(swaps | dup) and prov["rows_left_out"] == 1


@pytest.mark.parametrize("name", ["olmoe-tiny", "moep"])  # transformers' OLMoE, and RouteScope's own MoEP
def test_routescope_exports_own_table_replays_at_full_agreement(tmp_path, capsys, name):
    path = CK / name
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TEXTS[:3]) + "\n", encoding="utf-8")
    exported = tmp_path / "routes.parquet"
    code, err = run(["--threads", "1", "export", path, "--prompts", prompts, "--out", exported, "--quiet",
                     "--dtype", "float32"], capsys)
    assert code == 0, err
    out = tmp_path / "out"
    code, err = run(["--threads", "1", "replay", path, "--trace", exported, "--out", out, "--dtype", "float32",
                     "--quiet"], capsys)
    assert code == 0, err
    t = read(out)
    n_tokens = sum(len(x) for x in encode(TEXTS[:3]))
    assert (t["agreement"]["agreement"] == 1.0).all() and (t["agreement"]["tokens"] == n_tokens).all()
    assert len(t["mismatches"]) == 0 and t["checks"]["count"].sum() == 0


def test_a_bfloat16_trace_against_the_float32_reference_mismatches_at_near_ties(tmp_path, capsys):
    path = CK / "olmoe-tiny"
    ids = encode()
    bf16 = hf_routes(path, ids, dtype=torch.bfloat16)
    f32 = hf_routes(path, ids)
    trace = tmp_path / "bf16.parquet"
    table({f"r{i}": (x, r) for i, (x, (r, _)) in enumerate(zip(ids, bf16))}).to_parquet(trace, index=False)
    out = tmp_path / "out"
    code, err = run(["--threads", "1", "replay", path, "--trace", trace, "--out", out, "--dtype", "float32",
                     "--trace-dtype", "bfloat16", "--quiet"], capsys)
    assert code == 0, err
    m = read(out)["mismatches"]
    plain = sum(not sets_equal(b[t, l], f[t, l]) for (b, _), (f, _) in zip(bf16, f32)
                for t in range(len(b)) for l in range(b.shape[1]))
    print(f"bfloat16 trace against float32: {len(m)} mismatches (plain count {plain}); margins "
          f"{sorted(round(x, 5) for x in m['margin'])}; near-ties {int(m['near_tie'].sum())}")
    assert len(m) == plain
    assert m["near_tie"].all()  # bfloat16 rounding only: every mismatch within 8 bfloat16 ulps


@pytest.mark.parametrize("edit, words", [
    (lambda ids, e: (ids, e[:, :, :2]), "top-2 routing"),  # another model's k
    (lambda ids, e: (ids, e[:, :3]), "3 layers"),  # another model's layer count
    (lambda ids, e: (ids, np.where(e == e.max(), 20, e)), "expert id 20"),  # another model's expert count
    (lambda ids, e: ([5000] + ids[1:], e), "token id 5000"),  # another model's vocabulary
])
def test_a_trace_of_another_model_is_refused_in_one_line_naming_the_row(tmp_path, capsys, edit, words):
    ids = encode(TEXTS[:2])
    routes = hf_routes(CK / "olmoe-tiny", ids)
    rows = {"first": edit(ids[0], routes[0][0]), "second": (ids[1], routes[1][0])}
    trace = tmp_path / "trace.csv"
    table(rows).to_csv(trace, index=False)
    out = tmp_path / "out"
    capsys.readouterr()  # transformers' own loading bar above
    code, err = run(["--threads", "1", "replay", CK / "olmoe-tiny", "--trace", trace, "--out", out, "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and "row 'first'" in err and words in err, err
    assert not out.exists()


def test_a_later_row_of_another_layer_count_is_counted_and_left_out(tmp_path):
    import routescope as rs
    from routescope.analysis.replay.row import TraceRow

    ids = encode(TEXTS[:3])
    routes = hf_routes(CK / "olmoe-tiny", ids)
    model, _ = rs.load(str(CK / "olmoe-tiny"), dtype="float32")
    rows = [TraceRow(f"r{i}", np.array(x), r) for i, (x, (r, _)) in enumerate(zip(ids, routes))]
    rows[1] = TraceRow("r1", rows[1].token_ids, rows[1].experts[:, :3])
    res = rs.replay(model, rows)
    checks = res["checks"].set_index("check")
    assert checks.loc["layer_count", "rows"] == "r1" and checks["count"].sum() == 1
    assert (res["agreement"]["agreement"] == 1.0).all()
    assert list(res["rows"]["row"]) == ["r0", "r2"]
    assert res["agreement"]["tokens"].iloc[0] == len(ids[0]) + len(ids[2])


@pytest.mark.slow  # starts a local Ray cluster: about 30 s on 2 busy cores
def test_ray_engine_writes_the_tables_of_one_process(tmp_path, capsys):
    pytest.importorskip("ray", reason="the distributed extra")
    ids = encode(TEXTS[:3])
    routes = hf_routes(CK / "olmoe-tiny", ids)
    engine = {f"r{i}": (x, r.copy()) for i, (x, (r, _)) in enumerate(zip(ids, routes))}
    engine["r1"][1][2, 0, -1] = int(np.argmin(routes[1][1][2, 0]))
    trace = tmp_path / "trace.csv"
    table(engine).to_csv(trace, index=False)
    outs = {}
    for how in ("embedded", "ray"):
        outs[how] = tmp_path / how
        code, err = run(["--threads", "1", "replay", CK / "olmoe-tiny", "--trace", trace, "--out", outs[how],
                         "--dtype", "float32", "--reference-dtype", "float32", "--engine", how, "--workers", "1",
                         "--batch-tokens", "16", "--quiet"], capsys)
        assert code == 0, err
    one, ray_ = read(outs["embedded"]), read(outs["ray"])
    for name in TABLES:
        pd.testing.assert_frame_equal(one[name], ray_[name])
    assert len(one["mismatches"]) == 1


def test_vllm_and_sglang_traces_replay_against_transformers_routing(tmp_path, capsys):
    """A vLLM request output (routing over prompt + output - 1 tokens) and an SGLang /generate response
    (base64 int32, routed_experts_start_len 2), each holding transformers' own routing, one SGLang id
    swapped: agreement 1 but for that swap, at the position the start length puts it."""
    import base64

    ids = encode(TEXTS[:2])
    routes = hf_routes(CK / "olmoe-tiny", ids)
    (x0, (r0, _)), (x1, (r1, logits1)) = zip(ids, routes)
    vllm = {"request_id": "v", "prompt_token_ids": x0[:5], "outputs": [{"index": 0, "token_ids": x0[5:],
                                                                      "routed_experts": r0[:-1].tolist()}]}
    start, e1 = 2, r1[2:-1].copy()
    e1[1, 2, -1] = int(np.argmin(logits1[start + 1, 2]))
    sglang = {"text": "", "input_ids": x1[:6], "output_ids": x1[6:],
              "meta_info": {"id": "s", "routed_experts_start_len": start,
                            "routed_experts": base64.b64encode(e1.astype("<i4").tobytes()).decode()}}
    found = {}
    for name, line in (("vllm", vllm), ("sglang", sglang)):
        trace = tmp_path / f"{name}.jsonl"
        trace.write_text(json.dumps(line) + "\n", encoding="utf-8")
        out = tmp_path / name
        code, err = run(["--threads", "1", "replay", CK / "olmoe-tiny", "--trace", trace, "--out", out, "--dtype",
                         "float32", "--quiet"], capsys)
        assert code == 0, err
        found[name] = read(out)
    assert (found["vllm"]["agreement"]["agreement"] == 1.0).all()
    assert found["vllm"]["agreement"]["tokens"].iloc[0] == len(x0) - 1
    m = found["sglang"]["mismatches"]
    assert found["sglang"]["agreement"]["tokens"].iloc[0] == len(x1) - 1 - start
    assert list(zip(m["row"], m["position"], m["layer"])) == [("s", start + 1, "model.layers.2.mlp.gate")]
    assert m["token_id"].iloc[0] == x1[start + 1]


def test_the_page_escapes_row_ids_and_token_text():
    import routescope as rs
    from routescope.analysis.replay.compare import model_shape, reference_routes
    from routescope.analysis.replay.row import TraceRow
    from routescope.rendering.replay_figures import page

    model, _ = rs.load(str(CK / "olmoe-tiny"), dtype="float32")
    x = np.array(encode(TEXTS[:1])[0])
    e = reference_routes(model, model_shape(model), [x])[0].ids.copy()
    e[1, 0, -1] = next(j for j in range(16) if j not in e[1, 0])
    evil = "<img src=x onerror=alert(1)>"
    res = rs.replay(model, [TraceRow(evil, x, e)])
    html = page(res, decode=lambda i: "</script><b>t</b>")
    shown, data = html.split('<script type="application/json" id="corpus-data">')
    assert evil not in shown and "<b>t</b>" not in shown and "&lt;img src=x onerror=alert(1)&gt;" in shown
    assert "</" not in data.split("</script>")[0]


@pytest.mark.parametrize("name, body, words", [
    ("t.jsonl", '{"hello": 1}\n', "unknown trace format"),
    ("s.jsonl", json.dumps({"input_ids": [5, 6, 7], "output_ids": [8], "meta_info": {
        "id": "cut", "routed_experts": "AAAAAAMAAAAB"[:-3]}}) + "\n", "'cut'"),  # truncated base64
    ("e.csv", "row,position,token_id,layer,k,expert\n", "no routing records"),
])
def test_bad_traces_are_one_line_and_leave_no_output(tmp_path, capsys, name, body, words):
    trace = tmp_path / name
    trace.write_text(body, encoding="utf-8")
    out = tmp_path / "out"
    code, err = run(["--threads", "1", "replay", CK / "olmoe-tiny", "--trace", trace, "--out", out, "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not out.exists()
