"""Routing recipes: frozen parameters for a router warm-up, the Gumbel temperature schedule,
ST-MoE's router z-loss, the separate balance weight and the composition's combiner init."""
from __future__ import annotations

import fnmatch
import math

import pytest
import torch

from routescope.core_models.checkpoint import load_checkpoint, save_checkpoint
from routescope.core_models.routers import AUX_BALANCE, AUX_ENTROPY, AUX_Z
from routescope.core_models.training.compose import compose
from routescope.core_models.training.tokenizer import train_tokenizer
from routescope.core_models.training.trainer import TrainConfig, frozen_parameters, tau_at, train
from routescope.core_models import build_model, from_name
from tiny_models import tiny_model

PATHS = "parallel.*.paths.*"


def _ids(seed: int = 0, B: int = 2, T: int = 12) -> torch.Tensor:
    return torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(seed))


# --- TrainConfig ---------------------------------------------------------------------------------

def test_tau_schedule_is_geometric_from_start_to_end():
    c = TrainConfig(preset="x", steps=11, tau_start=2.0, tau_end=0.5)
    assert tau_at(0, c) == 2.0
    assert math.isclose(tau_at(10, c), 0.5, rel_tol=1e-12)
    assert math.isclose(tau_at(5, c), math.sqrt(2.0 * 0.5), rel_tol=1e-12)  # geometric midpoint
    taus = [tau_at(s, c) for s in range(11)]
    ratios = [b / a for a, b in zip(taus, taus[1:])]
    assert all(math.isclose(r, ratios[0], rel_tol=1e-9) for r in ratios)
    assert tau_at(3, TrainConfig(preset="x")) is None  # no schedule: the model's own tau


@pytest.mark.parametrize("kw", [dict(freeze=("a*",)), dict(freeze_steps=3), dict(freeze=("a*",), freeze_steps=-1),
                                dict(tau_start=1.0), dict(tau_end=0.1), dict(tau_start=0.0, tau_end=1.0),
                                dict(tau_start=float("nan"), tau_end=1.0)])
def test_incomplete_or_bad_recipe_settings_are_refused(kw):
    with pytest.raises(ValueError, match="TrainConfig"):
        TrainConfig(preset="x", **kw)


def test_frozen_parameters_are_exactly_the_matching_names():
    model = tiny_model("gumbel_v1")
    names = [n for n, _ in model.named_parameters()]
    got = frozen_parameters(model, (PATHS, "shrink.weight"))
    assert got == [n for n in names if ".paths." in n or n == "shrink.weight"]
    assert got and len(got) < len(names)
    with pytest.raises(ValueError, match="'nothing.here'"):
        frozen_parameters(model, (PATHS, "nothing.here"))


# --- a short real training run -------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(n_docs_per_domain=100, vocab_size=300, seed=0)


@pytest.fixture(scope="module")
def start(tmp_path_factory, tok):
    cfg = from_name("papaformer-gumbel-v1", vocab_size=tok.get_vocab_size(), d_model=32, d_par=16, n_heads=2,
                    n_par_heads=2, n_parallel_layers=2, context=32)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("start") / "ck"
    save_checkpoint(build_model(cfg).eval(), out, tokenizer=tok, card="# start\n\nstart card\ntext.\n",
                    dtype=torch.float32)
    return out


def _run(start, tok, out, steps, freeze_steps):
    c = TrainConfig(preset="papaformer-gumbel-v1", steps=steps, batch_size=2, seq_len=16, eval_every=100,
                    eval_docs=2, warmup=1, init_from=str(start), freeze=(PATHS,), freeze_steps=freeze_steps,
                    tau_start=2.0, tau_end=0.5, domain_routes={"story": 0, "math": 1}, domain_route_steps=2)
    train(c, tok, out, resume=False, progress=False)
    return dict(load_checkpoint(out)[0].named_parameters())


def test_frozen_parameters_stay_unchanged_for_the_warm_up_then_train(start, tok, tmp_path):
    # trained checkpoints are stored in float16: compare with the start rounded the same way
    before = {n: p.half().float() for n, p in load_checkpoint(start)[0].named_parameters()}
    during = _run(start, tok, tmp_path / "a", steps=2, freeze_steps=2)  # every step frozen
    after = _run(start, tok, tmp_path / "b", steps=3, freeze_steps=2)  # the third step trains them
    for n, p in before.items():
        frozen = fnmatch.fnmatchcase(n, PATHS)
        assert torch.equal(during[n], p) == frozen, n  # frozen: bit-identical (no update, no weight decay)
        if frozen and p.dim() >= 2:
            assert not torch.equal(after[n], p), n
    card = (tmp_path / "a" / "README.md").read_text()
    assert f"{PATHS} frozen for the first 2 steps" in card and "annealed 2.0 -> 0.5" in card
    assert "story -> option 0, math -> option 1) in every parallel layer\n" in card
    assert "- initial weights: start card text.\n" in card  # the first paragraph of the starting checkpoint's card


# --- domain routes ---------------------------------------------------------------------------------

def test_labelled_text_is_the_mixed_stream_with_its_domains():
    from itertools import islice

    from routescope.corpora import corpus

    labelled = list(islice(corpus.iter_labelled_text({"story": 0.5, "math": 0.5}, 3), 12))
    assert [t for _, t in labelled] == list(islice(corpus.iter_text({"story": 0.5, "math": 0.5}, 3), 12))
    for dom, text in labelled:  # each document is the next one of its own domain's stream
        assert text.endswith(corpus.EOT)
    by_dom = {d: [t[: -len(corpus.EOT)] for dd, t in labelled if dd == d] for d in corpus.DOMAINS}
    for d, docs in by_dom.items():
        assert docs == list(islice(corpus.iter_documents(d, 3, "train"), len(docs)))


def test_token_stream_labels_every_token_with_its_documents_domain(tok):
    from itertools import islice

    from routescope.corpora import corpus
    from routescope.core_models.training.trainer import TokenStream, domain_route_targets

    c = TrainConfig(preset="x", batch_size=4, seq_len=64, domain_routes={"story": 0, "math": 1}, domain_route_steps=1)
    stream = TokenStream(tok, c)
    got_ids, got_doms = [], []
    for _ in range(6):
        got_ids += stream.batch().ravel().tolist()
        got_doms += stream.domains.ravel().tolist()
    ids, doms = [], []  # a plain re-tokenisation of the same documents, one by one
    for d, text in islice(corpus.iter_labelled_text(c.data, c.seed), stream.docs_done):
        enc = tok.encode(text).ids
        ids += enc
        doms += [corpus.DOMAINS.index(d)] * len(enc)
    assert len(set(got_doms)) == 2
    assert got_ids == ids[:len(got_ids)] and got_doms == doms[:len(got_doms)]
    targets = domain_route_targets(torch.tensor(got_doms), c).tolist()
    assert targets == [{"story": 0, "math": 1}[corpus.DOMAINS[d]] for d in got_doms]
    assert domain_route_targets(torch.tensor([-1]), c).tolist() == [-1]  # unknown domain: free


def test_route_targets_fix_the_forward_route_and_still_train_the_router():
    model = tiny_model("gumbel_v1").train()
    ids = _ids()
    targets = torch.full(ids.shape, -1, dtype=torch.long)
    targets[0] = 1  # row 0 forced to option 1, row 1 free
    from routescope.core_models import tracing
    with tracing() as free_tr:
        model(ids, generator=torch.Generator().manual_seed(5))
    with tracing() as tr:
        out = model(ids, generator=torch.Generator().manual_seed(5), route_targets=targets)
    for i in range(model.config.n_parallel_layers):
        choice = tr[f"parallel.{i}.router.choice"]
        assert (choice[0] == 1).all()
        assert torch.equal(choice[1], tr[f"parallel.{i}.router.pi"][1].argmax(-1))
    assert torch.equal(free_tr["parallel.0.router.choice"][1], tr["parallel.0.router.choice"][1])
    F_loss = out.logits.float().logsumexp(-1).mean()
    F_loss.backward()
    assert all(float(layer.router.proj.weight.grad.abs().sum()) > 0 for layer in model.parallel)


# --- the model side: temperature per call, z-loss, balance weight ----------------------------------

def _traced(model, **kw):
    from routescope.core_models import tracing
    with tracing() as tr:
        out = model(_ids(), generator=torch.Generator().manual_seed(5), **kw)
    return out, tr


@pytest.mark.parametrize("tau", [0.25, 3.0])
def test_call_temperature_scales_the_gumbel_log_odds(tau):
    """pi = softmax((z + g) / tau): with the same noise, centred log pi scales by 1 / tau; the hard
    routes (argmax of z + g) do not depend on tau."""
    model = tiny_model("gumbel_v2").train()
    _, ref = _traced(model)  # the router's own tau = 1
    _, tr = _traced(model, gumbel_tau=tau)
    for i in range(model.config.n_parallel_layers):
        lp1 = torch.log(ref[f"parallel.{i}.router.pi"].double())
        lpt = torch.log(tr[f"parallel.{i}.router.pi"].double())
        centred = lambda x: x - x.mean(-1, keepdim=True)  # noqa: E731
        torch.testing.assert_close(centred(lpt), centred(lp1) / tau, rtol=1e-4, atol=1e-4 * centred(lp1).abs().max().item())
        assert torch.equal(tr[f"parallel.{i}.router.choice"], ref[f"parallel.{i}.router.choice"])


def test_z_loss_and_balance_weight():
    model = tiny_model("gumbel_v1", z_lambda=0.003, balance_lambda=0.2).train()
    out, tr = _traced(model)
    assert set(out.aux) == {AUX_ENTROPY, AUX_BALANCE, AUX_Z}
    z_sum = 0.0
    for i in range(model.config.n_parallel_layers):
        logits = tr[f"parallel.{i}.router.logits"].double()
        want = float((torch.logsumexp(logits, -1) ** 2).mean())  # ST-MoE eq. 5, float64
        assert math.isclose(float(tr[f"parallel.{i}.router.aux.z"]), want, rel_tol=1e-5)
        z_sum += want
    assert math.isclose(out.aux[AUX_Z].item(), z_sum, rel_tol=1e-5)
    c = model.config
    want_total = c.aux_lambda * out.aux[AUX_ENTROPY].item() + 0.2 * out.aux[AUX_BALANCE].item() + 0.003 * z_sum
    assert math.isclose(out.aux_loss.item(), want_total, rel_tol=1e-5)
    plain, _ = _traced(tiny_model("gumbel_v1").train())
    assert AUX_Z not in plain.aux  # off by default: the paper has no z-loss


@pytest.mark.parametrize("field,value", [("z_lambda", -1.0), ("balance_lambda", -0.1), ("aux_lambda", -0.01)])
def test_negative_loss_weights_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        from_name("papaformer-gumbel-v1", **{field: value})


# --- composition: combiner init --------------------------------------------------------------------

def _paths():
    torch.manual_seed(0)
    cfg = from_name("path", vocab_size=97, d_model=16, n_heads=2, n_kv_heads=2, ffn_hidden=64, n_layers=2, context=32)
    return [build_model(cfg) for _ in range(2)]


def test_combiner_init_mean_or_the_models_own_normal_init():
    paths = _paths()
    mean = compose(paths, "gumbel_v1", combiner_init="mean")
    normal = compose(paths, "gumbel_v1", combiner_init="normal")
    eye = torch.eye(16)
    for lm, ln in zip(mean.parallel, normal.parallel):
        torch.testing.assert_close(lm.combine.weight, torch.cat([eye / 2, eye / 2], 1), rtol=0, atol=0)
        w = ln.combine.weight.detach()
        assert torch.count_nonzero(ln.combine.bias) == 0
        assert math.isclose(float(w.double().std()), 0.02, rel_tol=0.2)  # N(0, 0.02), 512 samples
        assert abs(float(w.double().mean())) < 3 * 0.02 / math.sqrt(w.numel())
    with pytest.raises(ValueError, match="combiner_init 'zeros'"):
        compose(paths, "gumbel_v1", combiner_init="zeros")


def test_share_linear_route_targets_keep_only_the_target_paths_output():
    """Training with targets: a row whose tokens all target path 0 computes what the model computes
    with the other paths dropped; a free row (-1) what it computes unablated."""
    from routescope.core_models import Ablation

    model = tiny_model("share_linear").train()  # 3 paths, unfused
    ids = _ids()
    targets = torch.full(ids.shape, -1, dtype=torch.long)
    targets[0] = 0
    with torch.no_grad():
        got = model(ids, route_targets=targets).logits
        dropped = model(ids, ablation=Ablation(drop=(("*", 1), ("*", 2)))).logits
        free = model(ids).logits
    torch.testing.assert_close(got[0], dropped[0], rtol=1e-5, atol=1e-5 * float(dropped.abs().max()))
    torch.testing.assert_close(got[1], free[1], rtol=1e-5, atol=1e-5 * float(free.abs().max()))
    assert not torch.allclose(got[0], free[0])
    with torch.no_grad():  # targets only act while training
        model.eval()
        torch.testing.assert_close(model(ids, route_targets=targets).logits, model(ids).logits, rtol=0, atol=0)


def test_route_target_loss_is_the_cross_entropy_of_the_logits_toward_the_targets():
    from routescope.core_models.routers import AUX_ROUTE

    model = tiny_model("gumbel_v2", route_target_lambda=0.5).train()
    ids = _ids()
    targets = torch.full(ids.shape, -1, dtype=torch.long)
    targets[0, :7] = 1
    targets[1, 3:] = 0
    from routescope.core_models import tracing
    with tracing() as tr:
        out = model(ids, generator=torch.Generator().manual_seed(5), route_targets=targets)
    total = 0.0
    mask = targets >= 0
    for i in range(model.config.n_parallel_layers):
        logp = torch.log_softmax(tr[f"parallel.{i}.router.logits"].double(), -1)
        want = -float(logp[mask].gather(-1, targets[mask][:, None]).mean())  # plain float64 NLL
        assert math.isclose(float(tr[f"parallel.{i}.router.aux.target"]), want, rel_tol=1e-5)
        total += want
    assert math.isclose(out.aux[AUX_ROUTE].item(), total, rel_tol=1e-5)
    c = model.config
    want_loss = c.aux_lambda * (out.aux[AUX_ENTROPY].item() + out.aux[AUX_BALANCE].item()) + 0.5 * total
    assert math.isclose(out.aux_loss.item(), want_loss, rel_tol=1e-5)
    off, _ = _traced(tiny_model("gumbel_v2").train(), route_targets=targets)
    assert AUX_ROUTE not in off.aux  # off by default: the paper's routers are unsupervised


# --- model cards ------------------------------------------------------------------------------------

def test_stop_after_ends_a_longer_schedule_at_a_step_count(start, tok, tmp_path):
    base = dict(preset="papaformer-gumbel-v1", batch_size=2, seq_len=16, eval_every=100, eval_docs=2, warmup=0,
                init_from=str(start))  # no warm-up: the second step's rate already depends on the schedule's length
    stopped = train(TrainConfig(steps=4, stop_after=2, **base), tok, tmp_path / "a", resume=False, progress=False)
    short = train(TrainConfig(steps=2, **base), tok, tmp_path / "b", resume=False, progress=False)
    assert stopped["steps"] == short["steps"] == 2 and stopped["train"]["steps"] == 4
    a, b = (dict(load_checkpoint(tmp_path / d)[0].named_parameters()) for d in ("a", "b"))
    # the same two batches under another learning-rate schedule (2 of 4 steps vs all of 2): other weights
    assert any(not torch.equal(a[n], b[n]) for n in a)
    with pytest.raises(ValueError, match="stop_after"):
        TrainConfig(steps=4, stop_after=5, **base)


def test_card_reproduces_a_wall_clock_stop_by_steps_and_a_composition_by_its_command():
    from routescope.core_models.training.trainer import model_card

    t = dict(TrainConfig(preset="path", steps=700, max_minutes=10).__dict__, data={"math": 1.0})
    s = {"preset": "path", "steps": 686, "tokens": 1, "wall_seconds": 1.0, "val_loss": {"math": 0.4},
         "val_ppl": {"math": 1.5}, "params_total": 1, "params_active": 1, "train": t,
         "command": "routescope train path --steps 700 --max-minutes 10 --quiet --max-minutes 10",
         "init_command": "routescope compose --paths a b --combiner gumbel_v1 --combiner-init normal --out c"}
    card = model_card("path-math", s, {"ffn_dropout": 0.1, "atm_tau": 0.6, "n_layers": 6}, "float16")
    block = card[card.index("## Reproduce"):]
    assert "after 686 of 700 steps" in block
    assert block.index("routescope compose") < block.index(
        "routescope train path --steps 700 --max-minutes 0 --quiet --stop-after 686\n")
    assert "--max-minutes 10" not in block.split("```")[1]
    assert "- weights: stored in float16" in card and "- dropout: 0.1 on every block's FFN output" in card
    assert "- token merging: on in training at tau = 0.6 in blocks 2-3, the paper's ATM" in card


def test_the_trainer_takes_the_compose_command_from_the_starting_card(tmp_path):
    import argparse

    from routescope.cli.compose import compose_command
    from routescope.core_models.training.trainer import _init_command

    args = argparse.Namespace(paths=["p s", "q"], combiner="share_linear", combiner_init="normal", n_large_pre=1,
                              n_large_post=2, seed=0, out="o")
    cmd = compose_command(args)
    assert cmd == ("routescope compose --paths 'p s' q --combiner share_linear --combiner-init normal "
                   "--n-large-post 2 --out o")
    (tmp_path / "README.md").write_text(f"# composed\n\nUntrained composition.\n\ncommand: `{cmd}`\n")
    assert _init_command(str(tmp_path)) == cmd
    assert _init_command(None) is None
