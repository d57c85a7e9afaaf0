"""Causal expert importance: equal to an independent loop in plain transformers (each expert dropped
by masking its router logit before the top-k), the fast path (prefix reuse, many ablations per
forward) equal to the naive loop, resumed runs equal to whole ones, bad input refused in one line."""
from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus.run import Stopped
from routescope.analysis.reports.importance import ImportanceSettings, importance
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint
from tolerances import EPS32, FORWARD_EPS

pytest.importorskip("transformers")
from hf_models import hf_model, save_hf  # noqa: E402

OLMOE = Path(__file__).resolve().parents[2] / "checkpoints" / "olmoe-tiny"
TEXTS = ["Once upon a time, there was a little girl named Lily. She loved her toys.",
         "Solve this problem: 3x + 5 = 20. Express your answer as a fraction.",
         "One day a little boy went to the park with his dog and a ball.",
         "Find the largest prime below fifty, then evaluate the sum.",
         "The cat sat.", "Lily and Tom played in the garden until the sun went down."]


def corpus(texts=TEXTS) -> D.CorpusData:
    return D.rows_corpus("test", [D.CorpusRow(str(i), t, ()) for i, t in enumerate(texts)], [])


def _olmoe_router_dropping(expert: int):
    """OLMoE's router with one expert's logit set to -inf before softmax and top-k (a plain rewrite of
    transformers' OlmoeTopKRouter.forward, for this independent computation only)."""
    def forward(self, hidden_states):
        h = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(h, self.weight)
        logits[:, expert] = float("-inf")
        probs = torch.softmax(logits, dtype=torch.float, dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(-1, keepdim=True)
        return logits, top.to(logits.dtype), idx
    return forward


def _plain_effects(hf, rows: list[list[int]]) -> tuple[float, np.ndarray, np.ndarray]:
    """(total NLL, [positions] log-probs) of each row run alone, no padding."""
    lps = []
    for ids in rows:
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([ids])).logits[0, :-1].float()
        lps.append(torch.log_softmax(logits, -1))
    lp = torch.cat(lps)
    targets = torch.cat([torch.tensor(ids[1:]) for ids in rows])
    return lp, targets


def test_delta_nll_equals_a_plain_transformers_loop():
    """Every expert of two layers dropped by a plain loop over transformers' own model: delta NLL,
    KL(unablated || ablated) and top-1 flips over the dataset equal the importance table."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model, tok = load_checkpoint(OLMOE, dtype="float32")
    layers = ("model.layers.1.mlp.gate", "model.layers.3.mlp.gate")
    res = importance(model, tok, corpus(), ImportanceSettings(layers=layers, batch_size=4, prune_max=0,
                                                              control_draws=2))
    table = res["importance"]
    hf = AutoModelForCausalLM.from_pretrained(OLMOE, dtype=torch.float32).eval()
    plain_tok = Tokenizer.from_file(str(OLMOE / "tokenizer.json"))
    rows = [plain_tok.encode(t).ids for t in TEXTS]
    base_lp, targets = _plain_effects(hf, rows)
    base_nll = -base_lp.gather(-1, targets[:, None])[:, 0]
    n = len(targets)
    assert res.provenance["predicted_positions"] == n
    assert res.provenance["base_loss"] == pytest.approx(float(base_nll.mean()), rel=FORWARD_EPS * EPS32)
    want = []
    for layer in layers:
        router = hf.get_submodule(layer)
        for e in range(router.num_experts):
            router.forward = types.MethodType(_olmoe_router_dropping(e), router)
            try:
                lp, _ = _plain_effects(hf, rows)
            finally:
                del router.forward  # the class's forward again
            nll = -lp.gather(-1, targets[:, None])[:, 0]
            kl = (base_lp.exp() * (base_lp - lp)).sum(-1)
            flips = (lp.argmax(-1) != base_lp.argmax(-1)).float()
            want.append((layer, e, float((nll - base_nll).mean()), float(kl.mean()), float(flips.mean())))
    assert list(zip(table["layer"], table["option"])) == [(l, e) for l, e, *_ in want]
    got_d, want_d = table["delta_nll"].to_numpy(), np.array([w[2] for w in want])
    # a sum of per-position differences of NLLs of about base_loss: float32 rounding of that scale
    scale = float(base_nll.abs().max())
    assert np.abs(got_d - want_d).max() <= FORWARD_EPS * EPS32 * scale, np.abs(got_d - want_d).max()
    assert np.abs(want_d).max() > 100 * FORWARD_EPS * EPS32 * scale  # the effects are far above that bound
    assert np.abs(table["kl"].to_numpy() - [w[3] for w in want]).max() <= FORWARD_EPS * EPS32 * scale
    assert np.allclose(table["flip_rate"], [w[4] for w in want], atol=1.5 / n)  # a near-tie may flip once
    assert (table["delta_nll_low"] <= table["delta_nll"]).all() and (table["delta_nll"] <= table["delta_nll_high"]).all()
    assert np.allclose(table.groupby("layer")["usage"].sum(), 1.0)
    ctl = res["control"]
    assert (ctl["kind"] == "control").all() and len(ctl) == 2 * len(layers)
    for r in ctl.itertuples():  # a control draw is the same ablation as that expert's row
        assert r.delta_nll == table[(table.layer == r.layer) & (table.option == r.option)]["delta_nll"].item()


def _compare(a, b, cols, scale):
    for c in cols:
        d = np.abs(a[c].to_numpy(float) - b[c].to_numpy(float))
        assert d.max() <= FORWARD_EPS * EPS32 * scale, (c, d.max())


@pytest.mark.parametrize("model_type", ["olmoe-tiny", "qwen2_moe"])
def test_prefix_reuse_and_batched_ablations_equal_the_naive_loop(model_type, tokenizer, tmp_path):
    """qwen2_moe: a dense layer between MoE layers (decoder index != router index) and a shared
    expert (zeroed per row)."""
    if model_type == "olmoe-tiny":
        model, tok = load_checkpoint(OLMOE, dtype="float32")
    else:
        model, tok = load_checkpoint(save_hf(hf_model(model_type, tokenizer.get_vocab_size()),
                                             tmp_path / model_type, tokenizer))
    assert model.can_resume
    s = dict(max_tokens=200, batch_size=4, control_draws=3, prune_draws=2, in_sample_curve=True)  # 6 rows: in-sample
    naive = importance(model, tok, corpus(), ImportanceSettings(sweep="naive", **s))
    fast = importance(model, tok, corpus(), ImportanceSettings(sweep="fast", ablations_per_forward=5, **s))
    assert fast.provenance["method"] == "prefix reuse, 5 ablation(s) per forward" and naive.provenance["method"].startswith("one full")
    scale = naive.provenance["base_loss"] * 4
    _compare(fast["importance"], naive["importance"], ["delta_nll", "delta_nll_low", "delta_nll_high", "kl"], scale)
    assert np.allclose(fast["importance"]["flip_rate"], naive["importance"]["flip_rate"], atol=1.5 / 200)
    _compare(fast["pruning"], naive["pruning"], ["loss"], scale)
    assert fast["proxies"]["reap"].equals(naive["proxies"]["reap"])
    if model_type == "qwen2_moe":
        shared = fast["importance"][fast["importance"]["label"] == "shared expert"]
        assert len(shared) == 2 and (shared["delta_nll"].abs() > 0).all() and shared["usage"].isna().all()


def test_row_ablations_equal_one_call_per_ablation(tokenizer, tmp_path):
    model, tok = load_checkpoint(save_hf(hf_model("qwen2_moe", tokenizer.get_vocab_size()), tmp_path / "q", tokenizer))
    layers = list(model.routing_layers())
    abl = [Ablation(), Ablation(drop=((layers[0], 1),)), Ablation(drop=((layers[1], 6), (layers[0], 2)))]
    x = torch.tensor([tok.encode(t).ids[:8] for t in TEXTS[:2]])
    with torch.inference_mode():
        rows = model(x.repeat(3, 1), row_ablations=[a for a in abl for _ in range(2)]).logits
        for j, a in enumerate(abl):
            want = model(x, ablation=a).logits
            assert (rows[2 * j:2 * j + 2] - want).abs().max() <= FORWARD_EPS * EPS32 * want.abs().max()
    with pytest.raises(ValueError, match="one per row"):
        model(x, row_ablations=[Ablation()])


def test_a_stopped_run_resumes_from_its_cache(tmp_path):
    model, tok = load_checkpoint(OLMOE, dtype="float32")
    s = ImportanceSettings(layers=("model.layers.2.mlp.gate",), batch_size=2, control_draws=2, prune_draws=1, prune_max=2,
                           in_sample_curve=True)
    whole = importance(model, tok, corpus(), s)
    seen = []

    def stop_after_first():  # progress comes after every forward: stop once the first batch (2 rows) is whole
        return bool(seen) and seen[-1] >= 2

    with pytest.raises(Stopped):
        importance(model, tok, corpus(), s, weights_sha256="w", cache_dir=tmp_path,
                   progress=lambda d, t: seen.append(d), stop=stop_after_first)
    assert list(tmp_path.glob("effects-*.safetensors")) and not list(tmp_path.glob(".*tmp"))
    again = []
    resumed = importance(model, tok, corpus(), s, weights_sha256="w", cache_dir=tmp_path,
                         progress=lambda d, t: again.append(d))
    assert again[0] > 2  # the first batch came from the cache
    for name in ("importance", "control", "proxies", "pruning_curve"):
        a, b = whole[name], resumed[name]
        num = a.select_dtypes("number").columns
        assert np.allclose(a[num].to_numpy(float), b[num].to_numpy(float), equal_nan=True, rtol=0, atol=0), name


def test_bad_input_is_one_line():
    model, tok = load_checkpoint(OLMOE, dtype="float32")
    with pytest.raises(ValueError, match="no routing layer 'model.layers.9.mlp.gate'"):
        importance(model, tok, corpus(), ImportanceSettings(layers=("model.layers.9.mlp.gate",)))
    with pytest.raises(ValueError, match="option 16 out of range 0..15"):
        importance(model, tok, corpus(), ImportanceSettings(options=(16,)))
    with pytest.raises(ValueError, match="nothing to predict"):
        importance(model, tok, corpus(["a"]), ImportanceSettings())
    dense, dtok = load_checkpoint(OLMOE.parent / "llama-dense")
    with pytest.raises(ValueError, match="has no routing layers"):
        importance(dense, dtok, corpus(), ImportanceSettings())


def test_a_routescope_family_runs_the_naive_loop():
    """A seed-paper family (MoEP) has no prefix reuse: the naive loop, with the same table."""
    model, tok = load_checkpoint(OLMOE.parent / "moep")
    res = importance(model, tok, corpus(), ImportanceSettings(max_tokens=120, control_draws=2, prune_draws=1))
    t = res["importance"]
    assert res.provenance["method"] == "one full forward per ablation" and len(t) == sum(model.routing_layers().values())
    assert np.isfinite(t["delta_nll"]).all() and (t["delta_nll_low"] <= t["delta_nll_high"]).all()
    layer, option = t.iloc[0]["layer"], int(t.iloc[0]["option"])
    ids = [tok.encode(x).ids for x in TEXTS]
    total = n = 0.0
    taken, budget = [], 120  # up to 120 tokens in row order, as the sweep takes them
    for row in ids:
        row = row[:budget]
        if row:
            taken.append(row)
        budget -= len(row)
        if budget <= 0:
            break
    with torch.inference_mode():
        for row in taken:
            x = torch.tensor([row])
            a = torch.log_softmax(model(x, ablation=Ablation(drop=((layer, option),))).logits[0, :-1], -1)
            b = torch.log_softmax(model(x).logits[0, :-1], -1)
            tgt = x[0, 1:, None]
            total += float((b.gather(-1, tgt) - a.gather(-1, tgt)).sum())
            n += len(row) - 1
    assert t.iloc[0]["delta_nll"] == pytest.approx(total / n, abs=FORWARD_EPS * EPS32 * 10)


def test_rs_importance_returns_the_frames(tmp_path):
    import routescope as rs

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:3]), encoding="utf-8")
    model, tok = rs.load(OLMOE)
    frames = rs.importance(model, tok, data, layers=["model.layers.0.mlp.gate"], options=[0, 1, 2], control_draws=2)
    assert set(frames) == {"importance", "control", "control_summary", "proxies", "proxy_agreement"}
    assert list(frames["importance"]["option"]) == [0, 1, 2]


@pytest.mark.slow
def test_ray_engine_equals_one_process_and_resumes_from_its_cache(tmp_path):
    """Ray actors measure batches of rows: progress per batch, counted as one process counts it; a
    stopped Ray run leaves its cache, the rerun measures only the rest, and every table equals one
    process's exactly (each batch is the same computation)."""
    pytest.importorskip("ray", reason="ray is not installed (the distributed extra)")
    model, tok = load_checkpoint(OLMOE, dtype="float32")
    s = ImportanceSettings(layers=("model.layers.0.mlp.gate", "model.layers.3.mlp.gate"), max_tokens=150, batch_size=2,
                           control_draws=2, prune_draws=2, prune_max=2, in_sample_curve=True)
    local = []
    one = importance(model, tok, corpus(), s, progress=lambda d, t: local.append((d, t)))
    ray_run = dict(weights_sha256="w", cache_dir=tmp_path, engine="ray", checkpoint=OLMOE, workers=2)
    seen = []
    with pytest.raises(Stopped):
        importance(model, tok, corpus(), s, progress=lambda d, t: seen.append((d, t)), stop=lambda: len(seen) >= 1,
                   **ray_run)
    assert seen == [(2, local[-1][1])]  # one batch of 2 rows, of rows x passes as one process counts them
    assert list(tmp_path.glob("effects-*.safetensors")) and not list(tmp_path.glob(".*tmp"))
    again = []
    resumed = importance(model, tok, corpus(), s, progress=lambda d, t: again.append((d, t)), **ray_run)
    assert again[0][0] == 4  # the stopped run's batch came from the cache: the first new one ends at 4 rows
    assert [d for d, _ in again] == sorted(d for d, _ in again) and again[-1] == local[-1]
    # one report per batch of 2 rows after the cached one (one process reports after every forward too),
    # each where one process's reports pass it
    assert [d for d, _ in again] == list(range(4, int(round(local[-1][0])) + 1, 2))
    assert all(any(math.isclose(d, l, rel_tol=1e-9) for l, _ in local) for d, _ in again)
    for name in ("importance", "control", "proxies", "pruning_curve"):
        a, b = one[name], resumed[name]
        num = a.select_dtypes("number").columns
        assert np.array_equal(a[num].to_numpy(float), b[num].to_numpy(float), equal_nan=True), name
