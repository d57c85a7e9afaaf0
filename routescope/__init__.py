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
    "from_name": ("routescope.core_models.registry", "from_name"),
    "build_model": ("routescope.core_models.registry", "build_model"),
    "RunSettings": ("routescope.analysis.runs.session", "RunSettings"),
    "Run": ("routescope.analysis.runs.session", "Run"),
    "read_table": ("routescope.analysis.export.tables", "read_table"),
    "read_csv": ("routescope.analysis.export.tables", "read_csv"),
    "read_parquet": ("routescope.analysis.export.tables", "read_parquet"),
    "read_frame_csv": ("routescope.analysis.export.tables", "read_frame_csv"),
    "read_provenance": ("routescope.analysis.export.tables", "read_provenance"),
    "ImportanceSettings": ("routescope.analysis.reports.importance", "ImportanceSettings"),
}

__all__ = [*_LAZY, "run", "figures", "importance"]


def only_as(full: str, name: str) -> None:
    """Called by each repository folder's `__init__`: the folders stay at the top level of the
    repository but install under `routescope.` (pyproject's package-dir). Imported by its folder name
    (the repository root on sys.path: `import analysis`), a folder would be a second copy of every
    module, with tables of its own that a registration could land in; so that import fails."""
    if name != full:
        raise ImportError(f"import {full}, not {name}: RouteScope's folders install under routescope")


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'routescope' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


def run(model: Any, tokenizer: Any, prompt: str, *, drop: list[str] | tuple[str, ...] = (),
        force: list[str] | tuple[str, ...] = (), modes: list[str] | tuple[str, ...] = (), ablation: Any = None,
        name: str = "model", **settings: Any) -> Any:
    """Generate from `prompt` and trace every routing site of prompt and continuation: a
    `routescope.analysis.runs.session.Run` with the generation (top candidates per step), the export
    table (`run.table`) and the family's views (`run.views`: name -> tidy frame + drawer).

    `drop` / `force`: ablation specs as on the command line ("parallel.0:1", "1", "*:0-3",
    "model.layers.*.mlp.gate:!0", "*:top8"; README "Ablation specs"), `modes`:
    named ablations of the model's family (`model.ablation_modes()`, e.g. "pgpt1-reference"), or a
    ready `ablation`; `settings`: `RunSettings` fields (max_new_tokens, greedy, temperature, top_k,
    top_p, seed, routing, top_n, options as {name: value} for the family's run options)."""
    from routescope.analysis.runs.session import RunSettings, run_prompt
    from routescope.analysis.runs.usage import ablation_for

    if ablation is None:  # "top N" specs rank options by the unablated model's picks on this prompt
        ablation = ablation_for(model, drop, force, modes, run_ids=lambda: [tokenizer.encode(prompt).ids])
    elif drop or force or modes:
        raise ValueError("give drop/force/modes specs or an ablation, not both")
    if isinstance(settings.get("options"), dict):
        settings["options"] = tuple(settings["options"].items())
    return run_prompt(model, tokenizer, prompt, settings=RunSettings(**settings), ablation=ablation, model_name=name)


def figures(run: Any, model: Any, *, stacked: bool = False) -> dict[str, Any]:
    """The plotly figures of every view of `run` (the app's Routing view draws the same ones, from
    the same drawer table `routescope.rendering.drawers`, which needs no Streamlit)."""
    from routescope.rendering.drawers import draw_run

    return draw_run(run, model, stacked=stacked)[0]


def importance(model: Any, tokenizer: Any, data: Any, **settings: Any) -> dict[str, Any]:
    """Which experts matter on `data` (a dataset file path, or a `corpus_data.CorpusData`): the frames
    of `analysis.reports.importance` by name (importance, control, control_summary, proxies, proxy_agreement,
    pruning, pruning_curve). `settings`: `ImportanceSettings` fields (layers, options, max_tokens,
    control_draws, method, float32, ...)."""
    from routescope.analysis.corpus.data import CorpusData, load_corpus
    from routescope.analysis.reports.importance import ImportanceSettings
    from routescope.analysis.reports.importance import importance as sweep

    for key in ("layers", "options"):
        if settings.get(key) is not None:
            settings[key] = tuple(settings[key])
    if not isinstance(data, CorpusData):
        data = load_corpus(data)
    return sweep(model, tokenizer, data, ImportanceSettings(**settings)).tables
