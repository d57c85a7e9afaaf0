"""Issue 41, links that reopen a view: app/links.py's pure functions (URL <-> state, without Streamlit),
then the explorer under AppTest: a link sets the checkpoint, prompt, specs, view, layer and settings,
and paints the page the same settings give through the widgets; bad values get one line each and
the defaults; the URL follows the widgets."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from streamlit.testing.v1 import AppTest

from routescope.app import links as L
from routescope.app import state as K
from routescope.core_models.run_state import ROUTING_MODES

APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")
LAYERS = {"model.layers.0.mlp.gate": 4, "model.layers.1.mlp.gate": 4}
NAMES = {"pgpt", "moep"}


def no_prompts(_key: str) -> None:
    return None


def read(params: dict, prompts=no_prompts) -> tuple[L.LinkState, list[str]]:
    return L.from_params(params, checkpoints=NAMES, prompts=prompts)


# ----------------------------------------------------------------------------------------------- pure


@pytest.mark.parametrize("state", [
    L.LinkState(checkpoint="pgpt", prompt="Once upon a time", view="Routing", max_new=5, decoding="greedy", seed=3),
    L.LinkState(checkpoint="moep", prompt="a;b&c=d #e ünï 🧭", specs=("*:1", "force model.layers.0.mlp.gate:2",
                                                                    "model.layers.1.mlp.gate:!0", "mode pgpt-1"),
                view="Ablation diff", layer="model.layers.1.mlp.gate", max_new=0, decoding="sampling",
                temperature=0.35, top_k=7, top_p=0.9, seed=2**31 - 1, routing=ROUTING_MODES[-1],
                options=(("atm_tau", -0.25), ("other", 3.0))),
    L.LinkState(),
])
def test_state_survives_the_url(state):
    params = L.to_params(state)
    assert all(isinstance(v, str) for v in params.values())
    back, notices = read(params)
    assert notices == [] and back == state


def test_a_long_prompt_goes_by_its_digest_and_comes_back_from_the_store():
    long = "The quick brown fox. " * 30
    params = L.to_params(L.LinkState(prompt=long))
    assert "prompt" not in params
    assert params["prompt_sha"] == hashlib.sha256(long.encode()).hexdigest()[:16]
    store = L.PromptStore()
    assert store.put(long) == params["prompt_sha"]
    assert read(params, store.get) == (L.LinkState(prompt=long), [])
    # a server that never saw it (a fresh one): the default prompt, said in one line naming the parameter
    state, notices = read(params)
    assert state.prompt is None and len(notices) == 1 and "`prompt_sha`" in notices[0] and "\n" not in notices[0]
    short = "x" * L.PROMPT_INLINE
    assert L.to_params(L.LinkState(prompt=short)) == {"prompt": short}


def test_the_prompt_store_is_bounded_least_recently_used_first():
    store = L.PromptStore(max_entries=3, max_chars=10_000)
    keys = [store.put(f"prompt {i} " * 40) for i in range(3)]
    assert store.get(keys[0]) is not None  # used: the oldest is now keys[1]
    store.put("another " * 40)
    assert len(store) == 3 and store.get(keys[1]) is None and store.get(keys[0]) is not None
    by_chars = L.PromptStore(max_entries=100, max_chars=1000)
    for i in range(10):
        by_chars.put(str(i) * 400)
    assert len(by_chars) == 2  # 800 characters; a third would pass 1000


@pytest.mark.parametrize("name,value,field", [
    ("checkpoint", "no-such-model", "checkpoint"),
    ("seed", "abc", "seed"), ("seed", "-1", "seed"), ("seed", str(2**31), "seed"), ("seed", "1.5", "seed"),
    ("max_new", "65", "max_new"), ("max_new", "", "max_new"),
    ("temperature", "nan", "temperature"), ("temperature", "0", "temperature"), ("temperature", "inf", "temperature"),
    ("top_p", "1.5", "top_p"), ("top_k", "-3", "top_k"),
    ("decoding", "beam", "decoding"), ("routing", "random", "routing"),
])
def test_a_bad_value_gets_one_line_naming_it_and_the_default(name, value, field):
    good = {"checkpoint": "pgpt", "seed": "4", "max_new": "3", "decoding": "sampling", "temperature": "0.5",
            "top_p": "0.8", "top_k": "2", "routing": ROUTING_MODES[0]}
    state, notices = read({**good, name: value})
    assert getattr(state, field) is None
    assert len(notices) == 1 and f"`{name}`" in notices[0] and "\n" not in notices[0], notices
    others = read(good)[0]
    assert all(getattr(state, f) == getattr(others, f) for f in good if f != field)  # the rest still apply


def test_a_value_given_twice_counts_once_and_an_unknown_parameter_is_named():
    state, notices = read({"seed": ["1", "2"], "colour": "red", "embed": "true"})
    assert state.seed == 2
    assert notices == ["Link: `colour` is not a parameter this page reads; ignored."]


def test_run_options_travel_as_opt_and_the_model_checks_them():
    state, notices = read({"opt.atm_tau": "0.5", "opt.gone": "1", "opt.bad": "nan", "opt.worse": "x"})
    assert state.options == (("atm_tau", 0.5), ("gone", 1.0))
    assert [re.search(r"`([\w.]+)`", n)[1] for n in notices] == ["opt.bad", "opt.worse"]
    offered = {"atm_tau": (-1.0, 1.0)}
    got, notices = L.for_model(state, views=[], layers={}, options=offered)
    assert got.options == (("atm_tau", 0.5),) and len(notices) == 1 and "`opt.gone`" in notices[0]
    got, notices = L.for_model(L.LinkState(options=(("atm_tau", 1.5),)), views=[], layers={}, options=offered)
    assert got.options == () and len(notices) == 1 and "outside" in notices[0]


def test_specs_that_cannot_parse_are_left_out_the_others_kept():
    state, notices = read({"ablate": "*:1;*:7-2;force *:0-3;mode pgpt-1;;  drop *:2 "})
    assert state.specs == ("*:1", "mode pgpt-1", "*:2")
    assert len(notices) == 2 and all("`ablate`" in n and "\n" not in n for n in notices)
    assert "'*:7-2'" in notices[0] and "'force *:0-3'" in notices[1]


def test_the_model_decides_view_layer_and_what_specs_name():
    state = L.LinkState(view="Table 6", layer="model.layers.9.mlp.gate",
                        specs=("*:1", "model.layers.9.mlp.gate:0", "*:9", "model.layers.*.mlp.gate:top2",
                               "force model.layers.1.mlp.gate:3", "mode nope"))
    views = ["Generation", "Routing"]
    got, notices = L.for_model(state, views=views, layers=LAYERS, known_modes={}, top_k={})
    assert got.view is None and got.layer is None
    # kept: specs whose layers and options exist, and top N (ranked by the page, which has the counts)
    assert got.specs == ("*:1", "model.layers.*.mlp.gate:top2", "force model.layers.1.mlp.gate:3")
    named = [re.search(r"`(\w+)`", n)[1] for n in notices]
    assert named == ["view", "layer", "ablate", "ablate", "ablate"], notices
    assert all("\n" not in n for n in notices)
    fine = L.LinkState(view="Routing", layer="model.layers.1.mlp.gate", specs=("*:1",))
    assert L.for_model(fine, views=views, layers=LAYERS) == (fine, [])
    # a model whose controls show every layer at once has no layer to pick: said, and ignored
    got, notices = L.for_model(fine, views=views, layers=LAYERS, layer_picker=False)
    assert got == L.LinkState(view="Routing", specs=("*:1",)) and len(notices) == 1 and "`layer`" in notices[0]


# ------------------------------------------------------------------------------------------- AppTest


def opened(params: dict, timeout: float = 240) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.query_params.update(params)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def grid(at: AppTest) -> str:
    return next(m.value for m in at.markdown if 'class="rs-grid"' in m.value)


def caption(at: AppTest) -> str:
    return next(c.value for c in at.caption if c.value.startswith("Ablation:"))


def link_of(at: AppTest) -> str:
    """What "Copy link" offers (st.code in its popover)."""
    return next(c.value for c in at.code if c.value.startswith(("?", "http")))


def test_a_link_reopens_the_page_the_widgets_made():
    """Set a checkpoint, prompt, spec, view and seed with the widgets, read the link, open it in a new
    session: the same widgets' values, the same ablation, the same route grid."""
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    box = at.selectbox(key=K.CHECKPOINT)
    box.set_value(next(p for p in box.options if Path(p).name == "papaformer-gumbel-v1")).run()
    path = at.selectbox(key=K.CHECKPOINT).value
    at.text_area(key=K.PROMPT).set_value("The little dog ran to the park")
    at.button(key=K.GENERATE).click().run()
    at.slider(key=K.MAX_NEW).set_value(6).run()
    at.number_input(key=K.SEED).set_value(5).run()
    at.text_area(key=K.specs_key(path)).input("*:1").run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert at.segmented_control(key=K.VIEW).value == "Routing"
    url = link_of(at)
    params = {k: unquote(v) for k, v in re.findall(r"[?&]([^=&]+)=([^&]*)", url)}
    assert params == {k: _param(at, k) for k in at.query_params}  # the link is the URL the page wrote
    assert {k: params[k] for k in ("checkpoint", "prompt", "ablate", "view", "seed", "max_new")} == {
        "checkpoint": "papaformer-gumbel-v1", "prompt": "The little dog ran to the park", "ablate": "*:1", "view": "Routing",
        "seed": "5", "max_new": "6"}
    again = opened(params)
    assert not again.warning, [w.value for w in again.warning]
    assert again.selectbox(key=K.CHECKPOINT).value == path
    assert again.text_area(key=K.PROMPT).value == "The little dog ran to the park"
    assert again.number_input(key=K.SEED).value == 5 and again.slider(key=K.MAX_NEW).value == 6
    assert again.text_area(key=K.specs_key(path)).value == "*:1"
    assert caption(again).split(" · ")[0] == caption(at).split(" · ")[0] and "drop *:1" in caption(again)
    assert grid(again) == grid(at)
    assert link_of(again) == url


def test_bad_values_in_a_link_get_a_line_each_and_the_defaults():
    default = AppTest.from_file(APP, default_timeout=240)
    default.run()
    at = opened({"checkpoint": "gone-model", "seed": "abc", "max_new": "500", "view": "Nowhere",
                 "ablate": "*:1;*:zz;model.layers.99.x:0", "prompt_sha": "0123456789abcdef", "decoding": "beam"})
    lines = [w.value for w in at.warning]
    named = sorted(re.search(r"`(\w+)`", w)[1] for w in lines)
    assert named == sorted(["checkpoint", "seed", "max_new", "view", "ablate", "ablate", "prompt_sha", "decoding"])
    assert all("\n" not in w for w in lines)
    assert not at.error
    for key in (K.CHECKPOINT, K.SEED, K.MAX_NEW, K.PROMPT, K.DECODING, K.VIEW):
        assert at.session_state[key] == default.session_state[key], key
    path = at.selectbox(key=K.CHECKPOINT).value
    assert at.text_area(key=K.specs_key(path)).value == "*:1"  # the spec that applies is kept
    assert grid(at) != grid(default) and "*:1" in caption(at)
    # the URL now names what the page shows
    assert _param(at, "checkpoint") == Path(path).name and "seed" in at.query_params


def _param(at: AppTest, name: str) -> str | None:
    value = at.query_params.get(name)
    return value[-1] if isinstance(value, list) else value


def test_the_url_follows_the_widgets_and_a_long_prompt_goes_by_digest():
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    path = at.selectbox(key=K.CHECKPOINT).value
    assert _param(at, "checkpoint") == Path(path).name and _param(at, "view") == "Routing"
    at.number_input(key=K.SEED).set_value(9).run()
    assert _param(at, "seed") == "9"
    at.radio(key=K.DECODING).set_value("sampling").run()
    at.slider(key=K.TEMPERATURE).set_value(0.5).run()
    assert (_param(at, "decoding"), _param(at, "temperature")) == ("sampling", "0.5")
    at.text_area(key=K.specs_key(path)).input("*:0").run()  # the fragment's rerun writes it too
    assert _param(at, "ablate") == "*:0"
    at.segmented_control(key=K.VIEW).set_value("Generation").run()
    assert _param(at, "view") == "Generation"
    long = "Once upon a time, there was a little girl who liked to read. " * 5
    at.text_area(key=K.PROMPT).set_value(long)
    at.button(key=K.GENERATE).click().run()
    assert not at.exception
    assert _param(at, "prompt") is None
    assert _param(at, "prompt_sha") == hashlib.sha256(long.encode()).hexdigest()[:16]
    again = opened({k: _param(at, k) for k in at.query_params})  # this server kept the text
    assert not again.warning, [w.value for w in again.warning]
    assert again.text_area(key=K.PROMPT).value == long
    assert again.radio(key=K.DECODING).value == "sampling" and again.slider(key=K.TEMPERATURE).value == 0.5
    assert again.segmented_control(key=K.VIEW).value == "Generation"


def test_a_link_sets_a_familys_run_option():
    """Wiola's ATM threshold (a run option the sidebar offers): the link sets the slider and the run."""
    at = opened({"checkpoint": "wiola-tiny", "opt.atm_tau": "0.4", "max_new": "2"})
    assert not at.warning, [w.value for w in at.warning]
    assert at.slider(key=K.run_option_key("atm_tau")).value == 0.4
    assert _param(at, "opt.atm_tau") == "0.4"
    at.slider(key=K.run_option_key("atm_tau")).set_value(0.6).run()
    assert _param(at, "opt.atm_tau") == "0.6"


def test_a_link_picks_the_layer_of_a_many_expert_model(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from scale_models import scale_moe  # optional heavy dependency (transformers builds the model)

    big = str(scale_moe(tmp_path / "qwen3-128x2", experts=128, layers=2))
    monkeypatch.setenv("ROUTESCOPE_CHECKPOINTS", str(tmp_path))
    layer = "model.layers.1.mlp.gate"
    at = opened({"checkpoint": "qwen3-128x2", "layer": layer, "ablate": f"{layer}:0-3", "max_new": "2"})
    assert not at.warning, [w.value for w in at.warning]
    assert at.selectbox(key=K.CHECKPOINT).value == big
    assert at.selectbox(key=K.layer_pick_key(big)).value == layer
    assert f"drop {layer}:0-3" in caption(at)
    assert _param(at, "layer") == layer
