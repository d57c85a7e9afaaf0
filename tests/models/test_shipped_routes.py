"""The routes table in checkpoints/README.md (scripts/routes_table.py) matches the shipped weights."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "routes_table.py"
spec = importlib.util.spec_from_file_location("routes_table", SCRIPT)
routes_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(routes_table)

CHECKPOINTS = routes_table.papaformer_checkpoints() if routes_table.ROOT.is_dir() else []


def _table_rows(text: str) -> dict[str, list[list[str]]]:
    """checkpoint name -> its rows' cells (probes, reading, route 1, route 2, combined, accuracy, routes)."""
    block = routes_table.block_of(text)
    assert block, "checkpoints/README.md has no routes table; run scripts/routes_table.py"
    out: dict[str, list[list[str]]] = {}
    name = None
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 9 or cells[1] in ("probes", "---"):
            continue
        m = re.match(r"\[([^\]]+)\]", cells[0])
        name = m.group(1) if m else name
        out.setdefault(name, []).append(cells[1:8])
    return out


@pytest.mark.skipif(not CHECKPOINTS, reason="no shipped PaPaformer checkpoints")
@pytest.mark.parametrize("path", CHECKPOINTS, ids=lambda p: p.name)
def test_routes_table_matches_the_shipped_weights(path):
    """Each share and accuracy in the README equals the one measured now, up to one route of the
    row's count (a near-tie router logit may round the other way on another CPU's kernels)."""
    rows = _table_rows((routes_table.ROOT / "README.md").read_text())[path.name]
    measured = routes_table.measure(path)
    assert [(r[0], r[1]) for r in rows] == [(m["probes"], m["reading"]) for m in measured]
    for cells, m in zip(rows, measured):
        n = int(m["n_routes"])
        assert int(cells[6]) == n
        for cell, key in zip(cells[2:6], ("route 1", "route 2", "combined", "accuracy")):
            want = m.get(key)
            if want is None:
                assert cell == ""
                continue
            assert abs(float(cell.rstrip("%")) / 100 - want) <= 1 / n + 0.0005, (m["probes"], m["reading"], key)


def _gumbel(path: Path) -> bool:
    import json
    return json.loads((path / "config.json").read_text()).get("combiner", "").startswith("gumbel")


@pytest.mark.skipif(not any(_gumbel(p) for p in CHECKPOINTS), reason="no shipped Gumbel checkpoints")
@pytest.mark.parametrize("path", [p for p in CHECKPOINTS if _gumbel(p)], ids=lambda p: p.name)
@pytest.mark.parametrize("majority", [False, True], ids=["last-token", "majority"])
def test_shipped_gumbel_checkpoints_route_at_most_a_fifth_to_combined(path, majority):
    """A fixed property of the shipped weights (issue 12): on the paper's Table 6 probes at most 20%
    of the (prompt, layer) routes take the combined representation, counted from the raw routes."""
    from routescope.analysis.runs import domain as D
    from routescope.core_models.checkpoint import load_checkpoint

    model, tok = load_checkpoint(path)
    routes = D.probe_routes(model, tok, D.read_probes(D.DEFAULT_PROBES), majority=majority)
    combined = model.config.n_paths + 1  # 1-based: paths 1..k, then combined
    values = [int(r) for r in routes["route"]]
    assert len(values) == 20 * model.config.n_parallel_layers
    share = sum(v == combined for v in values) / len(values)
    assert share <= 0.20, f"{path.name}: {share:.1%} of Table 6 routes take the combined representation"
