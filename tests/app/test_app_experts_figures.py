"""The Experts view's figures as pure functions of a sweep's tables (`rendering.importance_figures`), on
tables made here: whiskers equal each expert's interval, the house diverging scale's sign (blue: the
loss rises when the expert is dropped, red: it falls), the sorted axis names the experts in the
order computed here, the estimate scatter carries each layer's Spearman, the held-out pruning
curve by default with the in-sample one only when asked for and labelled, and the offline page
holds every figure and the notes. Older tables (no estimate, no `evaluated_on`) still draw."""
from __future__ import annotations

import html
import re

import numpy as np
import pandas as pd
import pytest

from routescope.rendering import importance_figures as F
from routescope.rendering.importance_report import captions, figures, page, unplaced

LAYERS = ("model.layers.0.mlp.gate", "model.layers.1.mlp.gate")


def tables(n: int = 6, seed: int = 0, estimate: bool = True, exact_every: int = 1) -> dict[str, pd.DataFrame]:
    """A sweep's tables over LAYERS x n experts, effects of both signs; with `exact_every` k, only every
    k-th expert measured exactly (the others estimate-only, as method "both" leaves them)."""
    rng = np.random.default_rng(seed)
    rows = []
    for l in LAYERS:
        for o in range(n):
            d = float(rng.normal(0, 0.05))
            w = float(rng.uniform(0.001, 0.02))
            exact = o % exact_every == 0
            rows.append({"layer": l, "option": o, "label": f"expert {o}", "delta_nll": d if exact else np.nan,
                         "delta_nll_low": d - w if exact else np.nan, "delta_nll_high": d + 2 * w if exact else np.nan,
                         "kl": abs(d), "flip_rate": 0.1, "usage": 1 / n,
                         **({"delta_nll_estimate": d + float(rng.normal(0, 0.01)),
                             "method": "exact" if exact else "estimate"} if estimate else {})})
    imp = pd.DataFrame(rows)
    csum = pd.DataFrame({"kind": "control", "layer": list(LAYERS), "draws": 4, "control_mean": 0.0,
                         "control_low": -0.01, "control_high": 0.01})
    prox = imp[["layer", "option", "label", "delta_nll"]].assign(usage=1 / n, gate_usage=1 / n, reap=1.0)
    agree = pd.DataFrame([{"layer": l, "proxy": p, "spearman": 0.3, "options": n} for l in LAYERS
                          for p in ("usage", "gate_usage", "reap")])
    out = {"importance": imp, "control_summary": csum, "proxies": prox, "proxy_agreement": agree}
    if estimate:
        out["estimate_agreement"] = pd.DataFrame({"layer": list(LAYERS), "options_measured": n,
                                                  "spearman": [0.9, 0.2], "top10_recall": [1.0, 0.5]})
    return out


def curve_tables(t: dict, evaluated_on: bool = True, merge: bool = True) -> dict:
    rows = []
    for part, base in (("heldout", 3.0), ("in-sample", 2.9)):
        for ranking in ("causal", "usage", "random"):
            for n in range(3):
                rows.append({"ranking": ranking, "n_pruned": n, "loss": base + 0.1 * n, "loss_low": base,
                             "loss_high": base + 0.2 * n, "draws": 4 if ranking == "random" else 1,
                             "delta_loss": 0.1 * n, "evaluated_on": part, "rows": 10})
    curve = pd.DataFrame(rows)
    if not evaluated_on:
        curve = curve[curve["evaluated_on"] == "in-sample"].drop(columns=["evaluated_on", "rows"])
    out = {**t, "pruning_curve": curve}
    if merge:
        out["merge_curve"] = pd.DataFrame([{"strategy": s, "n_removed": n, "loss": 3.0 + 0.05 * n * (1 + (s == "merge")),
                                            "delta_loss": 0.0, "merged": ""} for s in ("prune", "merge")
                                           for n in range(3)])
    return out


def rgb(colour: str) -> tuple[float, float, float]:
    r, g, b = (float(v) for v in re.findall(r"[\d.]+", colour)[:3])
    return r, g, b


def scale_colour(scale, t: float) -> tuple[float, float, float]:
    """A plotly colorscale's colour at t in [0, 1], linearly between its stops (computed here)."""
    pos = [float(p) for p, _ in scale]
    cols = [rgb(c) for _, c in scale]
    return tuple(float(np.interp(t, pos, [c[k] for c in cols])) for k in range(3))


def layer_axes(fig) -> list[dict]:
    """Per layer (the dropdown's order): the x ticks the layer is drawn with, and its traces."""
    menu = fig.layout.updatemenus
    if not menu:
        return [{"ticktext": list(fig.layout.xaxis.ticktext), "traces": list(fig.data)}]
    out = []
    for j, b in enumerate(menu[0].buttons):
        visible = b.args[0]["visible"]
        out.append({"ticktext": list(b.args[1]["xaxis.ticktext"]),
                    "traces": [tr for tr, v in zip(fig.data, visible) if v]})
    return out


def points(fig, ticks: list[str], traces) -> dict[str, dict]:
    """Expert id (the tick at each dot's x) -> its y and whiskers, from the drawn traces."""
    out = {}
    for tr in traces:
        if tr.mode != "markers":
            continue
        ey = tr.error_y
        for i, (x, y) in enumerate(zip(tr.x, tr.y)):
            out[ticks[int(x)]] = {"y": y, "plus": ey.array[i] if ey.array is not None else None,
                                  "minus": ey.arrayminus[i] if ey.arrayminus is not None else None,
                                  "colour": tr.marker.color[i], "exact": tr.error_y.array is not None}
    return out


@pytest.mark.parametrize("sort", [False, True])
def test_whiskers_are_the_tables_interval(sort):
    t = tables()
    fig = F.effects(t, sort=sort)
    imp = t["importance"]
    for layer, drawn in zip(LAYERS, layer_axes(fig)):
        got = points(fig, drawn["ticktext"], drawn["traces"])
        g = imp[imp["layer"] == layer]
        assert sorted(got) == sorted(str(o) for o in g["option"])
        for r in g.itertuples():
            p = got[str(r.option)]
            assert p["y"] == pytest.approx(r.delta_nll, abs=0)
            assert p["y"] + p["plus"] == pytest.approx(r.delta_nll_high, rel=1e-12)
            assert p["y"] - p["minus"] == pytest.approx(r.delta_nll_low, rel=1e-12)


def test_sorted_axis_names_the_experts_in_sorted_order():
    t = tables(n=12, seed=3)
    imp = t["importance"]
    for layer, drawn in zip(LAYERS, layer_axes(F.effects(t, sort=True))):
        g = imp[imp["layer"] == layer]
        by_effect = sorted(zip(g["delta_nll"], g["option"]), key=lambda p: (-p[0], p[1]))
        assert drawn["ticktext"] == [str(o) for _, o in by_effect]
        got = points(None, drawn["ticktext"], drawn["traces"])
        ys = [got[tick]["y"] for tick in drawn["ticktext"]]
        assert ys == sorted(ys, reverse=True)  # and the dot above each id is that expert's
    unsorted = layer_axes(F.effects(t, sort=False))
    assert all(d["ticktext"] == [str(o) for o in range(12)] for d in unsorted)


def test_blue_where_the_loss_rises_red_where_it_falls():
    t = tables(n=2)
    imp = t["importance"]
    imp.loc[:, "delta_nll"] = [0.03, -0.02, 0.01, -0.04]
    imp["delta_nll_low"], imp["delta_nll_high"] = imp["delta_nll"] - 0.001, imp["delta_nll"] + 0.001
    # the heatmap: the colour its scale gives each cell (computed here from the scale's stops)
    hm = F.heatmap(t).data[0]
    assert hm.zmid == 0 and hm.zmin == -hm.zmax
    for v in imp["delta_nll"]:
        r, _, b = scale_colour(hm.colorscale, (v - hm.zmin) / (hm.zmax - hm.zmin))
        assert (b > r) == (v > 0), (v, r, b)
    # the effects chart: each dot's own colour
    for layer, drawn in zip(LAYERS, layer_axes(F.effects(t))):
        got = points(None, drawn["ticktext"], drawn["traces"])
        for r_ in imp[imp["layer"] == layer].itertuples():
            r, _, b = rgb(got[str(r_.option)]["colour"])
            assert (b > r) == (r_.delta_nll > 0)


def test_estimate_only_experts_are_drawn_apart_without_whiskers():
    t = tables(n=8, exact_every=3)
    imp = t["importance"]
    for layer, drawn in zip(LAYERS, layer_axes(F.effects(t, sort=True))):
        got = points(None, drawn["ticktext"], drawn["traces"])
        g = imp[imp["layer"] == layer]
        for r in g.itertuples():
            p = got[str(r.option)]
            if np.isnan(r.delta_nll):
                assert not p["exact"] and p["y"] == r.delta_nll_estimate
            else:
                assert p["exact"] and p["y"] == r.delta_nll
        want = sorted(zip(g["delta_nll"].fillna(g["delta_nll_estimate"]), g["option"]), key=lambda p: (-p[0], p[1]))
        assert drawn["ticktext"] == [str(o) for _, o in want]
    lines = captions(t)["heatmap"]
    n_est = int(imp["delta_nll"].isna().sum())
    assert any(f"{n_est:,} of {len(imp):,} experts" in s for s in lines)


def test_estimate_scatter_has_each_layers_spearman():
    t = tables(n=8, exact_every=2)
    fig = F.estimate_scatter(t)
    imp = t["importance"]
    both = imp.dropna(subset=["delta_nll", "delta_nll_estimate"])
    rho = dict(zip(t["estimate_agreement"]["layer"], t["estimate_agreement"]["spearman"]))
    layer_traces = [tr for tr in fig.data if tr.mode == "markers"]
    assert len(layer_traces) == len(LAYERS)
    for layer, tr in zip(LAYERS, layer_traces):
        g = both[both["layer"] == layer]
        assert list(tr.x) == list(g["delta_nll_estimate"]) and list(tr.y) == list(g["delta_nll"])
        assert f"ρ {rho[layer]:.2f}" in tr.name and layer in tr.name
    notes = captions(t)["estimate"]
    assert len(notes) == 1 and LAYERS[1] in notes[0] and "--method exact" in notes[0] and "0.20" in notes[0]
    t["estimate_agreement"]["notes"] = ["", "layer 1: rank it exactly"]
    assert captions(t)["estimate"] == ["layer 1: rank it exactly"]  # the table's own note where it has one


def test_tables_without_estimates_or_held_out_rows_still_draw():
    t = curve_tables(tables(estimate=False), evaluated_on=False, merge=False)
    figs = figures(t)
    assert set(figs) == {"heatmap", "effects", "proxies", "pruning"}
    lines = captions(t)
    assert lines["estimate"] == ["This sweep made no first-order estimate (no delta_nll_estimate column)."]
    assert "in-sample (optimistic)" in lines["pruning"][0] and "no merge curve" in lines["pruning"][0]
    names = [tr.name for tr in figs["pruning"].data]
    assert all("in-sample (optimistic)" in n for n in names)  # judged on the ranking rows: said so
    bare = {k: v for k, v in t.items() if k != "pruning_curve"}
    assert F.pruning(bare) is None and captions(bare)["pruning"] == ["No pruning curve in this sweep."]


def test_held_out_by_default_in_sample_only_when_asked_and_merge_beside():
    t = curve_tables(tables())
    held = F.pruning(t)
    names = [tr.name for tr in held.data]
    assert not any("in-sample" in n for n in names)
    assert "pruned, by causal" in names and "merged into the most similar kept expert" in names
    assert "pruned, by causal (merge run)" not in names  # the causal held-out line is that one
    causal = next(tr for tr in held.data if tr.name == "pruned, by causal")
    c = t["pruning_curve"]
    want = c[(c["evaluated_on"] == "heldout") & (c["ranking"] == "causal")]
    assert list(causal.y) == list(want["loss"])
    merged = next(tr for tr in held.data if tr.name.startswith("merged"))
    m = t["merge_curve"]
    assert list(merged.y) == list(m[m["strategy"] == "merge"]["loss"])
    both = F.pruning(t, in_sample=True)
    ins = [tr for tr in both.data if "in-sample (optimistic)" in (tr.name or "")]
    assert ins and all(tr.line.dash == "dash" for tr in ins if tr.mode == "lines+markers")
    assert "10 held-out rows" in captions(t)["pruning"][0]


def test_the_page_holds_every_figure_and_the_notes():
    t = curve_tables(tables(n=8, exact_every=2))
    t["importance"].loc[0, "label"] = "<b>expert 0</b>"
    prov = {"model": "m<script>", "dataset": "d", "rows": 10, "predicted_positions": 100, "base_loss": 3.0,
            "effects_dtype": "float32", "method": "both"}
    doc = page(t, prov, notes=["a sweep note"])
    for name in ("heatmap", "effects", "estimate", "proxies", "pruning"):
        assert f'id="fig-{name}"' in doc
    for line in captions(t, in_sample=True)["estimate"] + captions(t, in_sample=True)["pruning"]:
        assert html.escape(line) in doc
    assert "a sweep note" in doc and "m<script>" not in doc.split('id="corpus-data"')[0]


def test_the_sweeps_notes_go_under_their_section_once():
    t = tables(n=8, exact_every=2)
    notes = [f"{LAYERS[1]}: the first-order estimate ranks this layer's experts poorly: measure it exactly",
             "no held-out pruning curve: 16 rows: too few", "effects measured on a float32 copy"]
    lines = captions(t, notes=notes)
    assert lines["estimate"] == [notes[0]]  # the sweep's own note on the low layer, not a second one
    assert notes[1] in lines["pruning"]
    assert unplaced(lines, notes) == [notes[2]]
    doc = page(t, {"model": "m", "rows": 1}, notes=notes)
    assert all(doc.count(html.escape(n)) == 1 for n in notes)
