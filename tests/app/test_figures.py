"""Figure builders (no Streamlit): every token has its own tick within a window of TOKEN_WINDOW tokens,
data stays whole, rows read in model depth order, charts of one run line up, one colour meaning."""
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from routescope.analysis.runs.routing import option_names
from routescope.analysis.runs.session import RunSettings, run_prompt
from routescope.rendering import drawers as D
from routescope.rendering.style import (DIVIDER, LABEL_CHARS, PALETTE, ROW_PX, TOKEN_WINDOW, has_divider,
                                        is_token_chart, show_token, titled_for_export, token_ticks)
from routescope.rendering.route_heatmaps import ChoiceGrid, choice_heatmap, stacked_choice_heatmaps
from routescope.rendering.bar_figures import candidates_figure, kl_figure
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import load_checkpoint

CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints"


def test_every_token_gets_its_own_tick_cut_to_the_stated_length():
    toks = ["Once", " upon", "\n", " a", " extraordinarily_long_token"]
    vals, text = token_ticks(toks)
    assert vals == [0, 1, 2, 3, 4]
    for t, shown in zip(toks, text):
        whole = show_token(t)
        assert shown == whole if len(whole) <= LABEL_CHARS else (len(shown) == LABEL_CHARS and shown.endswith("…")
                                                                  and whole.startswith(shown[:-1]))
    assert token_ticks([]) == ([], [])


@pytest.mark.parametrize("T", [1, TOKEN_WINDOW - 1, TOKEN_WINDOW, TOKEN_WINDOW + 1, 88, 300])
def test_heatmap_ticks_every_token_and_opens_on_a_window(T):
    layers = ["parallel.0", "parallel.1"]
    toks = [f"w{i}" for i in range(T)]
    hover = np.array([[f"{l} {t}" for t in toks] for l in layers], dtype=object)
    fig = choice_heatmap(ChoiceGrid(np.zeros((2, T)), hover, layers, ["path 0", "path 1"], "title"), toks)
    trace = fig.data[0]
    assert np.asarray(trace.z).shape == (2, T) and len(trace.x) == T
    assert np.asarray(trace.customdata).shape == (2, T)  # every cell keeps its own hover text
    ax = fig.layout.xaxis
    assert list(ax.tickvals) == list(range(T)) and list(ax.ticktext) == toks  # one tick per token
    lo, hi = ax.range
    shown = [t for t in range(T) if lo < t < hi]
    assert shown == list(range(max(0, T - TOKEN_WINDOW), T))  # the last TOKEN_WINDOW tokens, whole cells
    assert fig.layout.dragmode == "pan" and fig.layout.yaxis.fixedrange  # the rest is a drag away


def _colour(trace, option: int) -> str:
    """The colour a discrete-scale heatmap gives option index `option` (scale stops in [0, 1])."""
    frac = (option - trace.zmin) / (trace.zmax - trace.zmin)
    return next(c for (lo, c), (hi, _) in zip(trace.colorscale[::2], trace.colorscale[1::2]) if lo <= frac <= hi)


def test_stacked_rows_keep_their_cells_and_share_one_option_colour_bar():
    T, toks = 12, [f"w{i}" for i in range(12)]
    rng = np.random.default_rng(0)
    routes = ChoiceGrid(rng.integers(0, 3, (3, T)).astype(float), np.full((3, T), "r", dtype=object),
                        ["parallel.0", "parallel.1", "parallel.2"], ["path 0", "path 1", "combined"], "routes")
    cosine = ChoiceGrid(rng.integers(0, 2, (2, T)).astype(float), np.full((2, T), "c", dtype=object),
                        ["parallel.0", "parallel.1"], ["path 0", "path 1"], "cosine")
    fig = stacked_choice_heatmaps([routes, cosine], toks, n_prompt=5)
    assert len(fig.data) == 2 and [t.showscale for t in fig.data] == [True, False]
    for trace, grid in zip(fig.data, (routes, cosine)):
        assert np.array_equal(np.asarray(trace.z), grid.z) and list(trace.y) == grid.layers
        assert np.asarray(trace.customdata).shape == grid.z.shape
        for option in range(len(grid.labels)):  # option j has PALETTE[j] in every row
            assert _colour(trace, option) == PALETTE[option]
    assert list(fig.data[0].colorbar.ticktext) == routes.labels
    assert has_divider(fig)
    dividers = [s for s in fig.layout.shapes if s.name == DIVIDER]
    assert len(dividers) == 2 and {s.x0 for s in dividers} == {4.5}  # one per row, between prompt and generated
    # a grid is as tall stacked as drawn alone, at least ROW_PX a layer
    m = fig.layout.margin
    plot = fig.layout.height - m.t - m.b
    for axis, grid in ((fig.layout.yaxis, routes), (fig.layout.yaxis2, cosine)):
        px = (axis.domain[1] - axis.domain[0]) * plot
        alone = choice_heatmap(grid, toks)
        assert px == pytest.approx(alone.layout.height - alone.layout.margin.t - alone.layout.margin.b, rel=0.02)
        assert px >= ROW_PX * len(grid.layers)


def test_the_divider_label_is_above_the_plot_over_no_cell():
    toks = [f"w{i}" for i in range(10)]
    g = ChoiceGrid(np.zeros((1, 10)), np.full((1, 10), "", dtype=object), ["paths"], ["path 0"], "t")
    for fig in (choice_heatmap(g, toks, n_prompt=4), stacked_choice_heatmaps([g, g], toks, n_prompt=4)):
        labels = [a for a in fig.layout.annotations if a.name == DIVIDER]
        assert len(labels) == 1
        a = labels[0]
        assert a.x == 3.5 and a.yref == "paper" and a.y >= 1 and a.yanchor == "bottom"  # at or above the top edge
        titles = [t for t in fig.layout.annotations if t.name != DIVIDER]  # stacked rows' titles
        assert all(a.yshift > 0 for _ in titles)  # above the top row's title too


# --- a run's figures, drawn as the app draws them ----------------------------------------------

@lru_cache(maxsize=None)
def drawn(name: str, drop: tuple[str, ...] = (), stacked: bool = True):
    model, tok = load_checkpoint(CHECKPOINTS / name)
    run = run_prompt(model, tok, "Once upon a time, there was a little", settings=RunSettings(max_new_tokens=12),
                     ablation=Ablation.parse(drop=list(drop)), model_name=name)
    figs, _ = D.draw_run(run, model, stacked=stacked)
    return model, run, figs


@pytest.mark.parametrize("name", ["moep", "papaformer-gumbel-v2", "wiola-tiny", "pagmlp"])
def test_heatmap_rows_read_in_model_depth_order_top_down(name):
    model, _, figs = drawn(name, stacked=False)
    depth = list(model.routing_layers())  # forward order: the modules as the model runs them
    checked = 0
    for fig in figs.values():
        for trace in fig.data:
            if trace.type != "heatmap" or not set(trace.y) <= set(depth):
                continue
            rows = list(trace.y)
            assert rows == sorted(rows, key=depth.index), (fig.layout.title.text, rows)
            checked += 1
    assert checked
    for fig in figs.values():
        if any(t.type == "heatmap" for t in fig.data):
            assert all(ax.autorange == "reversed" for ax in fig.select_yaxes())  # the first row on top


def test_moep_utilisation_reads_like_its_heatmap():
    """Bars left to right in the heatmap's row order; legend names and colours those of its colour bar."""
    model, _, figs = drawn("moep", stacked=False)
    depth = list(model.routing_layers())
    heat = figs["topk_routes"]
    assert list(heat.data[0].y) == depth
    util = figs["topk_utilisation"]
    assert list(util.layout.xaxis.categoryarray) == depth
    names = option_names(model.option_labels())
    assert [b.name for b in util.data] == names == list(heat.data[0].colorbar.ticktext)
    assert [b.marker.color for b in util.data] == PALETTE[:len(names)]
    assert util.layout.yaxis.title.text  # the axis says what it counts


@pytest.mark.parametrize("name", ["wiola-tiny", "moep", "pgpt", "pagmlp"])
def test_token_charts_of_a_run_line_up(name):
    """Token t sits at the same x in every chart of a run: same left and right margins, same window."""
    _, run, figs = drawn(name, stacked=False)
    charts = [f for f in figs.values() if is_token_chart(f)]
    assert charts
    assert len({(f.layout.margin.l, f.layout.margin.r) for f in charts}) == 1
    assert len({tuple(f.layout.xaxis.range) for f in charts}) == 1
    for f in charts:
        assert has_divider(f), f.layout.title.text  # ATM's included
        assert {s.x0 for s in f.layout.shapes if s.name == DIVIDER} == {run.n_prompt - 0.5}


def _rgb(colour: str) -> tuple[int, int, int]:
    if colour.startswith("#"):
        return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return tuple(int(float(v)) for v in colour[colour.index("(") + 1:-1].split(",")[:3])


def test_every_continuous_heatmap_is_blue_where_high():
    """DSFF gates, ATM cosines, PAGMLP and pgpt shares, option weights: one meaning of colour."""
    seen = 0
    for name in ("wiola-tiny", "pagmlp", "pgpt", "moep"):
        for fig in drawn(name, stacked=False)[2].values():
            for t in fig.data:
                if t.type != "heatmap" or t.zmin == -0.5:  # discrete option grids have their own palette
                    continue
                scale = t.colorscale
                lo, hi = _rgb(scale[0][1]), _rgb(scale[-1][1])
                assert hi[2] > hi[0] and lo[0] >= lo[2], (fig.layout.title.text, scale[0], scale[-1])
                seen += 1
    assert seen >= 4


def test_candidates_axis_fits_its_values():
    for probs in ([0.12, 0.05, 0.01], [0.97, 0.02], [0.004, 0.003]):
        fig = candidates_figure([f"t{i}" for i in range(len(probs))], probs, "t0", 3)
        lo, hi = fig.layout.xaxis.range
        assert lo == 0 and max(probs) < hi <= max(probs) * 1.5  # the top bar fills most of the width


def test_candidates_alike_in_display_keep_a_bar_and_a_label_each_in_rank_order():
    # two byte tokens both decode to "\ufffd": plotly merged equal category strings into one bar
    toks, probs, ids = ["\ufffd", " the", "\ufffd", " a"], [0.4, 0.3, 0.2, 0.1], [171, 262, 172, 257]
    fig = candidates_figure(toks, probs, 262, 5, ids=ids)
    bar = fig.data[0]
    assert len(set(bar.y)) == len(toks) == len(bar.x)  # a category per candidate
    order = list(fig.layout.yaxis.categoryarray)[::-1]  # top to bottom
    tick = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext))
    length = dict(zip(bar.y, bar.x))
    assert [length[k] for k in order] == probs  # rank order, each bar its own probability (no doubled bar)
    shown = [tick[k] for k in order]
    assert len(set(shown)) == len(toks)  # every label visible and told apart
    for r, (t, i) in enumerate(zip(toks, ids)):
        assert shown[r].startswith(f"#{r + 1} ") and show_token(t) in shown[r]
        assert (str(i) in shown[r]) == (toks.count(t) > 1)  # the id only where two read alike
    colour = dict(zip(bar.y, bar.marker.color))
    assert [colour[k] for k in order].count(colour[order[1]]) == 1  # only the generated token is dark


@pytest.mark.parametrize("probs", [[4e-4, 3e-4, 2e-4, 1e-4, 5e-5], [0.03, 0.01], [0.9, 0.05], [3e-7, 1e-7]])
def test_candidate_ticks_read_distinct_values(probs):
    """The axis ticks, formatted as d3 formats them (".N%" is Python's ".N%"), differ from each
    other and from 0 (a ".1%" axis up to 0.05% read "0.0%" five times)."""
    ax = candidates_figure([f"t{i}" for i in range(len(probs))], probs, "t0", 3).layout.xaxis
    assert ax.dtick is not None and ax.tick0 == 0
    vals = [ax.tick0 + j * ax.dtick for j in range(int(ax.range[1] / ax.dtick + 1e-9) + 1)]
    text = [format(v, ax.tickformat[:-1] + "%") for v in vals]
    assert 3 <= len(vals) <= 7 and len(set(text)) == len(text), text
    assert all(float(t[:-1]) > 0 for t in text[1:]), text


def test_kl_chart_marks_where_the_prompt_ends():
    import pandas as pd

    from routescope.analysis.export import columns as C

    T = 9
    e = pd.DataFrame({C.BATCH: 0, C.POSITION: range(T), C.KL: np.linspace(0, 1, T), C.FLIPPED: [False] * T,
                      C.BASE_PROB: 0.5, C.ABLATED_PROB: 0.4})
    fig = kl_figure(e, [f"w{i}" for i in range(T)], n_prompt=4)
    assert {s.x0 for s in fig.layout.shapes if s.name == DIVIDER} == {3.5}


def test_an_exported_figure_names_model_and_ablation_in_its_visible_title():
    _, run, figs = drawn("pgpt", ("1",))
    for name, fig in figs.items():
        out = titled_for_export(fig, run.model_name, run.ablation.describe())
        title = out.layout.title.text
        assert "pgpt" in title and "drop *:1" in title, name
        if fig.layout.title.text:
            assert fig.layout.title.text in title  # the chart's own title stays
        assert fig.layout.title.text != title  # the app's figure is not changed


def test_offline_pages_carry_plotlys_cartesian_bundle_of_the_version_plotly_draws_for():
    """Every figure is cartesian, so pages inline plotly.js's cartesian bundle (a third of the full
    one) of exactly the plotly.js version plotly.py writes figures for, else the full bundle."""
    import hashlib

    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    from routescope.analysis.export import plotly_bundle as P

    js = P.plotly_js()
    if get_plotlyjs_version() == P.VERSION:
        assert js.startswith("/**\n* plotly.js (cartesian - minified) v" + P.VERSION)
        assert hashlib.sha256(js.encode()).hexdigest() == P.SHA256 and len(js) < len(get_plotlyjs()) / 2
    else:
        assert js == get_plotlyjs()
    import plotly.graph_objects as go

    page = P.figure_page(go.Figure(go.Heatmap(z=[[0, 1]])), "t &lt;i&gt;")
    assert page.count(js[:300]) == 1 and "<title>t &lt;i&gt;</title>" in page


def test_an_exported_figure_page_titles_itself_in_plain_text():
    """Issue 41 item 9: the Export view's figure pages had plotly's title markup (<br><span ...>) in their
    <title>; the browser's tab showed it. Here a run's exported figure, read back by an HTML parser."""
    from html.parser import HTMLParser

    from routescope.app.views.export import figure_html
    from routescope.rendering.style import titled_for_export

    model, tok = load_checkpoint(CHECKPOINTS / "mixtral-tiny")
    run = run_prompt(model, tok, "Once upon a time", settings=RunSettings(max_new_tokens=2))
    figs, _ = D.draw_run(run, model)
    figs = {n: titled_for_export(f, "mixtral-tiny", run.ablation.describe()) for n, f in figs.items()}  # as exported
    assert any("<br>" in str(f.layout.title.text) for f in figs.values())  # markup there to strip

    class Title(HTMLParser):
        def __init__(self):
            super().__init__()
            self.inside, self.text = False, ""

        def handle_starttag(self, tag, attrs):
            self.inside = tag == "title"

        def handle_endtag(self, tag):
            self.inside = False

        def handle_data(self, data):
            self.text += data if self.inside else ""

    for fig in figs.values():
        parser = Title()
        parser.feed(figure_html(fig)[:4000])  # the head: <title> comes before plotly.js
        assert parser.text and "<" not in parser.text and "span" not in parser.text, parser.text
        assert "ablation: none" in parser.text and " · " in parser.text


def _micro_effects(scale: float, n: int = 12, seed: int = 0):
    import pandas as pd

    from routescope.analysis.export import columns as C

    rng = np.random.default_rng(seed)
    v = rng.normal(0, scale, n)
    v = v[np.argsort(-np.abs(v), kind="stable")]  # by_size: largest |effect| first
    return pd.DataFrame({C.LAYER: "blocks.0", C.OPTION: range(n), C.METHOD: "ablation", C.CONTRIBUTION: v,
                         C.FULL_LOG_PROB: -2.0, C.REFERENCE_LOG_PROB: -2.0 - v}), [f"blocks.0 · e{i}" for i in range(n)]


@pytest.mark.parametrize("scale", [3e-6, 4e-4, 0.2, 3.0, 2e-10])
def test_path_effects_chart_and_table_share_a_unit_that_fits(scale):
    """Chart and table in one unit, the largest |effect| between 1 and 1000 of it (micro-nats read
    ±0.0001 on every row of a 4-decimal table of nats)."""
    from routescope.analysis.export import columns as C
    from routescope.rendering.bar_figures import path_effects_figure, path_effects_table

    df, names = _micro_effects(scale)
    table, column, (factor, unit) = path_effects_table(df, names)
    top = df[C.CONTRIBUTION].abs().max()
    want = 1.0 if top >= 1 else next((f for f in (1e3, 1e6, 1e9) if top * f >= 1), 1e9)  # the next 1000x up
    assert factor == want and column == f"{C.CONTRIBUTION} ({unit})" and list(table.columns[:2]) == ["option name",
                                                                                                      column]
    np.testing.assert_allclose(table[column], df[C.CONTRIBUTION] * factor, rtol=1e-12)
    assert (1 <= table[column].abs().max() < 1000) or factor in (1.0, 1e9)
    assert len({f"{v:.3g}" for v in table[column]}) == len(table)  # 3 significant digits tell every row apart
    fig = path_effects_figure(names[:5], list(df[C.CONTRIBUTION])[:5], "t", unit=(factor, unit))
    assert fig.layout.xaxis.title.text.startswith(f"{unit} ")
    np.testing.assert_allclose(sorted(fig.data[0].x), sorted(table[column][:5]), rtol=1e-12)
    assert f"{unit}<extra>" in fig.data[0].hovertemplate
    assert path_effects_figure(names[:5], list(df[C.CONTRIBUTION])[:5], "t").layout.xaxis.title.text == \
        fig.layout.xaxis.title.text  # the unit of the values themselves


@pytest.mark.parametrize("delta,total", [(3.1e-6, 1.0), (-2.4e-8, 0.37), (0.004, -0.2), (0.3, 1.2), (-0.5, 0.4),
                                         (1e-3, 0.0)])
def test_a_convergence_delta_reads_in_significant_digits_with_a_verdict(delta, total):
    import re

    from routescope.rendering.numbers import convergence_verdict

    said = convergence_verdict(delta, total)
    share = abs(delta) / abs(total) if total else float("inf")
    assert said.startswith("converged: " if share <= 0.05 else "not converged: ")
    assert "0.0%" not in said and " 0 of" not in said
    if total:
        shown = float(re.search(r"\|delta\| = (\S+) of the attribution total", said)[1])
        assert shown == pytest.approx(share, rel=0.05)  # two significant digits


@pytest.mark.parametrize("top", [0.97, 1.0, 0.55])
def test_a_flag_over_a_bar_near_100_percent_is_not_cut_off(top):
    """The corpus utilisation bars carry "▲ over" above the bar: the share axis leaves room for one
    line of text (about 16 px of the 280 px plot) over the tallest bar, the text is not clipped to
    the axes, and the ticks stop at 100%."""
    import pandas as pd

    from routescope.analysis.corpus import stats as S
    from routescope.analysis.export import columns as C
    from routescope.rendering.corpus_figures import utilisation_figure

    share = np.array([top, 1 - top, 0.6, 0.4])
    u = pd.DataFrame({C.LAYER: ["l0", "l0", "l1", "l1"], C.OPTION: [0, 1, 0, 1], C.LABEL: ["p0", "p1", "p0", "p1"],
                      S.SLOT_SHARE: share, S.FIRST_SHARE: share, S.TOKEN_SHARE: share, S.TOKENS: 100,
                      S.UNIFORM: 0.5, S.DEAD: share < 0.005, S.OVERLOADED: share > 0.9})
    fig = utilisation_figure(u)
    lo, hi = fig.layout.yaxis.range
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    bars = [t for t in fig.data if t.type == "bar"]
    assert any(t for b in bars for t in b.text) == (top > 0.9)
    for b in bars:
        assert b.cliponaxis is False
        for y, text in zip(b.y, b.text):
            if text:
                assert hi - y >= 16 / plot_px * (hi - lo), (y, hi)
    assert max(fig.layout.yaxis.tickvals or [0]) <= 1


@pytest.mark.parametrize("heights", [[110, 300], [110, 150, 400], [200]])
def test_stacked_rows_lay_out_what_make_subplots_does(heights):
    """The stacked choice heatmaps' layout, built as a dict (make_subplots' property updates were most
    of a seed toggle's drawing), against plotly's own make_subplots with the same arguments: the same
    axes, domains, anchors and shared x axis; row titles at the top left of their rows."""
    from plotly.subplots import make_subplots

    from routescope.rendering.route_heatmaps import stacked_rows

    gap, titles = 48 / (sum(heights) + 48 * (len(heights) - 1)), [f"row {i}" for i in range(len(heights))]
    want = make_subplots(rows=len(heights), cols=1, shared_xaxes=True, vertical_spacing=gap, subplot_titles=titles,
                         row_heights=heights).layout.to_plotly_json()
    got = stacked_rows(heights, gap, titles)
    axes = sorted(k for k in want if k.startswith(("xaxis", "yaxis")))
    assert sorted(k for k in got if k.startswith(("xaxis", "yaxis"))) == axes
    for k in axes:
        assert set(got[k]) == set(want[k]), k
        for field, value in want[k].items():
            if field == "domain":
                np.testing.assert_allclose(got[k][field], value, rtol=1e-12, atol=1e-12)
            else:
                assert got[k][field] == value, (k, field)
    for g, w in zip(got["annotations"], want.get("annotations", ())):
        assert g["text"] == w["text"] and math.isclose(g["y"], w["y"], rel_tol=1e-12, abs_tol=1e-12)
        assert (g["x"], g["xanchor"], g["yanchor"]) == (0, "left", "bottom")
