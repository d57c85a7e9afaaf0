"""Family knowledge on the model: RoutingLayer markers named by their module paths, labels counted
from 0, family-specific call options checked, auxiliary losses only with a weight."""
from __future__ import annotations

import pytest
import torch

from routescope.core_models.base import RouteScopeLM
from routescope.core_models.sites import RoutingLayer, Site, site_name
from tiny_models import TINY, tiny_model


def expected_layers(model: RouteScopeLM) -> dict[str, int]:
    """Routing layers by each family's paper description, from its config alone."""
    c = model.config
    if c.family == "papaformer":
        return {f"parallel.{i}": c.n_paths + (c.combiner != "share_linear") for i in range(c.n_parallel_layers)}
    if c.family == "moep":
        return {"moe_shrink": c.n_experts, **{f"parallel.{i}": c.n_blocks for i in range(c.n_parallel_layers)},
                "moe_grow": c.n_experts}
    if c.family == "pgpt":
        return {"paths": c.n_paths}
    if c.family == "wiola":
        return {f"blocks.{i}.dsff": 2 for i in range(c.n_layers)}
    if c.family == "llama" and c.ffn == "pagmlp":
        return {f"blocks.{i}.ffn": 2 for i in range(c.n_layers)}
    return {}


@pytest.mark.parametrize("key", sorted(TINY))
def test_routing_layers_are_the_marked_modules_by_path(key):
    model = tiny_model(key)
    assert model.routing_layers() == expected_layers(model)
    for name, n in model.routing_layers().items():
        layer = model.get_submodule(name)
        assert isinstance(layer, RoutingLayer) and layer.name == name and layer.n_options == n
        assert len(layer.option_labels()) == n and len(set(layer.option_labels())) == n


@pytest.mark.parametrize("key", sorted(TINY))
def test_every_site_is_named_by_its_module_path(key):
    model = tiny_model(key)
    for name in model.site_names():
        assert isinstance(model.get_submodule(name), Site) and model.sites[name].name == name


def test_site_name_joins_module_path_parts():
    assert site_name("parallel", 0, "router", "probs") == "parallel.0.router.probs"
    assert site_name("blocks.2.dsff", "gate") == "blocks.2.dsff.gate"
    assert site_name("paths", 1, "out") in tiny_model("pgpt").site_names()


def test_labels_count_from_zero_like_ablation_specs():
    assert tiny_model("gumbel_v2").option_labels()["parallel.0"] == ["path 0", "path 1", "combined"]
    assert tiny_model("pgpt").option_labels()["paths"] == ["path 0", "path 1"]
    labels = tiny_model("moep").option_labels()
    assert labels["moe_shrink"][0] == "expert 0" and labels["parallel.0"][2] == "block 2"


@pytest.mark.parametrize("key,forceable", [("gumbel_v2", True), ("share_linear", False), ("moep", True),
                                           ("pgpt", True), ("wiola", True), ("pagmlp", False)])
def test_can_force_where_a_router_decides(key, forceable):
    assert {m.can_force for m in tiny_model(key).routing_modules.values()} == {forceable}


@pytest.mark.parametrize("key", ["pagmlp", "share_linear"])
def test_forcing_a_layer_without_router_drops_the_others(key):
    """Layers without a router: force j is drop every other option (same logits)."""
    from routescope.core_models.ablation import Ablation
    model = tiny_model(key)
    layer, n = next(iter(model.routing_layers().items()))
    x = torch.randint(0, model.vocab_size, (1, 6))
    forced = model(x, ablation=Ablation(force=((layer, 0),))).logits
    dropped = model(x, ablation=Ablation(drop=tuple((layer, j) for j in range(1, n)))).logits
    torch.testing.assert_close(forced, dropped, rtol=0, atol=0)  # the same operations run


@pytest.mark.parametrize("key", ["gumbel_v2", "pgpt", "moep", "pagmlp"])
def test_a_family_option_given_to_another_family_says_so(key):
    model = tiny_model(key)
    x = torch.randint(0, model.vocab_size, (1, 4))
    with pytest.raises(ValueError, match=rf"^atm: not an option of {model.config.label} models"):
        model(x, atm=True)
    model(x, atm=None)  # None is the default of every option: accepted


def test_wiola_takes_its_options():
    model = tiny_model("wiola")
    assert set(model.run_options()) == {"atm", "atm_tau", "atm_causal"}
    model(torch.randint(0, model.vocab_size, (1, 6)), atm=True, atm_tau=0.5)
    with pytest.raises(ValueError, match="gumbel_tau: not an option of wiola"):
        model(torch.randint(0, model.vocab_size, (1, 6)), gumbel_tau=0.5)


def test_an_auxiliary_loss_without_a_weight_raises(monkeypatch):
    model = tiny_model("gumbel_v2").train()
    x = torch.randint(0, model.vocab_size, (2, 5))
    out = model(x)
    assert set(out.aux) <= set(model.aux_weights()) and out.aux_loss is not None
    monkeypatch.setattr(type(model), "aux_weights", lambda self: {})
    with pytest.raises(KeyError, match="have no weight"):
        model(x)
