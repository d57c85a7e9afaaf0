"""Trace readers (analysis.replay.trace and its format modules) and the broken-trace checks
(analysis.replay.checks): files built by hand to each engine's documented layout (JSON, base64,
torch.save, pyarrow) round-trip known arrays; each malformed variant is one line naming the row;
the checks find exactly the faults planted and nothing on a clean trace; `routescope export`'s own
table reads back as the model's top-k picks, recomputed from the trace."""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from routescope.analysis.export.batch import ExportJob, export_batches
from routescope.analysis.export.table_files import ExportWriter
from routescope.analysis.replay import table_format
from routescope.analysis.replay.checks import CHECKS, Checks, check_row
from routescope.analysis.replay.row import TraceRow
from routescope.analysis.replay.trace import FORMATS, read_trace, sniff_format
from routescope.core_models import Ablation, tracing
from tiny_models import tiny_model

L, K, N = 3, 2, 8  # routing layers, top-k, experts per layer of the traces built here


def routing(T: int, seed: int, L: int = L, k: int = K, n: int = N) -> np.ndarray:
    """[T, L, k] distinct ids per top-k, no position equal to the one before at every layer."""
    rng = np.random.default_rng(seed)
    out = np.zeros((T, L, k), dtype=np.int64)
    for t in range(T):
        while True:
            out[t] = [rng.choice(n, k, replace=False) for _ in range(L)]
            if t == 0 or not np.array_equal(out[t], out[t - 1]):
                break
    return out


def requests(n: int = 3, seed: int = 0) -> list[dict]:
    """Requests with prompt and output ids and routing for every token but the last sampled one."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        P, O = 3 + i, 2 + 2 * i
        ids = rng.integers(0, 50, P + O)
        out.append(dict(rid=f"req-{i}", prompt=ids[:P].tolist(), output=ids[P:].tolist(),
                        experts=routing(P + O - 1, seed * 10 + i)))
    return out


def b64_int32(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype="<i4").tobytes()).decode()


def write_jsonl(path, lines: list[dict]):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


# --- vLLM -------------------------------------------------------------------------------------

def vllm_line(r: dict, layout: str) -> dict:
    e = r["experts"].tolist()
    if layout == "request_output":  # RequestOutput with its CompletionOutputs
        return {"request_id": r["rid"], "prompt_token_ids": r["prompt"],
                "outputs": [{"index": 0, "token_ids": r["output"], "routed_experts": e}]}
    if layout == "flat":
        return {"request_id": r["rid"], "prompt_token_ids": r["prompt"], "token_ids": r["output"], "routed_experts": e}
    if layout == "openai":
        return {"id": r["rid"], "prompt_token_ids": r["prompt"],
                "choices": [{"index": 0, "text": "", "token_ids": r["output"], "routed_experts": e}]}
    if layout == "npy":
        buf = io.BytesIO()
        np.save(buf, r["experts"].astype(np.int16))
        return {"request_id": r["rid"], "prompt_token_ids": r["prompt"],
                "outputs": [{"index": 0, "token_ids": r["output"],
                             "routed_experts": base64.b64encode(buf.getvalue()).decode()}]}
    raise KeyError(layout)


@pytest.mark.parametrize("layout", ["request_output", "flat", "openai", "npy"])
def test_vllm_rows_cover_prompt_and_output_but_the_last_sampled_token(tmp_path, layout):
    reqs = requests()
    path = write_jsonl(tmp_path / "vllm.jsonl", [vllm_line(r, layout) for r in reqs])
    assert sniff_format(path) == "vllm"
    rows = list(read_trace(path))
    assert [r.row for r in rows] == [r["rid"] for r in reqs]
    for row, r in zip(rows, reqs):
        assert row.token_ids.tolist() == (r["prompt"] + r["output"])[:-1]
        np.testing.assert_array_equal(row.experts, r["experts"])
        assert row.experts.dtype == np.int64 and row.start == 0 and row.layer_names is None
        assert check_row(row, n_layers=L, n_experts=N, top_k=K) == []


def test_vllm_split_prompt_routing_and_several_outputs(tmp_path):
    """PR #39917's layout: prompt_routed_experts beside the outputs, routed_experts per output
    covering each generated token; one row per output, named request/index."""
    prompt, outs = [5, 6, 7, 8], [[1, 2, 3], [4, 9]]
    head = routing(4, 1)
    tails = [routing(3, 2), routing(2, 3)]
    line = {"request_id": "r", "prompt_token_ids": prompt, "prompt_routed_experts": head.tolist(),
            "outputs": [{"index": i, "token_ids": o, "routed_experts": t.tolist()}
                        for i, (o, t) in enumerate(zip(outs, tails))]}
    rows = list(read_trace(write_jsonl(tmp_path / "v.jsonl", [line]), fmt="vllm"))
    assert [r.row for r in rows] == ["r/0", "r/1"]
    for row, o, t in zip(rows, outs, tails):
        assert row.token_ids.tolist() == prompt + o
        np.testing.assert_array_equal(row.experts, np.concatenate([head, t]))


# --- SGLang -----------------------------------------------------------------------------------

def sglang_line(r: dict, layout: str, start: int = 0) -> dict:
    data = b64_int32(r["experts"][start:])
    if layout == "native":  # /generate: output_ids, meta_info; the request's input_ids added
        meta = {"id": r["rid"], "routed_experts": data, "prompt_tokens": len(r["prompt"])}
        if start:
            meta["routed_experts_start_len"] = start
        return {"text": "", "input_ids": r["prompt"], "output_ids": r["output"], "meta_info": meta}
    if layout == "logprobs":  # output ids only as meta_info.output_token_logprobs tuples
        return {"text": "", "input_ids": r["prompt"],
                "meta_info": {"id": r["rid"], "routed_experts": data, "routed_experts_start_len": start,
                              "output_token_logprobs": [[-0.5, t, None] for t in r["output"]]}}
    if layout == "openai_sglext":  # current SGLang: sglext at the response level
        return {"id": r["rid"], "object": "text_completion", "prompt_token_ids": r["prompt"],
                "choices": [{"index": 0, "text": "", "token_ids": r["output"]}],
                "sglext": {"routed_experts": data}, "routed_experts_start_len": start}
    if layout == "openai_sgl_ext_choice":  # the spelling, in the choice
        return {"id": r["rid"], "prompt_token_ids": r["prompt"], "routed_experts_start_len": start,
                "choices": [{"index": 0, "text": "", "token_ids": r["output"], "sgl_ext": {"routed_experts": data}}]}
    raise KeyError(layout)


@pytest.mark.parametrize("layout", ["native", "logprobs", "openai_sglext", "openai_sgl_ext_choice"])
@pytest.mark.parametrize("start", [0, 2])
def test_sglang_base64_rows_honour_the_start_len(tmp_path, layout, start):
    reqs = requests(seed=1)
    path = write_jsonl(tmp_path / "sgl.jsonl", [sglang_line(r, layout, start) for r in reqs])
    assert sniff_format(path) == "sglang"
    rows = list(read_trace(path, n_layers=L, top_k=K))
    assert [r.row for r in rows] == [r["rid"] for r in reqs]
    for row, r in zip(rows, reqs):
        assert row.start == start
        assert row.token_ids.tolist() == (r["prompt"] + r["output"])[:-1]  # [0, seqlen - 1): start is context
        np.testing.assert_array_equal(row.experts, r["experts"][start:])
        assert check_row(row, n_layers=L, n_experts=N, top_k=K) == []


def test_sglang_a_trace_of_another_layer_count_keeps_its_shape_for_the_check(tmp_path):
    r = requests(1, seed=2)[0]
    r["experts"] = routing(len(r["prompt"]) + len(r["output"]) - 1, 5, L=5)  # 5 layers, the model has 3
    path = write_jsonl(tmp_path / "s.jsonl", [sglang_line(r, "native")])
    (row,) = read_trace(path, n_layers=L, top_k=K)
    np.testing.assert_array_equal(row.experts, r["experts"])
    assert check_row(row, n_layers=L, n_experts=N, top_k=K) == ["layer_count"]


def per_token_dump(path, passes: list[tuple[list[int], list[int], np.ndarray]], p2l: np.ndarray, n_slots: int = 8):
    """torch.save of the recorder's per_token layout: one record per forward pass with
    topk_ids_of_layer [num_layers, num_tokens, 8], -1 where nothing was written."""
    records = []
    for i, (ids, pos, topk) in enumerate(passes):
        buf = np.full((topk.shape[1], len(ids), n_slots), -1, dtype=np.int32)
        buf[:, :, :topk.shape[2]] = topk.transpose(1, 0, 2)
        records.append(dict(forward_pass_id=100 + i, rank=0, gatherer_key="primary", input_ids=ids, positions=pos,
                            extend_seq_lens=[len(ids)], forward_mode=1 if len(ids) > 1 else 2,
                            topk_ids_of_layer=torch.from_numpy(buf), misc_objects=[],
                            global_physical_count=torch.zeros(topk.shape[1], p2l.shape[1], dtype=torch.int32)))
    torch.save({"records": records, "last_physical_to_logical_map": torch.from_numpy(p2l)}, path)
    return path


def test_sglang_per_token_dump_rebuilds_requests_in_logical_ids(tmp_path):
    """Two requests run one at a time: chunked prefill then one pass per decoded token. A dense first
    layer (-1 throughout) and the unused slots are dropped; physical ids map to logical experts."""
    rng = np.random.default_rng(3)
    n_phys = N + 2  # two redundant physical copies
    p2l = np.stack([np.concatenate([rng.permutation(N), rng.choice(N, 2)]) for _ in range(L + 1)]).astype(np.int64)
    passes, expected = [], []
    for r, (prefill, decode) in enumerate([((4, 3), 3), ((5,), 2)]):
        T = sum(prefill) + decode
        ids = rng.integers(0, 50, T)
        phys = rng.integers(0, n_phys, (T, L, K))
        full = np.concatenate([np.full((T, 1, K), -1), phys], axis=1)  # layer 0 dense
        cuts = np.cumsum((0,) + prefill + (1,) * decode)
        first = 100 + len(passes)  # the request's first forward pass names it
        for a, b in zip(cuts[:-1], cuts[1:]):
            passes.append((ids[a:b].tolist(), list(range(a, b)), full[a:b]))
        logical = p2l[np.arange(1, L + 1)[None, :, None], phys]
        expected.append((f"rank0/pass{first}", ids, logical))
    path = per_token_dump(tmp_path / "expert_distribution_recorder_1.0_0.pt", passes, p2l)
    assert sniff_format(path) == "sglang-per-token"
    rows = list(read_trace(path))
    assert [r.row for r in rows] == [e[0] for e in expected]
    for row, (_, ids, logical) in zip(rows, expected):
        assert row.token_ids.tolist() == ids.tolist()
        np.testing.assert_array_equal(row.experts, logical)


# --- the plain long table ---------------------------------------------------------------------

def long_table(rows: dict[str, tuple[np.ndarray, np.ndarray]], names: tuple[str, ...] | None = None,
               seed: int = 0) -> pd.DataFrame:
    """`row, position, token_id, layer, k, expert`, rows contiguous, records shuffled inside each."""
    rng = np.random.default_rng(seed)
    parts = []
    for rid, (tokens, e) in rows.items():
        t, l, j = np.meshgrid(*map(np.arange, e.shape), indexing="ij")
        d = pd.DataFrame({"row": rid, "position": t.ravel(), "token_id": tokens[t.ravel()],
                          "layer": l.ravel() if names is None else np.asarray(names)[l.ravel()],
                          "k": j.ravel(), "expert": e.ravel()})
        parts.append(d.iloc[rng.permutation(len(d))])
    return pd.concat(parts, ignore_index=True)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
@pytest.mark.parametrize("named", [False, True])
def test_plain_table_round_trips_across_batches(tmp_path, monkeypatch, suffix, named):
    monkeypatch.setattr(table_format, "CHUNK_ROWS", 7)  # rows straddle many batches / chunks
    rng = np.random.default_rng(4)
    data = {f"row {i}": (rng.integers(0, 50, 4 + i), routing(4 + i, 20 + i)) for i in range(4)}
    names = ("blocks.0.moe", "blocks.1.moe", "blocks.2.moe") if named else None
    df = long_table(data, names)
    path = tmp_path / f"trace{suffix}"
    if suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=11)
    assert sniff_format(path) == "table"
    rows = list(read_trace(path))
    assert [r.row for r in rows] == list(data)
    for row, (tokens, e) in zip(rows, data.values()):
        assert row.token_ids.tolist() == tokens.tolist()
        if named:  # names label the L axis in the order the row first gives them
            assert sorted(row.layer_names) == list(names)
            e = e[:, [names.index(n) for n in row.layer_names]]
        else:
            assert row.layer_names is None
        np.testing.assert_array_equal(row.experts, e)
        assert check_row(row, n_layers=L, n_experts=N, top_k=K) == []


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_routescope_export_reads_back_as_the_models_top_k(tmp_path, monkeypatch, suffix):
    """The export table (written by ExportWriter exactly as `routescope export` writes it, prompts of
    different lengths batched with padding) gives, per prompt, position and layer, the top-k the
    router picked, read here from its recorded indices with each prompt run alone."""
    monkeypatch.setattr(table_format, "CHUNK_ROWS", 50)
    model = tiny_model("moep")
    encoded = [("p-1", [3, 1, 4, 1, 5, 9]), ("=p2", [2, 6, 5]), ("p3", [8, 9, 7, 9, 3, 2, 3, 8])]
    path = tmp_path / f"export{suffix}"
    with ExportWriter(path) as w:
        for _, frames in export_batches(model, encoded, lambda ids: [str(i) for i in ids], Ablation(),
                                        ExportJob(batch_size=2), "tiny"):
            for df in frames:
                w.write(df)
    rows = list(read_trace(path))
    assert [r.row for r in rows] == [pid for pid, _ in encoded]
    for row, (_, ids) in zip(rows, encoded):
        with torch.inference_mode(), tracing() as tr:
            model(torch.tensor([ids]))
        layers = [n for n in model.routing_layers() if f"{n}.router.indices" in tr]
        assert sorted(row.layer_names) == sorted(layers)  # names label the L axis; the replay orders them
        assert row.token_ids.tolist() == ids
        picks = np.stack([tr[f"{n}.router.indices"][0].numpy() for n in row.layer_names], axis=1)  # [T, L, k]
        np.testing.assert_array_equal(np.sort(row.experts, -1), np.sort(picks, -1))


# --- bad input: one line naming the row -------------------------------------------------------

def _bad_files(tmp_path) -> dict[str, tuple]:
    r = requests(1, seed=5)[0]
    good_v = vllm_line(r, "request_output")
    good_s = sglang_line(r, "native")
    truncated = dict(good_s, meta_info=dict(good_s["meta_info"], routed_experts=good_s["meta_info"]["routed_experts"][:-3]))
    odd_bytes = dict(good_s, meta_info=dict(good_s["meta_info"], routed_experts=base64.b64encode(b"\x01\x02\x03").decode()))
    ragged = dict(good_v, outputs=[dict(good_v["outputs"][0], routed_experts=[[1, 2], [3]])])
    flat2d = dict(good_v, outputs=[dict(good_v["outputs"][0], routed_experts=[[1, 2], [3, 4]])])
    no_prompt = {k: v for k, v in good_s.items() if k != "input_ids"}
    plain = long_table({"a": (np.arange(3), routing(3, 1)), "b": (np.arange(3), routing(3, 2))})
    hole = plain.drop(index=plain.index[(plain["row"] == "b")][0])
    back = pd.concat([plain[plain["row"] == "a"].iloc[:5], plain[plain["row"] == "b"], plain[plain["row"] == "a"].iloc[5:]])
    p2l = np.tile(np.arange(N), (L, 1))
    both = [([1, 2], [0, 0], routing(2, 1))]  # two sequences in one pass
    skip = [([1, 2], [0, 1], routing(2, 1)), ([3], [5], routing(1, 2))]
    return {
        "truncated base64": ("s.jsonl", [truncated], "req-0", "base64"),
        "bytes not int32": ("s.jsonl", [odd_bytes], "req-0", "int32"),
        "ragged array": ("v.jsonl", [good_v, ragged], "req-0", "rectangular"),
        "wrong shape": ("v.jsonl", [flat2d], "req-0", "shape"),
        "no prompt ids": ("s.jsonl", [no_prompt], "req-0", "prompt"),
        "not JSON": ("v.jsonl", "{\"request_id\": \"x\", \"prompt", "line 1", "JSON"),
        "unknown format": ("u.jsonl", [{"id": "x", "text": "hello"}], "u.jsonl", "unknown trace format"),
        "table hole": ("t.parquet", hole, "'b'", "missing"),
        "table rows not contiguous": ("t.csv", back, "'a'", "contiguous"),
        "table columns": ("t.csv", plain.drop(columns="k"), "t.csv", "missing column"),
        "table empty": ("t.parquet", plain.iloc[:0], "t.parquet", "no routing records"),
        "per_token two requests in a pass": ("d.pt", both, "forward pass 100", "one request at a time"),
        "per_token skipped positions": ("d.pt", skip, "forward pass 101", "position 5"),
    }


@pytest.mark.parametrize("case", [
    "truncated base64", "bytes not int32", "ragged array", "wrong shape", "no prompt ids", "not JSON",
    "unknown format", "table hole", "table rows not contiguous", "table columns", "table empty",
    "per_token two requests in a pass", "per_token skipped positions"])
def test_each_bad_trace_is_one_line_naming_the_row(tmp_path, case):
    name, content, names, says = _bad_files(tmp_path)[case]
    path = tmp_path / name
    if name.endswith(".pt"):
        per_token_dump(path, content, np.tile(np.arange(N), (L, 1)))
    elif isinstance(content, pd.DataFrame):
        content.to_csv(path, index=False) if name.endswith(".csv") else content.to_parquet(path, index=False)
    elif isinstance(content, str):
        path.write_text(content + "\n", encoding="utf-8")
    else:
        write_jsonl(path, content)
    with pytest.raises(ValueError) as err:
        list(read_trace(path, n_layers=L, top_k=K))
    msg = str(err.value)
    assert "\n" not in msg and names in msg and says in msg, msg


def test_an_unknown_format_name_and_a_missing_file_are_one_line(tmp_path):
    path = write_jsonl(tmp_path / "v.jsonl", [vllm_line(requests(1)[0], "flat")])
    for call, says in [(lambda: read_trace(path, fmt="tgi"), "unknown trace format 'tgi'"),
                       (lambda: read_trace(tmp_path / "none.jsonl"), "no such trace file")]:
        with pytest.raises(ValueError, match=says) as err:
            call()
        assert "\n" not in str(err.value)
    assert set(FORMATS) == {"vllm", "sglang", "sglang-per-token", "table"}


def test_reading_is_lazy_one_request_at_a_time(tmp_path):
    """The first request comes before a bad later line is read: the file is streamed."""
    reqs = requests(2)
    path = tmp_path / "v.jsonl"
    path.write_text(json.dumps(vllm_line(reqs[0], "flat")) + "\n{not json\n", encoding="utf-8")
    it = read_trace(path, fmt="vllm")
    first = next(it)
    assert first.row == "req-0"
    with pytest.raises(ValueError, match="line 2"):
        next(it)


# --- the checks -------------------------------------------------------------------------------

def planted() -> tuple[list[TraceRow], dict[str, str]]:
    """A clean trace plus one row per fault, and which check each planted row must fail."""
    rng = np.random.default_rng(7)
    rows, faults = [], {}
    for i in range(5):
        T = 6 + i
        rows.append(TraceRow(f"clean {i}", rng.integers(0, 50, T), routing(T, 40 + i)))

    def plant(name: str, check: str, edit):
        tokens, e = rng.integers(0, 50, 8), routing(8, len(rows) + 100)
        tokens, e = edit(tokens, e)
        rows.append(TraceRow(name, tokens, e))
        faults[name] = check

    plant("zeros", "all_zeros", lambda t, e: (t, np.zeros_like(e)))
    plant("dup", "duplicated_position", lambda t, e: (t, np.concatenate([e[:4], e[3:4], e[5:]])))
    plant("short", "length_off_by_one", lambda t, e: (t, e[:-1]))
    plant("long", "length_off_by_one", lambda t, e: (t[:-1], e))
    plant("far", "length_mismatch", lambda t, e: (t, e[:-3]))
    plant("range", "expert_out_of_range", lambda t, e: (t, np.where(np.arange(e.size).reshape(e.shape) == 9, N, e)))
    plant("negative", "expert_out_of_range", lambda t, e: (t, np.where(np.arange(e.size).reshape(e.shape) == 4, -1, e)))
    plant("repeat", "repeated_expert", lambda t, e: (t, np.concatenate([e[:2], e[2:3, :, :1].repeat(K, -1), e[3:]])))
    plant("layers", "layer_count", lambda t, e: (t, e[:, :L - 1]))
    plant("k", "top_k", lambda t, e: (t, e[:, :, :1]))
    return rows, faults


def test_checks_find_exactly_the_planted_faults_and_nothing_on_a_clean_trace():
    rows, faults = planted()
    checks = Checks()
    for row in rows:
        failed = checks.check(row, n_layers=L, n_experts=N, top_k=K)
        assert failed == ([faults[row.row]] if row.row in faults else []), row.row
    frame = checks.frame()
    assert frame["check"].tolist() == list(CHECKS)
    want = {c: [r for r, f in faults.items() if f == c] for c in CHECKS}
    for c, count, named in zip(frame["check"], frame["count"], frame["rows"]):
        assert count == len(want[c]) and named == ";".join(want[c]), c


def test_the_duplicate_check_spares_what_the_reference_routes_alike_and_tokens_are_checked():
    tokens, e = np.arange(6), routing(6, 9)
    e[3] = e[2]
    row = TraceRow("r", tokens, e)
    assert check_row(row, n_layers=L, n_experts=N, top_k=K) == ["duplicated_position"]
    ref = e[:, :, ::-1].copy()  # the same sets, any order
    assert check_row(row, n_layers=L, n_experts=N, top_k=K, reference=ref) == []
    ref[3] = routing(6, 99)[3]
    assert check_row(row, n_layers=L, n_experts=N, top_k=K, reference=ref) == ["duplicated_position"]
    assert check_row(TraceRow("r", np.array([0, 1, 60]), routing(3, 1)), n_layers=L, n_experts=N, top_k=K,
                     vocab_size=60) == ["token_out_of_range"]
    # with a start, the routing covers T - start positions
    assert check_row(TraceRow("s", np.arange(6), routing(4, 2), None, 2), n_layers=L, n_experts=N, top_k=K) == []
