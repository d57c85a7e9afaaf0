"""Specs applied one by one (issue 41, item 6): a bad spec is left out with its reason in one line and
the good ones still apply; an unknown layer is named in one short line, its options as ranges, with a
few of the known layers and how many more."""
from __future__ import annotations

import pytest

from routescope.core_models.ablation import Ablation, applicable
from routescope.core_models.specs import AblationError

LAYERS = {f"model.layers.{i}.mlp.gate": 128 for i in range(48)}
FIRST = list(LAYERS)[0]


def test_a_bad_spec_leaves_the_good_ones_applied():
    ab, left_out = applicable(["*:0-3", "*:200"], layers=LAYERS)
    assert ab == Ablation.parse(["*:0-3"], layers=LAYERS)  # what the good spec alone gives
    assert ab.specs == ("*:0-3",)
    assert left_out == [("*:200", "option out of range 0..127")]
    with pytest.raises(AblationError):  # the strict path (the command line) still refuses the pair
        Ablation.parse(["*:0-3", "*:200"], layers=LAYERS).validate(LAYERS)


def test_each_spec_left_out_is_one_line_naming_it_and_why():
    specs = ["*:0-3", "*:200", "nolayer:0-15", "x:!", f"{FIRST}:5", "nomatch.*:1"]
    ab, left_out = applicable(specs, ["*:1", f"{FIRST}:7"], ["pgpt1-reference"], layers=LAYERS)
    want_applied = Ablation.parse(["*:0-3", f"{FIRST}:5"], [f"{FIRST}:7"], layers=LAYERS)
    assert ab == want_applied
    lines = dict(left_out)
    assert list(lines) == ["*:200", "nolayer:0-15", "x:!", "nomatch.*:1", "force *:1", "mode pgpt1-reference"]
    assert lines["x:!"] == "cannot read the options"
    assert lines["force *:1"] == "an option both forced and dropped"  # *:1 is dropped by *:0-3
    assert lines["mode pgpt1-reference"].startswith("not an ablation mode of this model")
    assert all("\n" not in why and len(f"{spec}: {why}") < 160 for spec, why in left_out), left_out


def test_later_specs_that_conflict_with_earlier_ones_are_left_out():
    layers = {"a": 4, "b": 4}
    ab, left_out = applicable(["a:0-1", "a:2-3", "b:0"], layers=layers)  # a:2-3 would drop every option of a
    assert ab == Ablation(drop=(("a", 0), ("a", 1), ("b", 0)))
    assert left_out == [("a:2-3", "every option of the layer dropped; at least one must remain")]
    ab, left_out = applicable(["a:0"], layers=layers, base=Ablation(drop=(("a", 1), ("a", 2), ("a", 3))))
    assert ab == Ablation(drop=(("a", 1), ("a", 2), ("a", 3))) and len(left_out) == 1  # the base is kept


def test_an_unknown_layer_is_one_short_line_with_a_few_known_layers():
    ab = Ablation.parse(["nolayer:0-15"], layers=LAYERS)
    with pytest.raises(AblationError) as e:
        ab.validate(LAYERS)
    msg = str(e.value)
    named = [l for l in LAYERS if l in msg]
    assert "nolayer:0-15" in msg and "nolayer:1," not in msg  # the range as written, not option by option
    assert 1 <= len(named) <= 3 and f"and {len(LAYERS) - len(named)} more" in msg
    assert "\n" not in msg and len(msg) < 200, msg
