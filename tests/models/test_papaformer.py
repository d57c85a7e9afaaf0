"""PaPaformer: auxiliary routing terms (sign, value, sites), the Share-Linear grow connection, and
parameter counts at the paper's scale (meta device)."""
import math

import pytest
import torch

from core_models import from_name, tracing
from core_models.routers import AUX_BALANCE, AUX_ENTROPY
from tiny_models import tiny_model


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
    from core_models import Ablation

    model = tiny_model("gumbel_v1")
    with tracing() as tr:
        out = model(_ids())
    assert out.aux_loss is None and not any(".aux." in n or n.endswith(".pi") for n in tr.names())
    model.train()
    out = model(_ids(), ablation=Ablation(force=(("*", 0),)))
    assert out.aux_loss is None
