"""The Replay view with Streamlit's AppTest on olmoe-tiny: a trace (transformers' own routing with one
swapped expert) replayed from the view shows the analysis's figures (`rs.replay` run directly), the
row's mismatch with its margin, the marked token and the downloads; a trace of another model is refused
in one line; a family without top-k routing says so."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

import routescope as rs
from routescope.analysis.replay.row import TraceRow
from routescope.app import state as K
from routescope.app.views import replay as RV
from routescope.rendering.replay_figures import summary_line

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app" / "main.py")
CK = ROOT / "checkpoints"
TEXTS = ["Once upon a time, there was a little girl named Lily.", "Solve this problem: 3x + 5 = 20."]


def replay_view(name: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    box = at.selectbox(key=K.CHECKPOINT)
    box.set_value(next(p for p in box.options if Path(p).name == name)).run()
    at.segmented_control(key=K.VIEW).set_value("Replay").run()
    return at


def trace_file(tmp_path: Path) -> tuple[Path, list[TraceRow]]:
    """The model's own routing (routescope's reference) with one expert swapped at (row a, 3, layer 1)."""
    from routescope.analysis.replay.compare import model_shape, reference_routes

    model, tok = rs.load(str(CK / "olmoe-tiny"))
    shape = model_shape(model)
    ids = [np.array(tok.encode(t).ids) for t in TEXTS]
    refs = reference_routes(model, shape, ids)
    rows = [TraceRow(r, x, ref.ids.copy()) for r, x, ref in zip("ab", ids, refs)]
    e = rows[0].experts
    e[3, 1, -1] = next(j for j in range(shape.n) if j not in e[3, 1])
    recs = [(row.row, t, int(row.token_ids[t]), shape.layers[l], j, int(row.experts[t, l, j]))
            for row in rows for t in range(len(row.token_ids)) for l in range(len(shape.layers)) for j in range(shape.k)]
    path = tmp_path / "trace.parquet"
    pd.DataFrame(recs, columns=["row", "position", "token_id", "layer", "k", "expert"]).to_parquet(path, index=False)
    return path, rows


def test_a_trace_replayed_from_the_view_equals_the_analysis(tmp_path):
    path, rows = trace_file(tmp_path)
    at = replay_view("olmoe-tiny")
    at.radio(key=RV.SOURCE).set_value(RV.SERVER).run()
    at.text_input(key=RV.PATH).set_value(str(path)).run()
    at.button(key=RV.RUN).click().run()
    assert not at.exception, [e.value for e in at.exception]
    model, _ = rs.load(str(CK / "olmoe-tiny"))
    direct = rs.replay(model, rows)
    assert direct.summary["mismatches"] == 1
    assert any(summary_line(direct.summary) in m.value for m in at.markdown)
    shown = [df.value for df in at.dataframe]
    pd.testing.assert_frame_equal(shown[0].reset_index(drop=True), direct["agreement"], check_dtype=False)
    row_mism = shown[1]
    assert len(row_mism) == 1 and row_mism["position"].iloc[0] == 3
    assert row_mism["margin"].iloc[0] == pytest.approx(direct["mismatches"]["margin"].iloc[0])
    assert any('class="rs-mismatch"' in m.value and "position 3: differs at model.layers.1.mlp.gate" in m.value
               for m in at.markdown)
    names = {b.label for b in at.get("download_button")}
    assert {"replay.html", "agreement.csv", "mismatches.parquet", "checks.csv"} <= names


def test_a_trace_of_another_model_is_refused_in_one_line(tmp_path):
    path = tmp_path / "other.csv"
    pd.DataFrame({"row": ["x"] * 2, "position": [0, 0], "token_id": [5, 5], "layer": [0, 1], "k": [0, 0],
                  "expert": [1, 2]}).to_csv(path, index=False)
    at = replay_view("olmoe-tiny")
    at.radio(key=RV.SOURCE).set_value(RV.SERVER).run()
    at.text_input(key=RV.PATH).set_value(str(path)).run()
    at.button(key=RV.RUN).click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "row 'x'" in errors[0] and "another model" in errors[0], errors


def test_a_family_without_top_k_routing_says_so():
    at = replay_view("pgpt")
    assert not at.exception
    assert any("nothing to replay" in i.value for i in at.info)
