"""Figure builders (no Streamlit): token axis labels stay few enough to draw fast, data stays whole."""
import numpy as np

from app.components.figures import MAX_TOKEN_LABELS, choice_heatmap, show_token, token_ticks


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
    fig = choice_heatmap(np.zeros((2, T)), hover, layers, toks, ["path 1", "path 2"], "title")
    trace = fig.data[0]
    assert np.asarray(trace.z).shape == (2, T) and len(trace.x) == T
    assert np.asarray(trace.customdata).shape == (2, T)  # every cell keeps its own hover text
    assert len(fig.layout.xaxis.tickvals) <= MAX_TOKEN_LABELS
