"""Figure builders (no Streamlit): token axis labels stay few enough to draw fast, data stays whole."""
import numpy as np

from routescope.app.components.figures import (MAX_TOKEN_LABELS, PALETTE, ChoiceGrid, choice_heatmap, has_divider,
                                    stacked_choice_heatmaps, show_token, token_ticks)


def test_short_sequences_label_every_token():
    toks = ["Once", " upon", "\n", " a"]
    vals, text = token_ticks(toks)
    assert vals == [0, 1, 2, 3] and text == [show_token(t) for t in toks]


def test_long_sequences_label_every_kth_token():
    toks = [f"t{i}" for i in range(88)]
    vals, text = token_ticks(toks)
    assert len(vals) <= MAX_TOKEN_LABELS and vals[0] == 0
    step = vals[1] - vals[0]
    assert step == -(-88 // MAX_TOKEN_LABELS) and vals == list(range(0, 88, step))
    assert text == [toks[v] for v in vals]
    assert token_ticks([]) == ([], [])


def test_heatmap_keeps_every_token_column_and_hover():
    T, layers = 88, ["parallel.0", "parallel.1"]
    toks = [f"w{i}" for i in range(T)]
    hover = np.array([[f"{l} {t}" for t in toks] for l in layers], dtype=object)
    fig = choice_heatmap(ChoiceGrid(np.zeros((2, T)), hover, layers, ["path 1", "path 2"], "title"), toks)
    trace = fig.data[0]
    assert np.asarray(trace.z).shape == (2, T) and len(trace.x) == T
    assert np.asarray(trace.customdata).shape == (2, T)  # every cell keeps its own hover text
    assert len(fig.layout.xaxis.tickvals) <= MAX_TOKEN_LABELS


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
    dividers = [s for s in fig.layout.shapes if s.name == "prompt | generated"]
    assert len(dividers) == 2 and {s.x0 for s in dividers} == {4.5}  # one per row, between prompt and generated
    assert fig.layout.height == choice_heatmap(routes, toks).layout.height + choice_heatmap(cosine, toks).layout.height
