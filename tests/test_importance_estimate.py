"""First-order estimates of every expert's effect (`analysis.reports.importance.estimate`): the
derivation checked against an independent computation at a small change, the estimate of a whole
drop beside the exact sweep on tiny Mixtral and OLMoE models built from transformers' config
classes, and `routescope importance --method estimate|exact|both`."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from routescope.analysis.inputs import datasets as D
from routescope.analysis.reports.importance import ImportanceSettings, importance
from routescope.analysis.reports.importance.estimate import gradients, support
from routescope.cli.main import main
from routescope.core_models.checkpoint import load_checkpoint

pytest.importorskip("transformers")
from hf_models import hf_model, save_hf  # noqa: E402

CK = Path(__file__).resolve().parents[1] / "checkpoints"
TEXTS = ["Once upon a time, there was a little girl named Lily. She loved her toys.",
         "Solve this problem: 3x + 5 = 20. Express your answer as a fraction.",
         "One day a little boy went to the park with his dog and a ball.",
         "Find the largest prime below fifty, then evaluate the sum.",
         "The cat sat on the mat and looked at the bird in the tree.",
         "Lily and Tom played in the garden until the sun went down."]


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(CK / "tokenizer.json"))


def corpus(texts=TEXTS) -> D.CorpusData:
    return D.rows_corpus("test", [D.CorpusRow(str(i), t, ()) for i, t in enumerate(texts)], [])


def _summed_nll(hf, x: torch.Tensor) -> float:
    """The batch's summed next-token NLL (every position but each row's last), plain transformers."""
    with torch.no_grad():
        logits = hf(input_ids=x).logits[:, :-1].double()
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                   reduction="sum"))


@pytest.mark.parametrize("model_type", ["olmoe", "mixtral"])
def test_the_estimate_is_the_first_order_change_of_the_loss(model_type, tok, tmp_path):
    """Scale expert e's weight in one layer's experts call by 1 - eps. Exact side: a forward pre-hook on
    transformers' own experts module of a separate copy of the model (float64), the loss difference.
    Estimate side: the estimate's gradients (one forward and one backward through RouteScope's
    replica) along the same change of the routed weights. Their ratio goes to 1 as eps -> 0, the gap
    shrinking about as eps does (the second-order term)."""
    from transformers import AutoModelForCausalLM
    from routescope.core_models.hf import HFModel

    path = save_hf(hf_model(model_type, tok.get_vocab_size()), tmp_path / model_type, tok)
    load = lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64,  # noqa: E731
                                                        experts_implementation="eager").eval()
    cfg = load_checkpoint(path, dtype="float32")[0].config
    model = HFModel(cfg, load()).eval()
    plain = load()  # never instrumented: the independent side
    # the last MoE layer; eps from 0.2 halving to 0.025: transformers' RMSNorm and routers compute in float32
    # even in a float64 model, rounding the loss by ~1e-8 nats, the first-order term's size at eps ~ 1e-5
    layer = list(model.routing_layers())[-1]
    experts = plain.get_submodule(model.routing_modules[layer].block.experts)
    x = torch.randint(3, tok.get_vocab_size(), (3, 14), generator=torch.Generator().manual_seed(0))
    gr, _ = gradients(model, x, torch.full((3,), 14), [layer])
    gr = gr[layer]
    e = int(gr.chosen.sum(0).argmax())  # the expert most tokens chose
    base = _summed_nll(plain, x)
    gaps = []
    for eps in (0.2, 0.1, 0.05, 0.025):
        def scale(module, args, kwargs, eps=eps):
            h, idx, w = (list(args) + [kwargs.get(k) for k in ("hidden_states", "top_k_index", "top_k_weights")
                                       ][len(args):])[:3]
            return (h, idx, torch.where(idx == e, w * (1 - eps), w)), {}
        handle = experts.register_forward_pre_hook(scale, with_kwargs=True)
        try:
            exact = _summed_nll(plain, x) - base
        finally:
            handle.remove()
        W = gr.W.clone()
        W[:, e] *= 1 - eps
        estimate = float(gr.along(W[None]).sum())
        gaps.append(abs(estimate / exact - 1))
        print(f"{model_type} eps {eps:g}: estimate {estimate:.6e}, exact {exact:.6e}, ratio {estimate / exact:.6f}")
    assert gaps[-1] < 1e-2 and gaps[3] < gaps[2] < gaps[1] < gaps[0]
    assert gaps[-1] < 0.25 * gaps[0]  # first order: the gap about halves with eps (1/8 over three halvings)


def _both(model, tok):
    return importance(model, tok, corpus(), ImportanceSettings(method="both", confirm=64, batch_size=3, prune_max=0,
                                                               control_draws=2))


@pytest.mark.parametrize("model_type", ["mixtral", "olmoe", "qwen2_moe"] + [  # the full suite: three more types
    pytest.param(t, marks=pytest.mark.slow) for t in ("qwen3_moe", "deepseek_v3", "gpt_oss")])
def test_the_estimate_of_a_drop_beside_the_exact_sweep(model_type, tok, tmp_path):
    """Every expert estimated and measured exactly (--confirm above the experts' count): the exact column
    equals the exact-only sweep's, the agreement table is the Spearman and top-10 recall of the two
    columns recomputed here, and the estimate ranks the experts better than chance over all layers
    (printed; qwen2_moe: its shared expert too; deepseek_v3: group-limited selection on biased scores
    and a shared expert; gpt_oss: a router with a bias, softmax over the top-k)."""
    model, _ = load_checkpoint(save_hf(hf_model(model_type, tok.get_vocab_size()), tmp_path / model_type, tok))
    assert all(v is None for v in support(model, list(model.routing_layers())).values())
    res = _both(model, tok)
    assert not [n for n in res.notes if "no first-order estimate" in n], res.notes
    imp = res["importance"]
    exact = importance(model, tok, corpus(), ImportanceSettings(method="exact", batch_size=3, prune_max=0,
                                                                control_draws=2))["importance"]
    assert (imp["method"] == "both").all() and exact["delta_nll_estimate"].isna().all()
    assert np.array_equal(imp["delta_nll"].to_numpy(), exact["delta_nll"].to_numpy())
    agree = res["estimate_agreement"]
    for r in agree.itertuples():
        g = imp[imp["layer"] == r.layer]
        assert r.options_measured == len(g)
        assert r.spearman == pytest.approx(g["delta_nll_estimate"].rank().corr(g["delta_nll"].rank()))
        assert np.isnan(r.top10_recall)  # 10 or fewer experts: recall would be 1 by construction
    rho = imp["delta_nll_estimate"].rank().corr(imp["delta_nll"].rank())
    print(f"{model_type}: Spearman of estimate and exact over {len(imp)} (layer, option): {rho:.3f}; per layer "
          f"{agree['spearman'].round(3).tolist()}")
    assert rho > 0
    if model_type == "qwen2_moe":
        shared = imp[imp["label"] == "shared expert"]
        assert len(shared) == 2 and shared["delta_nll_estimate"].notna().all()


def test_both_confirms_the_largest_estimates_and_the_control(tok):
    model, _ = load_checkpoint(CK / "olmoe-tiny", dtype="float32")
    res = importance(model, tok, corpus(), ImportanceSettings(method="both", confirm=3, max_tokens=200, batch_size=3,
                                                              prune_max=0, control_draws=2))
    imp, ctl = res["importance"], res["control"]
    for l, g in imp.groupby("layer", sort=False):
        top = set(g.reindex(g["delta_nll_estimate"].abs().sort_values(ascending=False).index)["option"][:3])
        drawn = set(ctl[ctl["layer"] == l]["option"])
        assert set(g[g["delta_nll"].notna()]["option"]) == top | drawn
        assert (g[g["delta_nll"].isna()]["method"] == "estimate").all()
    assert imp["delta_nll_estimate"].notna().all() and len(imp) == 64


def _cli(argv, capsys):
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("method", ["estimate", "exact", "both"])
def test_cli_methods(method, tmp_path, capsys):
    data = tmp_path / "d.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    code, err = _cli(["--threads", "1", "importance", CK / "olmoe-tiny", "--data", data, "--out", out, "--draws", "2",
                      "--max-tokens", "150", "--method", method, "--confirm", "4", "--quiet"], capsys)
    assert code == 0, err
    imp = pd.read_parquet(out / "importance.parquet")
    assert {"delta_nll", "delta_nll_estimate", "method"} <= set(imp.columns) and len(imp) == 64
    assert set(imp["method"]) == {"estimate": {"estimate"}, "exact": {"exact"}, "both": {"both", "estimate"}}[method]
    assert imp["delta_nll_estimate"].notna().all() != (method == "exact")
    assert imp["delta_nll"].isna().all() == (method == "estimate")
    if method == "both":
        agree = pd.read_parquet(out / "estimate_agreement.parquet")
        assert list(agree.columns) == ["layer", "options_measured", "spearman", "top10_recall"] and len(agree) == 4
        assert (imp.groupby("layer")["delta_nll"].count() >= 4).all()
    else:
        assert (out / "estimate_agreement.parquet").exists() == (method == "estimate")


@pytest.mark.parametrize("bad", [["--confirm", "0"], ["--confirm", "x"], ["--method", "fast"]])
def test_bad_method_or_confirm_is_one_line(bad, tmp_path, capsys):
    data = tmp_path / "d.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:  # argparse's refusal: one line (cli.options.Parser), exit 2
        main(["importance", str(CK / "olmoe-tiny"), "--data", str(data), "--out", str(tmp_path / "o"), *bad])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and bad[0] in err and not (tmp_path / "o").exists(), err


@pytest.mark.slow  # the exact sweep of MoEP's every option: 12 s
def test_a_family_without_an_estimate_is_measured_exactly_and_says_why(tok):
    """A RouteScope family (MoEP) has no transformers MoE block: with both, every option is measured
    exactly, the estimate column stays empty, and one note names the layers and the reason."""
    model, mtok = load_checkpoint(CK / "moep")
    res = importance(model, mtok, corpus(), ImportanceSettings(method="both", max_tokens=80, control_draws=1,
                                                               prune_max=0))
    imp = res["importance"]
    assert (imp["method"] == "exact").all() and imp["delta_nll"].notna().all()
    assert imp["delta_nll_estimate"].isna().all()
    why = [n for n in res.notes if n.startswith("no first-order estimate")]
    assert len(why) == 1 and "a RouteScope family" in why[0], res.notes
