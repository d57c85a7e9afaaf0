"""Every family declares its routing roles on its layers (`core_models.sites.RoleLayer`): each role a
layer declares names a site that a traced call records, with the axes `ROLE_AXES` documents for the
role, sized by the call and the layer. Checked against the trace itself, for a tiny model of every
preset family (and the shipped Hugging Face presets), so a family's analysis can read any role it
asks for."""
from __future__ import annotations

import pytest
import torch

from routescope.core_models import build_model, from_name, registry
from routescope.core_models.sites import (CHOICE, INDICES, MERGE_MAP, OPTION_ROLES, ROLE_AXES, ROLES, WEIGHTS,
                                          RoleLayer)
from routescope.core_models.trace import tracing
from tiny_models import TINY, tiny_model

B, T = 2, 6
INTEGER_ROLES = (INDICES, CHOICE, MERGE_MAP)  # documented as int64
HF_PRESETS = sorted(name for name, (family, _) in registry.PRESETS.items() if family == "hf")


def traced(key: str):
    """(model, trace of one call on a (B, T) prompt); Wiola with token merging on, as its ATM layers
    record their roles only when they merge."""
    if key in HF_PRESETS:
        torch.manual_seed(0)
        model = build_model(from_name(key)).eval()
    else:
        model = tiny_model(key, **({"atm_tau": 0.3} if key == "wiola" else {}))
    options = {"atm": True} if key == "wiola" else {}
    x = torch.randint(0, model.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), tracing() as tr:
        model(x, **options)
    return model, tr


def check_axes(x: torch.Tensor, axes: tuple[str, ...], layer: RoleLayer, where: str) -> None:
    """x's shape against a role's documented axes: batch and pos from the call, n and options from
    the layer; k and width any size."""
    sizes = {"batch": B, "pos": T, "pos-1": T - 1, "n": getattr(layer, "n_routed", None),
             "options": getattr(layer, "n_options", None)}
    assert x.dim() == len(axes), (where, tuple(x.shape), axes)
    for size, axis in zip(x.shape, axes):
        if axis in ("k", "width"):
            assert size > 0, (where, axis)
        else:
            assert size == sizes[axis], (where, axis, size, sizes[axis])


def test_every_role_documents_its_axes():
    assert set(ROLE_AXES) == set(ROLES) | set(OPTION_ROLES) and not set(ROLES) & set(OPTION_ROLES)


def test_tiny_models_cover_every_preset_family():
    families = {family for family, _ in registry.PRESETS.values()} - {"hf"}
    assert families <= {from_name(preset).family for preset, _ in TINY.values()}


@pytest.mark.parametrize("key", sorted(TINY) + HF_PRESETS)
def test_declared_roles_are_recorded_with_their_documented_axes(key):
    model, tr = traced(key)
    layers = model.role_layers()
    assert set(model.routing_modules) <= set(layers)  # every routing layer declares its roles
    for name, layer in layers.items():
        assert layer.name == name
        for role, site in layer.roles.items():
            assert role in ROLES, (name, role)
            assert site in tr, (name, role, site)
            check_axes(tr[site], ROLE_AXES[role], layer, f"{name} {role}")
            if role in INTEGER_ROLES:
                assert tr[site].dtype == torch.int64, (name, role)
        if INDICES in layer.roles:  # k picks, a weight for each
            assert tr[layer.roles[INDICES]].shape == tr[layer.roles[WEIGHTS]].shape
        for role, sites in layer.option_roles.items():
            assert role in OPTION_ROLES, (name, role)
            assert 0 < len(sites) <= layer.n_options, (name, role)  # the first options, in order
            ran = [s for s in sites if s in tr]  # a path that did not run records nothing
            assert ran, (name, role)
            for site in ran:
                check_axes(tr[site], ROLE_AXES[role], layer, f"{name} {role} {site}")


@pytest.mark.parametrize("key", sorted(TINY))
def test_sites_of_a_role_are_the_layers_declarations(key):
    """`model.sites_of(role)` / `option_sites_of(role)` gather the layers' own declarations, in
    module order."""
    model = tiny_model(key)
    layers = model.role_layers()
    for role in ROLES:
        assert model.sites_of(role) == {n: m.roles[role] for n, m in layers.items() if role in m.roles}
    for role in OPTION_ROLES:
        assert model.option_sites_of(role) == {n: m.option_roles[role] for n, m in layers.items()
                                               if role in m.option_roles}
    assert list(layers) == [n for n, m in model.named_modules() if isinstance(m, RoleLayer)]
