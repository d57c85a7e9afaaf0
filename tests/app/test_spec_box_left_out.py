"""The Specs box applies each spec that can apply and leaves out the others, one line each saying why
(issue 41, item 6); a top-k layer left fewer options than it picks is refused in one line (item 7).
On the shipped olmoe-tiny (16 experts, top-4, in 4 layers) and mixtral-tiny (4 experts, top-2)."""
from __future__ import annotations

import json
from pathlib import Path

from app_driver import fresh, pick

from routescope.app import state as K
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint

CK = Path(__file__).resolve().parents[2] / "checkpoints"


def caption(at) -> str:
    return next(c.value for c in at.caption if c.value.startswith("Ablation:"))


def scope(at) -> str:
    """The checkpoint's path as the app knows it (the ablation widgets' keys carry it)."""
    return at.selectbox(key=K.CHECKPOINT).value


def specs(at, text: str):
    at.text_area(key=K.specs_key(scope(at))).input(text).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_a_bad_spec_is_left_out_and_the_good_ones_apply():
    cfg = json.loads((CK / "olmoe-tiny" / "config.json").read_text())
    n, layers = cfg["num_experts"], cfg["num_hidden_layers"]
    at = specs(pick(fresh(), "olmoe-tiny"), f"*:0-3\n*:{n + 184}\nnolayer:0-15")
    model, _ = load_checkpoint(CK / "olmoe-tiny")
    want = Ablation.parse(["*:0-3"], layers=model.routing_layers())
    assert f"`{want.describe()}`" in caption(at)  # *:0-3 ran
    assert not at.error
    left = [w.value for w in at.warning]
    assert left[0] == f"Left out `*:{n + 184}`: option out of range 0..{n - 1}"
    assert left[1].startswith("Left out `nolayer:0-15`: no routing layer 'nolayer' (layers: ")
    assert left[1].endswith(f"and {layers - 3} more)")  # a few known layers, then how many more
    assert len(left) == 2 and all("\n" not in w for w in left)


def test_dropping_below_top_k_is_refused_in_one_line_and_a_spec_that_would_is_left_out():
    at = pick(fresh(), "mixtral-tiny")
    path = scope(at)
    for j in (1, 2):  # two of four left: top-2 still picks live experts
        at.checkbox(key=K.drop_global_key(path, j)).check().run()
    assert not at.error and "`drop *:1,2`" in caption(at)
    specs(at, "*:3")  # would leave one: left out, the boxes still apply
    assert [w.value for w in at.warning] == [
        "Left out `*:3`: fewer options left than the router picks per token (top-2); drop at most 2 or force one"]
    assert "`drop *:1,2`" in caption(at) and not at.error
    specs(at, "")
    at.checkbox(key=K.drop_global_key(path, 3)).check().run()  # the boxes themselves: the run is refused
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert errors[0].startswith("Cannot run this ablation: invalid ablation: fewer options left than the router "
                                "picks per token (top-2)")
    at.segmented_control(key=K.VIEW).set_value("Corpus").run()  # no dataset routed under it either
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("Not routed: invalid ablation: fewer options left"), errors
    assert not at.get("progress") and not at.dataframe
