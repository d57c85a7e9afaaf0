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
    layered = pieces["topk_probs"]
    assert layered.layers == tuple(model.routing_modules)
    matrix = layered.whole()  # the offline page's: every layer behind a dropdown
    heat = [t for t in matrix.data if t.type == "heatmap"]
    assert len(heat) == len(model.routing_modules) and [t.visible for t in heat] == [True, False, False]
    assert np.asarray(heat[0].z).shape == (16, len(run.display_tokens()))
    menu = matrix.layout.updatemenus[0]
    assert [b.label for b in menu.buttons] == list(model.routing_modules)
    # the app's: one layer's panel alone, equal to that layer's panel of the whole figure
    probs = run.views["topk_probs"].frame
    for j, layer in enumerate(layered.layers):
        one = layered.one(layer)
        assert not one.layout.updatemenus and layer in one.layout.title.text
        (h,) = [t for t in one.data if t.type == "heatmap"]
        np.testing.assert_array_equal(np.asarray(h.z), np.asarray(heat[j].z))
        p = probs[(probs[C.BATCH] == 0) & (probs[C.LAYER] == layer)]
        assert np.nanmax(np.abs(np.asarray(h.z, dtype=float)[p[C.OPTION], p[C.POSITION]] - p[C.PROB])) <= 5e-5
        (picked,) = [t for t in one.data if t.type == "scatter"]
        sel = p[p[C.SELECTED]]
        assert sorted(zip(picked.x, picked.y)) == sorted(zip(sel[C.POSITION], sel[C.OPTION]))
    util = pieces["topk_utilisation"]
    assert util.data[0].type == "heatmap" and np.asarray(util.data[0].z).shape == (3, 16)
    u = run.views["topk_utilisation"].frame
    g = u.groupby(C.LAYER)[C.COUNT]
    reached = g.transform("sum") >= 5 * g.transform("size")  # enough selections to reach every option
    dead = u[reached & (u[C.COUNT] < 0.01 * g.transform("mean"))]
    marked = {t.name: sorted(zip(t.y, t.x)) for t in util.data if t.type == "scatter" and t.visible is not False}
    assert marked.get("dead", []) == sorted(zip(dead[C.LAYER], dead[C.OPTION].astype(str)))
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


def _utilisation(n_tokens: int, n: int = 128, k: int = 8, layers: int = 3, seed: int = 0) -> pd.DataFrame:
    """A run's `topk_utilisation` frame: n_tokens tokens each picking k distinct of n options, the
    router skewed (Zipf-like) as trained routers are."""
    rng = np.random.default_rng(seed)
    rows = []
    for l in range(layers):
        p = 1.0 / np.arange(1, n + 1) ** 1.1
        p = rng.permutation(p / p.sum())
        picks = np.stack([rng.choice(n, size=k, replace=False, p=p) for _ in range(n_tokens)])
        counts = np.bincount(picks.ravel(), minlength=n)
        rows.append(pd.DataFrame({C.LAYER: f"model.layers.{l}.mlp.gate", C.OPTION: np.arange(n), C.COUNT: counts,
                                  C.N_TOKENS: n_tokens, C.SHARE: counts / n_tokens}))
    return pd.concat(rows, ignore_index=True)


def _drawn(u: pd.DataFrame):
    from routescope.analysis.runs.views import FAMILY, View
    from routescope.rendering.draw_context import DrawContext

    labels = {l: [f"expert {o}" for o in range(g[C.OPTION].max() + 1)] for l, g in u.groupby(C.LAYER, sort=False)}
    return RT.utilisation("topk_utilisation", View(u, FAMILY), DrawContext(["a"], None, labels))["topk_utilisation"]


@pytest.mark.parametrize("n_tokens", [33, 100])
def test_a_run_calls_experts_dead_only_where_its_selections_could_reach_every_one(n_tokens):
    """33 tokens x top-8 = 264 selections cannot reach 128 experts (5 per option = 640 would): no ✕
    and the chart and the balance table say why; 100 tokens (800 selections) mark the dead ones."""
    u = _utilisation(n_tokens)
    fig, bal = _drawn(u), R.load_balance(u).set_index("layer")
    marks = {t.name: set(zip(t.y, t.x)) for t in fig.data if t.type == "scatter" and t.visible is not False}
    enough = n_tokens * 8 >= 5 * 128
    title = f"{fig.layout.title.text} {fig.layout.title.subtitle.text or ''}".lower()
    if not enough:
        assert (u.groupby(C.LAYER)[C.COUNT].min() == 0).all()  # unused experts, which the old rule called dead
        assert "dead" not in marks and "too few tokens to call an expert dead" in title
        assert bal["dead"].isna().all() and any("too few tokens to call an expert dead" in n
                                                for n in R.load_balance(u).attrs["notes"])
    else:
        assert "too few tokens" not in title and not R.load_balance(u).attrs.get("notes") and marks.get("dead")
    for layer, g in u.groupby(C.LAYER):
        mean = g[C.COUNT].mean()
        dead = {(layer, str(o)) for o, c in zip(g[C.OPTION], g[C.COUNT]) if c < 0.01 * mean}
        over = {(layer, str(o)) for o, c in zip(g[C.OPTION], g[C.COUNT]) if c > 2 * mean}
        assert {m for m in marks.get("overloaded", set()) if m[0] == layer} == over
        if enough:
            assert {m for m in marks.get("dead", set()) if m[0] == layer} == dead
            assert bal.loc[layer, "dead"] == len(dead)
    per_layer = u.groupby(C.LAYER, sort=False)[C.COUNT]
    assert list(bal["overloaded"]) == [sum(x > 2 * g.mean() for x in g) for _, g in per_layer]


def test_the_utilisation_offers_one_order_or_each_layer_busiest_first():
    """Buttons switch between one column order for every layer (by the share summed over layers,
    stated on the axis) and each layer sorted by its own load, ✕ and ▲ on the same cells in both."""
    u = _utilisation(100, layers=2, seed=1)
    fig = _drawn(u)
    one, own = [t for t in fig.data if t.type == "heatmap"]
    total = u.groupby(C.OPTION)[C.SHARE].sum()
    assert [total[int(o)] for o in one.x] == sorted(total, reverse=True) and one.visible is not False
    assert "summed over all layers" in fig.layout.xaxis.title.text and own.visible is False
    for i, layer in enumerate(one.y):
        g = u[u[C.LAYER] == layer]
        ranked = sorted(zip(g[C.SHARE], g[C.OPTION]), key=lambda p: (-p[0], p[1]))  # busiest first, ties by id
        assert [int(o) for o in own.customdata[i]] == [o for _, o in ranked]
        np.testing.assert_allclose(own.z[i], [round(v, 5) for v, _ in ranked])
        place = {o: r + 1 for r, (_, o) in enumerate(ranked)}
        assert [one.customdata[i][j] for j in range(len(one.x))] == [place[int(o)] for o in one.x]
    first, second = fig.layout.updatemenus[0].buttons
    assert "one order" in first.label and "each layer" in second.label
    for button, heat in ((first, one), (second, own)):
        visible, layout = button.args
        shown = [t for t, v in zip(fig.data, visible["visible"]) if v]
        assert shown[0] is heat and all(t.type == "scatter" for t in shown[1:])
        assert list(layout["xaxis.categoryarray"]) == list(heat.x)
        cells = {}
        for t in shown[1:]:  # a flag's cells as (layer, option), whichever order the axis has
            opts = t.x if heat is one else [str(o) for o in t.customdata]
            cells[t.name] = set(zip(t.y, opts))
        mean = u.groupby(C.LAYER)[C.COUNT].transform("mean")
        over = u[u[C.COUNT] > 2 * mean]
        assert cells["overloaded"] == set(zip(over[C.LAYER], over[C.OPTION].astype(str)))
        if heat is own:  # the per-layer axis: each flag at its option's rank
            for t in shown[1:]:
                for layer, x, o in zip(t.y, t.x, t.customdata):
                    assert own.customdata[list(own.y).index(layer)][int(x[1:]) - 1] == o


def _title_lines(fig) -> int:
    return fig.layout.title.text.count("<br>") + 1 + bool(fig.layout.title.subtitle.text)


@pytest.mark.parametrize("n_tokens", [33, 100])
def test_the_flags_legend_sits_between_title_and_plot(n_tokens):
    """The title hangs from the top of the figure; the legend stands on the plot's top edge; the top
    margin holds both: each title line (17 px font, about 22 px a line) and a one-row legend (about
    24 px) without overlap. Before, the title sat mid-margin where the legend reached up to it."""
    from routescope.rendering.corpus_figures import utilisation_figure
    from routescope.analysis.corpus import stats as S

    u = _utilisation(n_tokens)
    corpus = u.assign(**{S.SLOT_SHARE: u[C.SHARE] / 8, S.DEAD: u[C.COUNT] == 0, S.OVERLOADED: u[C.COUNT] > 20})
    for fig in (_drawn(u), utilisation_figure(corpus)):
        t, legend, m = fig.layout.title, fig.layout.legend, fig.layout.margin
        assert (t.yref, t.y, t.yanchor) == ("container", 1, "top")
        assert legend.orientation == "h" and legend.yanchor == "bottom" and legend.y >= 1
        assert legend.yref in (None, "paper") and fig.layout.showlegend  # even for a single flag: ▲ named
        assert m.t >= (t.pad.t or 0) + 22 * _title_lines(fig) + 24
