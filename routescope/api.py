"""`rs.run`, `rs.figures`, `rs.importance`, `rs.replay` and `rs.drift`: the notebook API over the
layers (`routescope` loads these names on first use, so `import routescope` stays fast)."""
from __future__ import annotations

from os import PathLike
from typing import Any

from routescope.analysis.drift import DriftSettings
from routescope.analysis.drift import drift as drift_run
from routescope.analysis.inputs.datasets import CorpusData, load_corpus
from routescope.analysis.replay.compare import ReplaySettings, model_shape
from routescope.analysis.replay.run import replay as replay_trace
from routescope.analysis.replay.trace import read_trace
from routescope.analysis.reports.importance import ImportanceSettings
from routescope.analysis.reports.importance import importance as sweep
from routescope.analysis.runs.session import RunSettings, run_prompt
from routescope.analysis.runs.usage import ablation_for
from routescope.rendering.drawers import draw_run


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

    return draw_run(run, model, stacked=stacked)[0]


def importance(model: Any, tokenizer: Any, data: Any, **settings: Any) -> dict[str, Any]:
    """Which experts matter on `data` (a dataset file path, or a `corpus_data.CorpusData`): the frames
    of `analysis.reports.importance` by name (importance, control, control_summary, proxies, proxy_agreement,
    pruning, pruning_curve; estimate_agreement with method "both"). `settings`: `ImportanceSettings` fields
    (layers, options, max_tokens, control_draws, method ("exact", the default here; "estimate": first-order
    estimates only; "both": estimates, then the `confirm` largest per layer measured exactly), sweep
    ("fast" or "naive"), float32, ...)."""

    for key in ("layers", "options"):
        if settings.get(key) is not None:
            settings[key] = tuple(settings[key])
    if not isinstance(data, CorpusData):
        data = load_corpus(data)
    return sweep(model, tokenizer, data, ImportanceSettings(**settings)).tables


def replay(model: Any, trace: Any, *, reference_float32: bool = False, trace_format: str | None = None,
           name: str = "model", **settings: Any) -> Any:
    """A serving engine's routing trace against `model` as transformers runs it (`analysis.replay.run`):
    a `ReplayResult` whose `tables` are agreement, mismatches, checks, first_divergence and rows (the
    files `routescope replay` writes), `summary` the corpus figures. `trace`: a file (vLLM / SGLang JSON
    lines, an SGLang per_token dump, a .parquet / .csv table; `trace_format` names it where its name
    does not) or an iterable of `TraceRow`s. `reference_float32`: also run a float32 copy (the
    mismatches' gone_in_float32). `settings`: `ReplaySettings` fields (tie_ulps, trace_dtype,
    batch_tokens, keep_rows)."""
    shape = model_shape(model)  # SGLang's flat ids are shaped with the model's layers and k
    rows = read_trace(trace, fmt=trace_format, n_layers=len(shape.layers), top_k=shape.k) \
        if isinstance(trace, (str, PathLike)) else trace
    return replay_trace(model, rows, settings=ReplaySettings(**settings),
                        float32_model=model.float32_copy() if reference_float32 else None, name=name,
                        trace=str(trace) if isinstance(trace, (str, PathLike)) else "")


def drift(checkpoints: Any, data: Any, **settings: Any) -> dict[str, Any]:
    """Routing drift over one run's checkpoints (directories, in the run's order; `sort="step"`
    orders them by their step) on `data` (a dataset file path, or a `CorpusData`): the frames
    `routescope drift` writes by name (saturation, utilisation, events, experts, and label_shares,
    label_specialisation where the dataset has labels; `analysis.drift`). `settings`: `DriftSettings`
    fields (max_tokens, batch_size, sort)."""
    if not isinstance(data, CorpusData):
        data = load_corpus(data)
    return drift_run(list(checkpoints), data, DriftSettings(**settings)).tables
