"""A routed family defined in this file only, registered through a `routescope.families.FamilySpec` and nothing
else, goes through the analysis (views), the export (`routescope export`, CSV) and the app's
Routing view: the project learns about its routing from the `RoutingLayer` marker alone. Then the
family's spec adds a view of its own (its analysis and the drawer of that view, both defined in
this file) and the app draws it.

The toy model: embeddings, L "lane" layers x + sum_j w_j lane_j(x) with w = softmax(gate(x)) over n
lanes (dropped lanes masked out, a forced lane weighted 1), an untied head. Each layer records its
option weights at `<layer>.option_weights`, the site generic analyses read."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from routescope.analysis.export import columns as C
from routescope.analysis.runs import views as A
from routescope.analysis.export.table_files import read_csv
from routescope.analysis.runs.session import RunSettings, run_prompt
from conftest import VOCAB
from routescope import families as rs_families
from routescope.core_models import build_model
from routescope.families import FamilySpec
from routescope.core_models.ablation import Ablation
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.checkpoint import save_checkpoint
from routescope.core_models.config import BaseConfig
from routescope.core_models.sites import OPTION_WEIGHTS, RoutingLayer, Site
from tolerances import FORWARD_EPS, assert_close_to_scale

PROMPT = "Once upon a time, there was a little girl"


@dataclass(frozen=True)
class ToyConfig(BaseConfig):
    family = "toy"
    vocab_size: int = VOCAB
    d_model: int = 16
    n_layers: int = 2
    n_lanes: int = 3
    context: int = 64

    def validate(self) -> None:
        self.positive("vocab_size", "d_model", "n_layers", "n_lanes", "context")


class LaneLayer(RoutingLayer):
    option_noun = "lane"
    can_force = True

    def __init__(self, d: int, n: int) -> None:
        super().__init__()
        self.n_options = n
        self.gate = nn.Linear(d, n)
        self.lanes = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        self.option_weights = Site("[batch, pos, n_options] softmax weight of each lane (0 where dropped)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)  # (B, T, n)
        dropped, forced = self.dropped(), self.forced()
        if forced is not None:
            w = torch.nn.functional.one_hot(torch.full(x.shape[:2], forced), self.n_options).to(x.dtype)
        else:
            mask = torch.tensor([j in dropped for j in range(self.n_options)])
            w = torch.softmax(logits.masked_fill(mask, float("-inf")), dim=-1)
        w = self.option_weights(w)
        return x + sum(w[..., j:j + 1] * lane(x) for j, lane in enumerate(self.lanes) if w[..., j].any())


class Toy(RouteScopeLM):
    def __init__(self, c: ToyConfig) -> None:
        super().__init__()
        self.config, self.context, self.vocab_size = c, c.context, c.vocab_size
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(LaneLayer(c.d_model, c.n_lanes) for _ in range(c.n_layers))
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self._finalize()

    def _forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def toy_param_count(c: ToyConfig) -> int:
    d, n = c.d_model, c.n_lanes
    return 2 * c.vocab_size * d + c.n_layers * (d * n + n + n * (d * d + d))


@pytest.fixture(scope="module")
def toy_family():
    rs_families.register(FamilySpec("toy", ToyConfig, Toy, toy_param_count))
    yield
    rs_families.unregister("toy")


# --- a view of the toy family's own: the entropy of each layer's lane weights per token ------------

ENTROPY = "entropy"


def toy_views(trace, model, **kw):
    """The generic views, plus `lane_entropy`: per layer and token, H(w) in nats of its lane weights."""
    base = A.GENERIC.views(trace, model, **kw)
    w = base["options"].frame
    keys = [C.BATCH, C.POSITION, C.LAYER]
    p = w[C.WEIGHT].to_numpy(dtype=float)
    ent = w.assign(h=np.where(p > 0, -p * np.log(np.where(p > 0, p, 1.0)), 0.0)).groupby(keys, sort=False)["h"].sum()
    return {**base, "lane_entropy": A.View(ent.rename(ENTROPY).reset_index(), A.FAMILY)}


def draw_entropy(name, view, ctx):
    from routescope.rendering import route_heatmaps as RH

    v = view.frame[view.frame[C.BATCH] == 0]
    layers = sorted(set(v[C.LAYER]))
    z = np.full((len(layers), len(ctx.tokens)), np.nan)
    z[v[C.LAYER].map(layers.index).to_numpy(), v[C.POSITION].to_numpy()] = v[ENTROPY].to_numpy()
    hover = np.full(z.shape, "", dtype=object)
    return {name: RH.value_heatmap(z, hover, layers, ctx.tokens, "Lane entropy per token (nats)", ctx.n_prompt)}


@pytest.fixture
def toy_view(toy_family, monkeypatch):
    """The toy family's own view and its drawer, registered for one test (AppTest runs the app in
    this process, so it sees them)."""
    analysis = A.FamilyAnalysis(views=toy_views, export=A.GENERIC.export)
    rs_families.register(FamilySpec("toy", ToyConfig, Toy, toy_param_count, analysis,
                                    drawers={"lane_entropy": draw_entropy}))
    yield
    rs_families.register(FamilySpec("toy", ToyConfig, Toy, toy_param_count))


@pytest.fixture(scope="module")
def toy(toy_family, tokenizer, tmp_path_factory):
    torch.manual_seed(0)
    model = build_model(ToyConfig()).eval()
    path = save_checkpoint(model, tmp_path_factory.mktemp("toy") / "toy-lanes", tokenizer=tokenizer,
                           dtype=torch.float32)
    return model, tokenizer, path


def lane_weights(model: Toy, ids: list[int], ablation: Ablation = Ablation()) -> list[np.ndarray]:
    """The weights recomputed in float64 from the parameters by the toy's formula, layer by layer:
    (T, n) per layer."""
    p = {k: v.double() for k, v in model.state_dict().items()}
    x = p["embed.weight"][torch.tensor(ids)]  # (T, d)
    out = []
    for i in range(model.config.n_layers):
        name = f"layers.{i}"
        logits = x @ p[f"{name}.gate.weight"].T + p[f"{name}.gate.bias"]
        for layer, o in ablation.drop:
            if layer in ("*", name):
                logits[:, o] = float("-inf")
        w = torch.softmax(logits, dim=-1)
        out.append(w.numpy())
        x = x + sum(w[:, j:j + 1] * (x @ p[f"{name}.lanes.{j}.weight"].T + p[f"{name}.lanes.{j}.bias"])
                    for j in range(model.config.n_lanes))
    return out


def test_the_model_knows_its_routing_layers(toy):
    model, _, _ = toy
    assert model.routing_layers() == {"layers.0": 3, "layers.1": 3}  # names are the module paths
    assert model.option_labels()["layers.1"] == ["lane 0", "lane 1", "lane 2"]
    assert model.config.label == "toy"


def test_analysis_views_hold_the_recomputed_weights(toy):
    model, tok, _ = toy
    ab = Ablation(drop=(("layers.0", 1),))
    run = run_prompt(model, tok, PROMPT, settings=RunSettings(max_new_tokens=0), ablation=ab)
    v = run.views["options"].frame
    assert set(run.views) == {"options"} and run.views["options"].drawer == "option_weights"
    want = lane_weights(model, run.ids, ab)
    for i, w in enumerate(want):
        got = v[v[C.LAYER] == f"layers.{i}"].sort_values([C.POSITION, C.OPTION])
        assert_close_to_scale(got[C.WEIGHT].to_numpy(), w.ravel(), FORWARD_EPS)
        assert got[C.SELECTED].to_numpy().reshape(w.shape).argmax(1).tolist() == w.argmax(1).tolist()
        assert got[C.LABEL].tolist() == [f"lane {j}" for j in range(3)] * len(run.ids)
    assert (v[(v[C.LAYER] == "layers.0") & (v[C.OPTION] == 1)][C.WEIGHT] == 0).all()  # dropped


def test_export_writes_the_weights(toy, tmp_path):
    from routescope.cli.main import main

    model, tok, path = toy
    out = tmp_path / "toy.csv"
    assert main(["export", str(path), "--prompt", PROMPT, "--out", str(out), "--quiet"]) == 0
    df = read_csv(out)
    ids = tok.encode(PROMPT).ids
    assert set(df[C.FAMILY]) == {"toy"} and set(df[C.KIND]) == {"weight"}
    assert len(df) == len(ids) * 2 * 3
    for i, w in enumerate(lane_weights(model, ids)):
        rows = df[df[C.LAYER] == f"layers.{i}"].sort_values([C.POSITION, C.OPTION])
        assert set(rows[C.SITE]) == {f"layers.{i}.{OPTION_WEIGHTS}"}
        assert_close_to_scale(rows[C.VALUE].to_numpy(dtype=float), w.ravel(), FORWARD_EPS)
        assert rows[C.SELECTED].to_numpy(dtype=bool).reshape(w.shape).argmax(1).tolist() == w.argmax(1).tolist()


def test_the_app_draws_its_routing_and_offers_its_ablations(toy, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from routescope.app import state as K

    _, _, path = toy
    monkeypatch.setenv("ROUTESCOPE_CHECKPOINTS", str(Path(path).parent))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app" / "main.py"), default_timeout=120)
    at.run()
    at.selectbox(key=K.CHECKPOINT).set_value(str(path)).run()
    at.segmented_control(key=K.VIEW).set_value("Routing").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert at.checkbox(key=K.drop_global_key(str(path), 2)).label == "Drop lane 2"
    assert at.selectbox(key=K.force_key(str(path), "layers.1")).format_func(1) == "lane 1"
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    titles = [f["layout"]["title"]["text"] for f in figs]
    assert any(t.startswith("Option with the largest weight") for t in titles), titles
    assert any(t.startswith("layers.1: weight of each option") for t in titles)
    choice = next(f for f in figs if f["layout"]["title"]["text"].startswith("Option with the largest"))
    assert choice["data"][0]["colorbar"]["ticktext"] == ["lane 0", "lane 1", "lane 2"]
    assert choice["data"][0]["y"] == ["layers.0", "layers.1"]


def test_a_view_of_its_own_is_computed_and_drawn_by_the_app(toy, toy_view, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from routescope.app import state as K

    model, tok, path = toy
    run = run_prompt(model, tok, PROMPT, settings=RunSettings(max_new_tokens=0))
    assert list(run.views) == ["options", "lane_entropy"]
    ent = run.views["lane_entropy"].frame
    for i, w in enumerate(lane_weights(model, run.ids)):  # H(w) by a plain loop over tokens and lanes
        want = [-sum(p * math.log(p) for p in row if p > 0) for row in w]
        got = ent[ent[C.LAYER] == f"layers.{i}"].sort_values(C.POSITION)[ENTROPY].to_numpy()
        assert_close_to_scale(got, np.array(want), FORWARD_EPS)

    import streamlit as st

    st.cache_resource.clear()  # runs cached by the test above were analysed before the view existed
    monkeypatch.setenv("ROUTESCOPE_CHECKPOINTS", str(Path(path).parent))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app" / "main.py"), default_timeout=120)
    at.run()
    at.selectbox(key=K.CHECKPOINT).set_value(str(path)).run()
    at.segmented_control(key=K.VIEW).set_value("Routing").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    figs = {f["layout"]["title"]["text"]: f for f in (json.loads(c.proto.spec) for c in at.get("plotly_chart"))}
    drawn = figs["Lane entropy per token (nats)"]
    assert drawn["data"][0]["y"] == ["layers.0", "layers.1"]
    assert any(t.startswith("Option with the largest weight") for t in figs)  # the generic views stay
