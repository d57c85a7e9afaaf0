"""Where a model type records no router probabilities (gpt-oss: its router returns logits only and
the MoE block takes the softmax of the picks), the views say why, from the type's own record,
instead of showing an empty probability column or a matrix of weights as if they were probabilities."""
from __future__ import annotations

import pytest

import routescope as rs
from routescope.core_models.checkpoint import load_checkpoint
from routescope.core_models.hf import quirks
from routescope.core_models.sites import PROBS

from hf_models import saved_models


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    return saved_models(tmp_path_factory, tokenizer)


def notes_of(run) -> dict[str, list[str]]:
    return {name: list(v.frame.attrs.get("notes", [])) for name, v in run.views.items()}


def test_gpt_oss_views_say_why_there_are_no_probabilities(saved, tokenizer):
    _, path = saved("gpt_oss")
    model, _ = load_checkpoint(path)
    why = quirks.quirk("gpt_oss").reason(PROBS)  # the type's record
    layers = list(model.routing_modules)
    assert {model.routing_modules[n].unavailable.get(PROBS) for n in layers} == {why}
    run = rs.run(model, tokenizer, "Once upon a time", max_new_tokens=2, greedy=True)
    routes = run.views["topk_routes"].frame
    assert routes["prob"].isna().all()  # nothing recorded: the column is empty...
    (note,) = notes_of(run)["topk_routes"]  # ...and the view says why, once for all its layers
    assert why in note and f"{len(layers)} layers" in note and "gpt_oss" in note


def test_a_type_with_probabilities_has_no_such_note(saved, tokenizer):
    _, path = saved("mixtral")
    model, _ = load_checkpoint(path)
    run = rs.run(model, tokenizer, "Once upon a time", max_new_tokens=2, greedy=True)
    assert not run.views["topk_routes"].frame["prob"].isna().any()
    assert notes_of(run)["topk_routes"] == []
