"""PaPaformer: auxiliary routing terms (sign, value, sites), the Share-Linear grow connection, and
parameter counts at the paper's scale (meta device)."""
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from routescope.core_models import build_model, from_name, tracing
from routescope.core_models.importers import papaformer_rule
from routescope.core_models.paper_configs import PAPER_CONFIGS
from routescope.core_models.registry import param_count
from routescope.core_models.routers import AUX_BALANCE, AUX_ENTROPY
from reference_forward import papaformer_keys
from tiny_models import tiny_model

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "reference"


def _h(p: torch.Tensor) -> torch.Tensor:
    """Entropy in float64 with the reference's 1e-8 offset: -sum_i p_i log(p_i + 1e-8)."""
    p = p.double()
    return -(p * torch.log(p + 1e-8)).sum(-1)


def _ids(seed=0, shape=(2, 12)):
    return torch.randint(0, 97, shape, generator=torch.Generator().manual_seed(seed))


# --- auxiliary terms ----------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["gumbel_v1", "gumbel_v2"])
def test_aux_terms_recomputed_from_recorded_pi(key):
    model = tiny_model(key).train()
    c = model.config
    with tracing() as tr:
        out = model(_ids(), generator=torch.Generator().manual_seed(3))
    assert set(out.aux) == {AUX_ENTROPY, AUX_BALANCE}
    ent_sum = bal_sum = 0.0
    for i in range(c.n_parallel_layers):
        pre = f"parallel.{i}.router"
        pi = tr[f"{pre}.pi"]
        assert pi.shape == (2, 12, c.n_options)
        torch.testing.assert_close(pi.double().sum(-1), torch.ones(2, 12, dtype=torch.float64), rtol=1e-6, atol=0)
        assert not torch.allclose(pi, tr[f"{pre}.probs"])  # pi carries the Gumbel noise
        assert torch.equal(tr[f"{pre}.choice"], pi.argmax(-1))  # the hard route is argmax pi
        ent, bal = tr[f"{pre}.aux.entropy"], tr[f"{pre}.aux.balance"]
        assert ent.shape == () and bal.shape == ()
        # plain float64 formulas on the recorded pi
        want_ent = -float(_h(pi).mean())
        usage = pi.double().reshape(-1, c.n_options).mean(0)
        want_bal = -float(_h(usage))
        assert math.isclose(float(ent), want_ent, rel_tol=1e-5)
        assert math.isclose(float(bal), want_bal, rel_tol=1e-5)
        ent_sum += want_ent
        bal_sum += want_bal
    assert math.isclose(out.aux[AUX_ENTROPY].item(), ent_sum, rel_tol=1e-5)
    assert math.isclose(out.aux[AUX_BALANCE].item(), bal_sum, rel_tol=1e-5)
    lam = c.aux_lambda
    assert math.isclose(out.aux_loss.item(), lam * (ent_sum + bal_sum), rel_tol=1e-5)


@pytest.mark.parametrize("key", ["gumbel_v1", "gumbel_v2"])
def test_aux_terms_are_eqs_8_9_as_printed_with_the_sign_flipped_over_k_plus_1_options(key):
    """Eq. 8 as printed, -(1/N) sum_b,t sum_i pi log pi, and eq. 9, -sum_i pibar_i log pibar_i, are
    entropies: added with +lambda (eq. 10) they would sharpen routing and reward imbalance. Ours are
    their negatives (the text's stated aims), summed over all k + 1 options of pi, not eqs. 8-9's k."""
    model = tiny_model(key).train()
    k = model.config.n_paths
    with tracing() as tr:
        model(_ids(1), generator=torch.Generator().manual_seed(5))
    pi = tr["parallel.0.router.pi"].double()  # (B, T, k + 1)
    B, T, n = pi.shape
    assert n == k + 1
    eq8 = sum(-float(pi[b, t, i] * torch.log(pi[b, t, i] + 1e-8)) for b in range(B) for t in range(T)
              for i in range(n)) / (B * T)
    pibar = [float(pi[..., i].mean()) for i in range(n)]
    eq9 = -sum(p * math.log(p + 1e-8) for p in pibar)
    assert math.isclose(float(tr["parallel.0.router.aux.entropy"]), -eq8, rel_tol=1e-5)
    assert math.isclose(float(tr["parallel.0.router.aux.balance"]), -eq9, rel_tol=1e-5)
    eq9_k = -sum(p * math.log(p + 1e-8) for p in pibar[:k])  # the printed sum over the k paths only
    assert not math.isclose(eq9_k, eq9, rel_tol=1e-3)  # the combined option's share counts in ours


def _routing_entropies(model, ids):
    """(sum over layers of mean per-token H(pi), sum of H(mean usage)) with fixed Gumbel noise."""
    with tracing() as tr:
        out = model(ids, generator=torch.Generator().manual_seed(7))
    pis = [tr[f"parallel.{i}.router.pi"] for i in range(model.config.n_parallel_layers)]
    per_token = sum(float(_h(p).mean()) for p in pis)
    usage = sum(float(_h(p.double().flatten(0, -2).mean(0))) for p in pis)
    return out, per_token, usage


@pytest.mark.parametrize("key", ["gumbel_v1", "gumbel_v2"])
@pytest.mark.parametrize("term", [None, AUX_ENTROPY, AUX_BALANCE])
def test_a_step_on_the_aux_loss_softens_routing(key, term):
    """The paper's aim: soft per-token routing and balanced use. A plain gradient step on the aux
    loss alone (or on one of its terms) must raise the entropy it targets, never lower it."""
    model = tiny_model(key, seed=1).train()
    with torch.no_grad():  # start from sharp routing so there is room to soften
        for layer in model.parallel:
            layer.router.proj.weight.mul_(4.0)
            layer.router.proj.bias.mul_(4.0)
    ids = _ids(1)
    out, tok0, use0 = _routing_entropies(model, ids)
    loss = out.aux_loss if term is None else out.aux[term]
    loss.backward()
    lr = 0.5 if term is None else 0.005  # aux_loss carries lambda = 0.01
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(lr * p.grad)
    _, tok1, use1 = _routing_entropies(model, ids)
    if term in (None, AUX_ENTROPY):
        assert tok1 > tok0, (tok0, tok1)
    if term in (None, AUX_BALANCE):
        assert use1 > use0, (use0, use1)


def test_aux_is_not_computed_at_inference_or_when_forced():
    from routescope.core_models import Ablation

    model = tiny_model("gumbel_v1")
    with tracing() as tr:
        out = model(_ids())
    assert out.aux_loss is None and not any(".aux." in n or n.endswith(".pi") for n in tr.names())
    model.train()
    out = model(_ids(), ablation=Ablation(force=(("*", 0),)))
    assert out.aux_loss is None


# --- the paper's scale (meta device) --------------------------------------------------------------

PAPER = {c.preset: c for c in PAPER_CONFIGS if c.preset.startswith("papaformer-")}
VARIANT = {"papaformer-share-linear": "share_linear", "papaformer-gumbel-v1": "gumbel_v1",
           "papaformer-gumbel-v2": "gumbel_v2"}


def _reference_args(c):
    """The reference's Decoder(args, args_paraller) hyper-parameters for a PapaformerConfig."""
    args = dict(vocab_size=c.vocab_size, dim=c.d_model, n_layers=c.n_parallel_layers - 1, n_heads=c.n_heads)
    return args, dict(dim=c.d_par, n_heads=c.n_par_heads, n_parallel_blocks=c.n_paths)


def _meta_model(preset):
    cfg = from_name(preset, **PAPER[preset].overrides)
    with torch.device("meta"):
        return build_model(cfg)


@pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"parity fixtures not found at {FIXTURES}")
@pytest.mark.parametrize("name", ["papaformer_share_linear", "papaformer_gumbel_v1", "papaformer_gumbel_v2"])
def test_reference_inventory_reproduces_the_fixture_tensors(name):
    """papaformer_keys (written from the fixtures' layer map) is the reference code's state dict."""
    cfg = json.loads((FIXTURES / name / "config.json").read_text())
    with safe_open(FIXTURES / name / "weights.safetensors", "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert papaformer_keys(cfg["args"], cfg["args_paraller"], name.split("_", 1)[1]) == shapes


@pytest.mark.parametrize("preset", sorted(VARIANT))
def test_paper_scale_model_is_the_reference_model(preset):
    """At the paper's configuration our preset has exactly the reference code's tensors: every one of
    ours maps (importer rules) to reference tensors of the same shapes, and together they cover all."""
    model = _meta_model(preset)
    c = model.config
    assert c.n_parallel_layers == 3 and c.n_paths == 2 and (c.combiner == "share_linear") == c.fused_grow
    args, par = _reference_args(c)
    ref = papaformer_keys(args, par, VARIANT[preset])
    used = {}
    for key, t in model.state_dict().items():
        rule = papaformer_rule(key, tuple(t.shape), c)
        used.update(zip(rule.sources, rule.shapes))
    assert used == ref
    total = sum(math.prod(s) for s in ref.values())
    assert model.num_params() == sum(p.numel() for p in model.parameters()) == param_count(c) == total


def test_paper_scale_component_rows():
    """Each component of the paper-scale Share-Linear model against its plain formula."""
    model = _meta_model("papaformer-share-linear")
    c = model.config
    V, d, dp, k = c.vocab_size, c.d_model, c.d_par, c.n_paths
    assert (V, d, dp, k) == (50278, 256, 128, 2)

    def block(w):  # Q, K, V (no output projection), SwiGLU 3 * w * 4w + beta 4w, two RMSNorm weights
        return 3 * w * w + 3 * w * 4 * w + 4 * w + 2 * w

    def n(module):
        return sum(p.numel() for p in module.parameters())

    assert n(model.embed) == n(model.head) == V * d  # untied, as in the reference
    assert n(model.large_pre) == n(model.large_post) == block(d)
    assert n(model.shrink) == d * dp
    for i, layer in enumerate(model.parallel):
        assert n(layer.paths) == k * block(dp)
        assert n(layer.combine) == k * dp * (d if i == c.n_parallel_layers - 1 else dp)  # last Share grows to d
    paths = c.n_parallel_layers * k * block(dp)
    shares = (c.n_parallel_layers - 1) * k * dp * dp + k * dp * d
    assert model.num_params() == 2 * V * d + 2 * block(d) + d * dp + paths + shares + d  # + final norm
