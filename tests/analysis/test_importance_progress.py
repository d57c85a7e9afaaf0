"""The sweep's progress reports every ablated forward, not only every batch of rows (at 128 experts x
24 layers a batch is 3,072 forwards, 78 s on a CPU, too long to wait for a first report): each
forward (one `stop()` check before it) is followed by a report, the reports never go back, the
first lies inside the first batch and the last is the total; a forward resumed at a later layer
counts for less (the layers it runs plus the head); the numbers are those of a run without progress."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from routescope.analysis.inputs import datasets as D
from routescope.analysis.reports.importance import PHASES, ImportanceSettings, importance
from routescope.core_models.checkpoint import load_checkpoint

pytest.importorskip("transformers")

CK = Path(__file__).resolve().parents[2] / "checkpoints"
TEXTS = ["Once upon a time, there was a little girl named Lily.", "Solve this problem: 3x + 5 = 20.",
         "One day a little boy went to the park.", "Find the largest prime below fifty.", "The cat sat."]


@pytest.mark.parametrize("name, sweep", [("olmoe-tiny", "fast"), ("mixtral-tiny", "naive")])
def test_progress_after_every_forward(name, sweep):
    model, tok = load_checkpoint(CK / name)
    data = D.rows_corpus("t", [D.CorpusRow(str(i), t, ()) for i, t in enumerate(TEXTS)], [])
    settings = ImportanceSettings(batch_size=2, control_draws=1, prune_draws=1, prune_max=1, method="exact",
                                  sweep=sweep)
    events: list = []

    def stop() -> bool:
        events.append("forward")
        return False

    result = importance(model, tok, data, settings, progress=lambda d, t: events.append((d, t)), stop=stop)
    reports = [e for e in events if e != "forward"]
    assert events.count("forward") > 0
    for i, e in enumerate(events):  # every forward is reported before the next one starts
        if e == "forward":
            assert i + 1 < len(events) and events[i + 1] != "forward"
    done = [d for d, _ in reports]
    total = reports[0][1]
    assert all(t == total for _, t in reports) and total >= len(TEXTS)  # rows x passes
    assert np.all(np.diff(done) >= 0) and done[-1] == total
    assert 0 < done[0] < settings.batch_size  # inside the first batch of rows
    first = [d for d in done if d <= settings.batch_size]  # the first batch's reports
    steps = np.diff([0.0, *first])
    steps = steps[steps > 0]  # the batch's own report repeats its last forward's
    L = len(model.routing_layers())
    # a forward resumed at the first layer runs L layers and the head, one at the last layer 1 and the head
    want = (L + 1) / 2 if sweep == "fast" else 1.0
    assert steps[0] / steps[-1] == pytest.approx(want, rel=1e-9)
    plain = importance(model, tok, data, settings)
    assert np.array_equal(result["importance"]["delta_nll"], plain["importance"]["delta_nll"])


def test_progress_goes_on_while_merging_and_ends_at_the_total():
    """--merge: the similarity pass over the ranking rows, the pruned and each merged model's pass over
    the held-out rows are reported too (the reports before merging stop at the pruning's end)."""
    model, tok = load_checkpoint(CK / "olmoe-tiny")
    texts = [f"{t} ({i})" for i in range(5) for t in TEXTS]  # 25 rows: enough to hold out
    data = D.rows_corpus("t", [D.CorpusRow(str(i), t, ()) for i, t in enumerate(texts)], [])
    s = ImportanceSettings(batch_size=4, control_draws=0, prune_draws=0, prune_max=1, merge_max=2, method="exact",
                           options=tuple(range(model.routing_modules[next(iter(model.routing_layers()))].n_experts)),
                           bootstrap=10)
    reports: list = []
    phases: list = []
    result = importance(model, tok, data, s, progress=lambda d, t: reports.append((d, t)),
                        phase=lambda what: phases.append((what, len(reports))))
    assert "merge_curve" in result.tables
    # what the progress counts, named as each pass starts
    assert [w for w, _ in phases] == [PHASES["exact"], PHASES["prune"], PHASES["merge"]]
    assert phases[0][1] == 0 and phases[1][1] < phases[2][1] < len(reports)
    held, ranking = result.provenance["holdout"]["heldout_rows"], result.provenance["holdout"]["ranking_rows"]
    done, total = [d for d, _ in reports], reports[-1][1]
    assert all(t == total for _, t in reports) and np.all(np.diff(done) >= 0) and done[-1] == total
    merging = result.provenance["rows"] + held  # the sweep's pass over every row, the pruning's over the held-out
    assert total == merging + ranking + held * (1 + s.merge_max)
    after = sorted({d for d in done if d > merging})
    # the similarity pass (one report a batch of ranking rows), then 1 + merge_max passes over the held-out rows
    assert len(after) >= -(-ranking // s.batch_size) + 1 + s.merge_max


def test_progress_ends_at_the_total_when_the_merge_is_left_out():
    """--merge with --options (no pruning curve, so no merge): the total does not count a merge."""
    model, tok = load_checkpoint(CK / "olmoe-tiny")
    texts = [f"{t} ({i})" for i in range(5) for t in TEXTS]
    data = D.rows_corpus("t", [D.CorpusRow(str(i), t, ()) for i, t in enumerate(texts)], [])
    s = ImportanceSettings(batch_size=8, control_draws=0, prune_draws=0, merge_max=1, method="exact", options=(0, 1),
                           bootstrap=10)
    reports: list = []
    result = importance(model, tok, data, s, progress=lambda d, t: reports.append((d, t)))
    assert "merge_curve" not in result.tables
    assert reports[-1][0] == reports[-1][1]
