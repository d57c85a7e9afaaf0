"""Issue 27 with Streamlit's AppTest: the ablation controls of a 128-expert MoE (no checkbox per
expert; a spec box, searchable lists, one layer's controls at a time); the Corpus view under the
ablation at the left, equal to the corpus statistics run directly under it; and the Corpus view's
inputs (uploaded dataset, intended options, comparison, settings) kept across view switches."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus import shipped as SH
from routescope.analysis.corpus.page import SECTIONS
from routescope.analysis.corpus.run import CorpusSettings, run_corpus
from routescope.analysis.runs.usage import run_usage
from routescope.app import state as K
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_corpus_view import APP, CK, TSV, downloads, table, until_done, upload  # noqa: E402,F401,F811

pytest.importorskip("transformers")
from scale_models import scale_moe  # noqa: E402


ACCURACY = SECTIONS["accuracy"][0]


def fresh() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    return at


def pick(at: AppTest, path: str) -> AppTest:
    at.selectbox(key=K.CHECKPOINT).set_value(path).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def caption(at: AppTest) -> str:
    return next(c.value for c in at.caption if c.value.startswith("Ablation:"))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """128 experts, top-8, in 2 layers (the controls are per layer: 2 show what 48 would)."""
    root = tmp_path_factory.mktemp("scale")
    return str(scale_moe(root / "qwen3-128x2", experts=128, layers=2))


def test_128_experts_get_a_spec_box_and_searchable_lists_not_a_checkbox_each(big, monkeypatch):
    monkeypatch.setenv("ROUTESCOPE_CHECKPOINTS", str(Path(big).parent))
    at = pick(fresh(), big)
    at.slider(key=K.MAX_NEW).set_value(2).run()
    assert not [c for c in at.checkbox if K.is_ablation_key(c.key or "")]  # no Drop box per expert
    ablation_widgets = [w for kind in ("text_area", "multiselect", "selectbox", "checkbox")
                        for w in at.get(kind) if K.is_ablation_key(getattr(w, "key", None) or "")]
    assert len(ablation_widgets) <= 6, [w.key for w in ablation_widgets]  # spec box, everywhere, layer, drop, force
    everywhere = at.multiselect(key=K.drop_everywhere_key(big))
    assert len(everywhere.options) == 128
    # specs: ranges and a force; the caption names what ran
    at.text_area(key=K.specs_key(big)).input("*:0-3\nforce model.layers.1.mlp.gate:5").run()
    assert not at.error, [e.value for e in at.error]
    assert "drop *:0-3, force model.layers.1.mlp.gate:5" in caption(at)
    # top N: the 2 experts the unablated model picks most for this prompt, per layer
    at.text_area(key=K.specs_key(big)).input("*:top2").run()
    model, tok = load_checkpoint(big)
    counts = run_usage(model, [tok.encode(at.text_area(key=K.PROMPT).value).ids])
    want = Ablation(drop=tuple((l, o) for l, c in counts.items() for o in sorted(range(128), key=lambda o: (-c[o], o))[:2]))
    assert f"`{want.describe()}`" in caption(at)
    # a bad spec: left out in one line, its reason after it; the other controls still apply
    at.text_area(key=K.specs_key(big)).input("*:7-2").run()
    assert not at.error and [w.value for w in at.warning] == ["Left out `*:7-2`: range 7-2 runs backwards"]
    at.text_area(key=K.specs_key(big)).input("").run()
    # one layer's controls at a time; each layer keeps its choices while another is shown
    at.selectbox(key=K.layer_pick_key(big)).set_value("model.layers.1.mlp.gate").run()
    at.multiselect(key=K.drop_key(big, "model.layers.1.mlp.gate")).set_value([7, 100]).run()
    at.selectbox(key=K.layer_pick_key(big)).set_value("model.layers.0.mlp.gate").run()
    at.multiselect(key=K.drop_key(big, "model.layers.0.mlp.gate")).set_value([3]).run()
    assert "drop model.layers.0.mlp.gate:3, drop model.layers.1.mlp.gate:7,100" in caption(at)
    at.selectbox(key=K.layer_pick_key(big)).set_value("model.layers.1.mlp.gate").run()
    assert at.multiselect(key=K.drop_key(big, "model.layers.1.mlp.gate")).value == [7, 100]
    assert not at.exception and not at.error


def test_the_corpus_view_runs_under_the_ablation_at_the_left():
    path = str(CK / "mixtral-tiny")
    at = pick(fresh(), path)
    at.checkbox(key=K.drop_global_key(path, 1)).check().run()
    at.segmented_control(key=K.VIEW).set_value("Corpus").run()
    until_done(at)
    assert not at.error, [e.value for e in at.error]
    assert any("Routed under the ablation at the left: `drop *:1`" in i.value for i in at.info)
    util = table(at, "utilisation_table")
    assert (util[util["option"] == 1]["tokens"] == 0).all() and not util[util["option"] == 1]["overloaded"].any()
    # the same statistics run directly under the same ablation
    model, tok = load_checkpoint(path)
    want = run_corpus(model, tok, SH.shipped(at.selectbox(key=K.CORPUS_SHIPPED).value), name="mixtral-tiny",
                      settings=CorpusSettings(max_tokens=at.number_input(key=K.CORPUS_MAX_TOKENS).value),
                      ablation=Ablation.parse(["*:1"])).tables()
    pd.testing.assert_frame_equal(util.reset_index(drop=True), want["utilisation"], check_dtype=False, check_like=True)
    summary = table(at, "summary").set_index("metric")["value"]
    assert summary["ablation"] == "drop *:1" and len(summary["weights_sha256"]) == 64
    # unablated, the dropped expert carries tokens again
    at.checkbox(key=K.drop_global_key(path, 1)).uncheck().run()
    until_done(at)
    util = table(at, "utilisation_table")
    assert util[util["option"] == 1]["tokens"].sum() > 0
    assert table(at, "summary").set_index("metric")["value"]["ablation"] == "none"


def test_corpus_inputs_survive_view_switches(downloads):  # noqa: F811
    at = fresh()
    at.segmented_control(key=K.VIEW).set_value("Corpus").run()
    upload(at, "probes.tsv", TSV)
    at.text_input(key=K.CORPUS_INTENDED).input("topic:story=0,math=1").run()
    at.selectbox(key=K.CORPUS_COMPARE).set_value(str(CK / "papaformer-gumbel-v1")).run()
    at.number_input(key=K.CORPUS_MIN_COUNT).set_value(1).run()
    until_done(at)
    for view in ("Routing", "Ablation diff", "Corpus"):
        at.segmented_control(key=K.VIEW).set_value(view).run()
    until_done(at)
    assert at.radio(key=K.CORPUS_SOURCE).value == "Upload a file"
    assert at.text_input(key=K.CORPUS_INTENDED).value == "topic:story=0,math=1"
    assert at.selectbox(key=K.CORPUS_COMPARE).value == str(CK / "papaformer-gumbel-v1")
    assert at.number_input(key=K.CORPUS_MIN_COUNT).value == 1
    assert any("Routing **probes.tsv**, uploaded earlier" in c.value for c in at.caption)
    shares = table(at, "label_shares_table")
    assert set(shares["label_value"]) == {"story", "math", '=HYPERLINK("x")'}  # the upload, not the shipped probes
    assert ACCURACY in [s.value for s in at.subheader]  # the intended options kept apply
    names = [n for n, _ in downloads.values() if n]
    assert names and all("probes" in n for n in names if n.endswith((".csv", ".parquet", ".html", ".json")))
    assert any(n.startswith("papaformer-gumbel-v2_vs_papaformer-gumbel-v1_probes_compare_") for n in names)
    assert not at.exception and not at.error, [e.value for e in at.error]


def _matrix(at: AppTest) -> dict:
    """The Routing view's expert matrix as the browser gets it (its plotly JSON)."""
    import json

    return next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if json.loads(c.proto.spec)["layout"]["title"]["text"].startswith("Top-k routing"))


def _array(v):
    """A plotly JSON array: a list, or a typed array ({dtype, bdata (base64), shape})."""
    import base64

    import numpy as np

    if isinstance(v, dict):
        shape = [int(n) for n in str(v.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).astype(float).reshape(shape)
    return np.array(v, dtype=float)


def test_the_routing_view_sends_one_layer_of_the_expert_matrix(big, monkeypatch):
    """At many options the matrix goes to the browser a layer at a time, the layer of a picker that
    follows the ablation controls' layer both ways; its panel is the run's router probabilities."""
    import numpy as np

    from routescope.analysis.runs.session import RunSettings, run_prompt

    monkeypatch.setenv("ROUTESCOPE_CHECKPOINTS", str(Path(big).parent))
    at = pick(fresh(), big)
    at.slider(key=K.MAX_NEW).set_value(2).run()
    at.segmented_control(key=K.VIEW).set_value("Routing").run()
    layers = ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    picker = at.selectbox(key=K.view_layer_key(big))
    assert list(picker.options) == [f"{i} · {l}" for i, l in enumerate(layers)] and picker.value == layers[0]
    model, tok = load_checkpoint(big)
    run = run_prompt(model, tok, at.text_area(key=K.PROMPT).value, settings=RunSettings(max_new_tokens=2))
    probs = run.views["topk_probs"].frame
    for layer in (layers[1], layers[0]):
        at.selectbox(key=K.view_layer_key(big)).set_value(layer).run()
        assert at.selectbox(key=K.layer_pick_key(big)).value == layer  # the ablation controls follow
        fig = _matrix(at)
        heat = [t for t in fig["data"] if t["type"] == "heatmap"]
        assert len(heat) == 1 and layer in fig["layout"]["title"]["text"] and not fig["layout"].get("updatemenus")
        p = probs[(probs["batch"] == 0) & (probs["layer"] == layer)]
        z = np.full((128, len(run.display_tokens())), np.nan)
        z[p["option"], p["position"]] = p["prob"]
        got = _array(heat[0]["z"])
        np.testing.assert_allclose(got, z, rtol=0, atol=5e-5)  # rounded to 4 decimals for the page
    at.selectbox(key=K.layer_pick_key(big)).set_value(layers[1]).run()  # and the other way round
    assert at.selectbox(key=K.view_layer_key(big)).value == layers[1] and layers[1] in _matrix(at)["layout"]["title"]["text"]
    assert not at.exception and not at.error
