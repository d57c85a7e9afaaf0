"""RouteScope: see how routed language models send their tokens, from Python and notebooks.

    import routescope as rs

    model, tok = rs.load("checkpoints/papaformer-gumbel-v2")
    run = rs.run(model, tok, "Solve for x: 3x + 5 = 20.", max_new_tokens=8, drop=["parallel.0:1"])
    run.table                          # every route as the export's long table (one format, every family)
    run.views["gumbel_routes"].frame   # a view's tidy frame; list(run.views) names them
    figs = rs.figures(run, model)      # plotly figures of every view (they display in Jupyter)

The subpackages are the repository's folders: `routescope.core_models` (families, sites, traces,
ablations, generation), `routescope.analysis` (pure analyses, exports), `routescope.corpora` (the
synthetic training text), `routescope.cli` and `routescope.app`. Names here load on first use, so
`import routescope` (and the command line) stays fast.
"""
from __future__ import annotations

import importlib
from typing import Any

# name -> (module, attribute), imported when first used
_LAZY = {
    "load": ("routescope.core_models.checkpoint", "load_checkpoint"),
    "save": ("routescope.core_models.checkpoint", "save_checkpoint"),
    "Ablation": ("routescope.core_models.ablation", "Ablation"),
    "tracing": ("routescope.core_models.trace", "tracing"),
    "Trace": ("routescope.core_models.trace", "Trace"),
    "generate": ("routescope.core_models.generate", "generate"),
    "routing": ("routescope.core_models.router_access", "routing"),
    "from_name": ("routescope.core_models.registry", "from_name"),
    "build_model": ("routescope.core_models.registry", "build_model"),
    "RunSettings": ("routescope.analysis.runs.session", "RunSettings"),
    "Run": ("routescope.analysis.runs.session", "Run"),
    "read_table": ("routescope.analysis.export.table_files", "read_table"),
    "read_csv": ("routescope.analysis.export.table_files", "read_csv"),
    "read_parquet": ("routescope.analysis.export.table_files", "read_parquet"),
    "read_frame_csv": ("routescope.analysis.export.csv_format", "read_frame_csv"),
    "read_provenance": ("routescope.analysis.export.table_files", "read_provenance"),
    "ImportanceSettings": ("routescope.analysis.reports.importance", "ImportanceSettings"),
    "run": ("routescope.api", "run"),
    "figures": ("routescope.api", "figures"),
    "importance": ("routescope.api", "importance"),
    "replay": ("routescope.api", "replay"),
    "drift": ("routescope.api", "drift"),
}

__all__ = [*_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'routescope' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
