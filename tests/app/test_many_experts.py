"""Past MANY_OPTIONS options a layer's options are told apart by their place on an axis, never by
colour alone: the token x expert matrix, the layer x option utilisation heatmap, the load-balance
summary and the top co-selections, checked against plain computations on a tiny 16-expert
Qwen3-MoE (transformers' own class); the seed families keep their categorical colours."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from routescope.analysis.export import columns as C
from routescope.analysis.runs import routing as R
from routescope.analysis.runs.session import RunSettings, run_prompt
from routescope.rendering import drawers as D
from routescope.rendering.families import topk as RT
from routescope.core_models.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Once upon a time there was a little girl who liked to play in the park"


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    import transformers as T
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(ROOT / "checkpoints" / "tokenizer.json"))
    cfg = T.Qwen3MoeConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=32,
                           moe_intermediate_size=8, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=8, num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
                           max_position_embeddings=128)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("moe16") / "moe16"
    T.Qwen3MoeForCausalLM(cfg).save_pretrained(path)
    tokenizer.save(str(path / "tokenizer.json"))
    model, tok = load_checkpoint(path)
    return model, tok, run_prompt(model, tok, PROMPT, settings=RunSettings(max_new_tokens=4))


def test_the_matrix_holds_every_probability_and_marks_the_picks(many):
    model, _, run = many
    assert R.many_options(model)
    probs = run.views["topk_probs"].frame
    routes = run.views["topk_routes"].frame
    for layer, g in probs.groupby(C.LAYER):
        p = g.pivot(index=C.POSITION, columns=C.OPTION, values=C.PROB).to_numpy()
        np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-5)  # softmax over the 16 experts
        picked = routes[routes[C.LAYER] == layer]
        got = set(zip(g[g[C.SELECTED]][C.POSITION], g[g[C.SELECTED]][C.OPTION]))
        assert got == set(zip(picked[C.POSITION], picked[C.OPTION]))
        # each pick's probability and rank are the ones topk_routes recorded
        m = g.merge(picked, on=[C.BATCH, C.POSITION, C.LAYER, C.OPTION], suffixes=("", "_r"))
        np.testing.assert_allclose(m[C.PROB], m[C.PROB + "_r"], rtol=1e-6)
        assert (m[C.RANK] == m[C.RANK + "_r"]).all()
        # the top-4 by probability are the picks (Qwen3-MoE picks by softmax probability)
        top = np.argsort(-p, axis=1, kind="stable")[:, :4]
        assert {(t, o) for t in range(len(p)) for o in top[t]} == got


def test_load_balance_against_a_plain_loop(many):
    _, _, run = many
    util = run.views["topk_utilisation"].frame
    bal = run.views["topk_balance"].frame.set_index("layer")
    for layer, g in util.groupby(C.LAYER):
        c = [int(x) for x in g[C.COUNT]]
        mean = sum(c) / len(c)
        std = math.sqrt(sum((x - mean) ** 2 for x in c) / len(c))
        ent = -sum(x / sum(c) * math.log(x / sum(c)) for x in c if x) / math.log(len(c))
        row = bal.loc[layer]
        assert row["options"] == 16 and row["dead"] == sum(x < 0.01 * mean for x in c)
        assert row["overloaded"] == sum(x > 2 * mean for x in c)
        assert math.isclose(row["max_over_mean"], max(c) / mean, rel_tol=1e-12)
        assert math.isclose(row["cv"], std / mean, rel_tol=1e-9)
        assert math.isclose(row["entropy"], ent, rel_tol=1e-9)


def test_many_options_are_drawn_by_place_not_colour(many):
    model, _, run = many
    pieces = D.run_pieces(run, model)
    assert "topk_routes" not in pieces  # the categorical first-choice grid is gone
    matrix = pieces["topk_probs"]
    heat = [t for t in matrix.data if t.type == "heatmap"]
    assert len(heat) == len(model.routing_modules) and [t.visible for t in heat] == [True, False, False]
    assert np.asarray(heat[0].z).shape == (16, len(run.display_tokens()))
    menu = matrix.layout.updatemenus[0]
    assert [b.label for b in menu.buttons] == list(model.routing_modules)
    util = pieces["topk_utilisation"]
    assert util.data[0].type == "heatmap" and np.asarray(util.data[0].z).shape == (3, 16)
    u = run.views["topk_utilisation"].frame
    dead = u[u[C.COUNT] < 0.01 * u.groupby(C.LAYER)[C.COUNT].transform("mean")]
    assert sorted(zip(util.data[1].y, util.data[1].x)) == sorted(zip(dead[C.LAYER], dead[C.OPTION].astype(str)))
    co = pieces["topk_coselection"]
    assert co.groupby(C.LAYER).size().max() <= RT.COSELECTED_TOP and (co[C.COUNT] > 0).all()
    full = run.views["topk_coselection"].frame
    for layer, g in co.groupby(C.LAYER):  # the most frequent pairs, in order
        want = full[full[C.LAYER] == layer][C.COUNT].sort_values(ascending=False).head(len(g)).tolist()
        assert g[C.COUNT].tolist() == want


def test_the_seed_families_keep_their_colours():
    model, tok = load_checkpoint(ROOT / "checkpoints" / "moep")
    run = run_prompt(model, tok, PROMPT, settings=RunSettings(max_new_tokens=2))
    assert not R.many_options(model) and "topk_probs" not in run.views
    pieces = D.run_pieces(run, model)
    assert "topk_routes" in pieces and pieces["topk_utilisation"].data[0].type == "bar"
    assert isinstance(pieces["topk_coselection"], pd.DataFrame)
