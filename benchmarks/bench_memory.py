"""Goal 8: memory of the app process with every shipped checkpoint loaded.

A fresh subprocess imports what the app imports (streamlit, plotly, captum through
analysis.runs.attribution, analysis.runs.session), reads its RSS, loads every shipped checkpoint with
core_models.checkpoint.load_checkpoint (checkpoints/<name>, else the preset with random weights
saved once to a temporary checkpoint, same size), and reads its RSS again.
"""
from __future__ import annotations

from benchmarks import common as C


def child(payload: dict) -> dict:
    import plotly  # noqa: F401
    import streamlit  # noqa: F401

    import routescope.analysis.runs.attribution  # noqa: F401
    import routescope.analysis.runs.effects  # noqa: F401
    import routescope.analysis.runs.session  # noqa: F401
    from routescope.core_models.checkpoint import load_checkpoint
    rss0 = C.rss_mb()
    rows, keep = [], []
    for name, path in payload["checkpoints"]:
        before = C.rss_mb()
        model, tok = load_checkpoint(path)
        keep.append((model, tok))
        rows.append({"name": name, "params": model.num_params(), "delta_mb": C.rss_mb() - before})
    return {"rss_imports_mb": rss0, "rss_loaded_mb": C.rss_mb(), "peak_rss_mb": C.peak_rss_mb(), "rows": rows}


def run(args) -> C.Report:
    rep = C.Report("bench_memory", "8. Memory: the app process with every shipped checkpoint loaded")
    ckpts, sources = [], {}
    for name in C.SHIPPED:
        path, sources[name] = C.checkpoint_dir(name)
        ckpts.append((name, str(path)))
    r = C.run_child("benchmarks.bench_memory", {"checkpoints": ckpts}, args.threads)
    t = C.Table("RSS growth per loaded checkpoint (float32 in memory)", ["checkpoint", "weights", "params", "RSS delta MiB"])
    for row in r["rows"]:
        t.add(row["name"], sources[row["name"]], f"{row['params']:,}", row["delta_mb"])
    rep.tables.append(t)
    s = C.Table("App process RSS", ["state", "MiB"])
    s.add("after the app's imports", r["rss_imports_mb"])
    s.add(f"after loading all {len(ckpts)} checkpoints", r["rss_loaded_mb"])
    s.add("delta (all checkpoints)", r["rss_loaded_mb"] - r["rss_imports_mb"])
    s.add("peak (ru_maxrss)", r["peak_rss_mb"])
    s.notes.append("no goal number given: reported for the record")
    rep.tables.append(s)
    return rep


if __name__ == "__main__":
    C.main(run, __doc__, child=child)
