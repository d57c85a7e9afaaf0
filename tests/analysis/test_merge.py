"""Merging experts (M-SMoE style) against pruning: each kept expert's weights the usage-weighted mean of
its group (checked against a plain loop over the state dict), the merged experts' router rows removed,
the merged checkpoint opened by transformers with RouteScope's merged run's logits; the merge curve
beside the pruning curve on the held-out rows; layouts without stacked expert weights refused."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from routescope.analysis.corpus.run import Stopped
from routescope.analysis.inputs import datasets as D
from routescope.analysis.reports.importance import ImportanceSettings, importance
from routescope.analysis.reports.importance.merge import merge_plan, merge_problem, merge_stats
from routescope.analysis.reports.importance.plan import tokens_of
from routescope.cli.main import main
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint
from tolerances import EPS32, FORWARD_EPS

pytest.importorskip("transformers")
from hf_models import hf_model, save_hf  # noqa: E402

CK = Path(__file__).resolve().parents[2] / "checkpoints"
WORDS = ["Lily", "Tom", "the dog", "a bird", "the sun", "her mother", "the cat", "a boy"]
TEXTS = [f"{WORDS[i % 8]} went to the park {i} times and saw {WORDS[(3 * i + 1) % 8]} near the tree."
         for i in range(24)]


def corpus(texts) -> D.CorpusData:
    return D.rows_corpus("t", [D.CorpusRow(f"r{i}", t, ()) for i, t in enumerate(texts)], [])


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "olmoe"])
def test_merged_weights_are_usage_weighted_means(model_type, tokenizer, tmp_path):
    """qwen2_moe: a shared expert (not merged) and a dense layer between MoE layers."""
    model, _ = load_checkpoint(save_hf(hf_model(model_type, tokenizer.get_vocab_size()), tmp_path / model_type,
                                       tokenizer), dtype="float32")
    rng = np.random.default_rng(0)
    into, usage = {}, {}
    for layer, m in model.routing_modules.items():
        n = m.n_experts
        into[layer] = {n - 1: 0, n - 2: 0} if n > 4 else {n - 1: 1}  # two into one where there are enough
        usage[layer] = list(rng.integers(0, 50, n).astype(float))
    usage[next(iter(usage))][0] = 0.0
    merged = model.merged_copy(into, usage)
    before, after = model.hf.state_dict(), merged.hf.state_dict()
    for key, w in before.items():
        layer = next((l for l, m in model.routing_modules.items() if key.startswith(m.block.experts + ".")), None)
        if layer is None:
            assert torch.equal(after[key], w), key  # router, shared expert, attention: untouched
            continue
        for e in range(w.shape[0]):
            members = [e] + [d for d, t in into[layer].items() if t == e]
            if len(members) == 1:
                assert torch.equal(after[key][e], w[e]), (key, e)
                continue
            total = sum(usage[layer][j] for j in members)
            want = sum((usage[layer][j] / total if total else 1 / len(members)) * w[j].double() for j in members)
            assert torch.allclose(after[key][e].double(), want, rtol=0, atol=4 * EPS32 * float(want.abs().max())), key


def test_merge_plan_goes_to_the_most_similar_kept_expert(tokenizer, tmp_path):
    """The similarity of two experts: the mean cosine of their own outputs over the tokens routed to the
    merged one, here from transformers' stacked weights by hand (SwiGLU: down(silu(gate x) * up x))."""
    hf = hf_model("olmoe", tokenizer.get_vocab_size())
    model, tok = load_checkpoint(save_hf(hf, tmp_path / "o", tokenizer), dtype="float32")
    tokens = tokens_of(corpus(TEXTS[:6]), tok, model.context, None)
    stats = merge_stats(model, tokens, ImportanceSettings(batch_size=4))
    layer = "model.layers.1.mlp.gate"
    inputs = []
    block = hf.model.layers[1].mlp
    hook = block.register_forward_pre_hook(lambda mod, args: inputs.append(args[0].reshape(-1, args[0].shape[-1])))
    with torch.no_grad():
        for ids in tokens.ids:
            hf(input_ids=torch.tensor([ids]))
    hook.remove()
    h = torch.cat(inputs).double()
    gate_up, down = (p.detach().double() for p in (block.experts.gate_up_proj, block.experts.down_proj))
    out = []
    for e in range(4):
        g, u = (h @ gate_up[e].T).chunk(2, dim=-1)
        out.append((torch.nn.functional.silu(g) * u) @ down[e].T)
    y = torch.nn.functional.normalize(torch.stack(out, 1), dim=-1)  # [tokens, 4, hidden]
    idx = torch.topk(h.float() @ block.gate.weight.detach().T, 2, dim=-1).indices
    routed = torch.zeros(len(h), 4).scatter_(1, idx, 1.0)
    assert np.array_equal(stats.usage[layer], routed.sum(0).numpy())
    cos = torch.einsum("tdh,teh->tde", y, y)
    for d in range(4):
        tok_d = routed[:, d] > 0
        want = cos[tok_d, d].mean(0) if tok_d.any() else cos[:, d].mean(0)
        assert np.allclose(stats.similarity[layer][d], want.numpy(), atol=1e-5)
    plan = merge_plan(stats, {l: [3, 0, 1, 2] for l in stats.usage}, 1)
    assert plan[layer] == {3: int(np.argmax(stats.similarity[layer][3][[0, 1, 2]]))}
    with pytest.raises(Stopped):  # Cancel in the view stops the merge's pass too
        merge_stats(model, tokens, ImportanceSettings(batch_size=4), stop=lambda: True)


def test_merged_checkpoint_opens_in_transformers_with_the_merged_runs_logits(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    data = tmp_path / "d.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out, merged_dir = tmp_path / "out", tmp_path / "merged"
    code = main([str(a) for a in ["--threads", "1", "importance", CK / "olmoe-tiny", "--data", data, "--out", out,
                                  "--draws", "1", "--merge", "2", "--merge-out", merged_dir, "--quiet"]])
    err = capsys.readouterr().err
    assert code == 0 and "merged checkpoint in" in err, err
    curve = pd.read_parquet(out / "merge_curve.parquet")
    assert set(curve["strategy"]) == {"prune", "merge"} and sorted(set(curve["n_removed"])) == [0, 1, 2]
    assert (curve["evaluated_on"] == "heldout").all() and (curve["rows"] == 12).all()
    prune = pd.read_parquet(out / "pruning_curve.parquet")
    held = prune[(prune.ranking == "causal") & (prune.evaluated_on == "heldout")].set_index("n_pruned")["loss"]
    for r in curve[curve.strategy == "prune"].itertuples():  # the same ablation as the pruning curve's causal line
        assert r.loss == pytest.approx(held[r.n_removed], abs=FORWARD_EPS * EPS32 * 40)

    meta = json.loads((merged_dir / "merging.json").read_text())
    into = {l: {int(d): t for d, t in p.items()} for l, p in meta["merged_into"].items()}
    usage = json.loads((out / "importance.json").read_text())["holdout"]["merge"]["usage"]
    assert all(len(p) == 2 and not set(p) & set(p.values()) for p in into.values())
    hf = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    model, tok = load_checkpoint(CK / "olmoe-tiny", dtype="float32")
    assert hf.config.num_experts == 14
    for i, (layer, pairs) in enumerate(into.items()):  # the merged experts' router rows are gone
        keep = [e for e in range(16) if e not in pairs]
        assert torch.equal(hf.model.layers[i].mlp.gate.weight, model.hf.model.layers[i].mlp.gate.weight[keep])
    run = model.merged_copy(into, usage)  # RouteScope's merged run: merged weights, merged experts dropped
    x = torch.tensor([tok.encode("Once upon a time there was a dragon who liked tea and cake.").ids])
    with torch.inference_mode():
        want = run(x, ablation=Ablation(drop=tuple((l, d) for l, p in into.items() for d in p))).logits
        got = hf(input_ids=x).logits.float()
    assert (got - want).abs().max() <= FORWARD_EPS * EPS32 * want.abs().max()
    assert "merged by RouteScope" in (merged_dir / "README.md").read_text()


def test_models_without_stacked_expert_weights_are_refused(tmp_path, capsys):
    moep, _ = load_checkpoint(CK / "moep")
    assert "not a Hugging Face model" in merge_problem(moep, 1)
    olmoe, tok = load_checkpoint(CK / "olmoe-tiny", dtype="float32")
    assert "prune 1..12" in merge_problem(olmoe, 13)
    data = tmp_path / "d.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    res = importance(moep, load_checkpoint(CK / "moep")[1], corpus(TEXTS),
                     ImportanceSettings(max_tokens=200, control_draws=1, prune_draws=1, prune_max=1, merge_max=1))
    assert "merge_curve" not in res.tables and any("no merge curve" in n and "not a Hugging Face" in n
                                                   for n in res.notes)
    for argv, message in ((["--merge", "1"], "--merge averages transformers expert weights"),
                          (["--merge-out", tmp_path / "m"], "--merge-out DIR writes the model with --merge N")):
        code = main([str(a) for a in ["importance", CK / "moep", "--data", data, "--out", tmp_path / "out", "--quiet",
                                      *argv]])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1, err
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss"])
def test_every_stacked_layout_merges_to_a_model_with_the_merged_runs_logits(model_type, tokenizer, tmp_path):
    """Each transformers MoE type of the test set: merged (one expert per layer), its merged experts removed (`pruned_copy`, what --merge-out writes) against the
    merged run (the merged weights, the merged experts dropped)."""
    model, tok = load_checkpoint(save_hf(hf_model(model_type, tokenizer.get_vocab_size()), tmp_path / model_type,
                                         tokenizer), dtype="float32")
    if model_type == "deepseek_v3":  # 8 experts in 4 groups scored by their top 2: none can go
        assert "keep a multiple of 4, at least 8" in merge_problem(model, 1)
        return
    n = 1
    assert merge_problem(model, n) is None
    tokens = tokens_of(corpus(TEXTS[:4]), tok, model.context, None)
    stats = merge_stats(model, tokens, ImportanceSettings(batch_size=4))
    plan = merge_plan(stats, {l: list(range(m.n_experts - 1, -1, -1)) for l, m in model.routing_modules.items()}, n)
    merged = model.merged_copy(plan, stats.usage)
    written = merged.pruned_copy({l: sorted(p) for l, p in plan.items()})
    x = torch.tensor([tok.encode(TEXTS[5]).ids])
    with torch.inference_mode():
        want = merged(x, ablation=Ablation(drop=tuple((l, d) for l, p in plan.items() for d in p))).logits
        got = written(input_ids=x).logits.float()
        plain = model(x, ablation=Ablation(drop=tuple((l, d) for l, p in plan.items() for d in p))).logits
    assert (got - want).abs().max() <= FORWARD_EPS * EPS32 * want.abs().max()
    assert (plain - want).abs().max() > 0  # the merge changed the kept experts (not the pruned model)
