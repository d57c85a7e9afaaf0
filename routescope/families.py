"""One `FamilySpec` per family: what the family is (config and model classes, parameter count,
presets) and what it offers (analysis views and export rows, its route reader, the drawers of its
views, app pages of its own). Everything that handles "any family" asks the spec of
`model.config.family`; nothing else compares family names. Per-call run options are declared by the
family's model (`RouteScopeLM.run_option_list`), where forward checks them.

Families outside the repository register through the `routescope.families` entry point (its value:
a FamilySpec, or a callable returning one, named as the entry point); the app, the CLI and `rs`
then find the family with no edit here. `register(spec)` adds one in-process (tests).

This module sits above the layers it joins: core_models (the model), analysis (frames, rows,
routes) and the rendering package (drawers, no Streamlit); pages import Streamlit only when shown.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Mapping

from routescope.analysis.runs import domain
from routescope.analysis.runs import families as A
from routescope.rendering import drawers as D
from routescope.core_models import hf, llama, moep, papaformer, pgpt, wiola
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.config import BaseConfig, ConfigError, json_kind, short_repr

ENTRY_POINTS = "routescope.families"


@dataclass(frozen=True)
class Page:
    """An app view of a family's own, offered beside the common views where `applies(model)`.
    `show(model, path, mtime, ablation, described)` draws it (Streamlit, imported when shown);
    `tables(model, path, mtime, ablation)`, if given, gives the tables the Export view offers for it
    (label -> (file name part, frame))."""

    title: str
    show: Callable[..., None]
    applies: Callable[[RouteScopeLM], bool] = lambda model: True
    tables: Callable[..., Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class ProbeTable:
    """Probe prompts whose expected route a family's paper prints, as data the generic code loops
    over: the report's accuracy section, the corpus view's shipped datasets and `routescope routes`.
    `sets`: probe set name -> TSV (the first: the paper's own); `accuracy(model, tokenizer, sets)` ->
    (long accuracy table: probe_set, route_at, source, metric, value; per-probe tables by name);
    `intended()`: the corpus view's intended option per label value (from the first set);
    `note`: what the report says of the accuracy; `command(args, model, tokenizer)`: the table
    `routescope routes` prints (its exit status)."""

    sets: Mapping[str, Any]
    accuracy: Callable[..., tuple[Any, Mapping[str, Any]]]
    intended: Callable[[], Mapping[str, Mapping[str, int]]]
    note: str
    command: Callable[..., int]


@dataclass(frozen=True)
class FamilySpec:
    """Everything RouteScope knows of one family. `drawers`: view name (as the family's
    `analysis.views` names them) -> the callable that draws it; views not listed use the common
    drawers (`rendering.drawers.DRAWERS`, by the view's kind). `presets`: named configs of
    this family (preset name -> config fields). `probes`: its paper's probe prompts with expected
    routes, where it prints them."""

    name: str
    config: type[BaseConfig]
    model: type[RouteScopeLM]
    param_count: Callable[[Any], int]
    analysis: A.FamilyAnalysis = A.GENERIC
    drawers: Mapping[str, D.Drawer] = field(default_factory=dict)
    pages: tuple[Page, ...] = ()
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    description: str = ""
    probes: ProbeTable | None = None


def _table6_page(model: RouteScopeLM, path: str, mtime: float, ablation: Any, described: str) -> None:
    from routescope.app.views import table6  # Streamlit: imported when the page is shown

    table6.show(model, path, mtime, ablation, described)


def _table6_tables(model: RouteScopeLM, path: str, mtime: float, ablation: Any) -> dict[str, Any]:
    from routescope.app.views import table6

    report = table6.default_report(model, path, mtime, ablation)
    return {} if report is None else {"Table 6 report": ("table6", report["report"]),
                                      "Table 6 summary": ("table6_summary", report["summary"])}


def _papaformer_routes(args: Any, model: RouteScopeLM, tokenizer: Any) -> int:
    from routescope.cli import papaformer_routes  # the command's printing, imported when it runs

    return papaformer_routes.run(args, model, tokenizer)


# the paper's Table 6 probes and our held-out ones, read at the last prompt token or by majority
TABLE6_PROBES = ProbeTable(sets=dict(domain.PROBE_SETS), accuracy=domain.probe_accuracy,
                           intended=domain.probe_intended, note=domain.REPORT_NOTE, command=_papaformer_routes)

TOPK_DRAWERS = {"topk_routes": D.topk_choice, "topk_probs": D.topk_matrix, "topk_utilisation": D.utilisation,
                "topk_coselection": D.coselection}

BUILTIN: tuple[FamilySpec, ...] = (
    FamilySpec("llama", llama.LlamaConfig, llama.Llama, llama.llama_param_count,
               A.FamilyAnalysis(views=A.llama_views, export=A.llama_export),
               drawers={"pagmlp_pathways": D.pagmlp_pathways},
               description="Llama-style decoder; PAGMLP's parallel SwiGLU/GEGLU pathways with ffn='pagmlp'"),
    FamilySpec("papaformer", papaformer.PapaformerConfig, papaformer.Papaformer, papaformer.papaformer_param_count,
               A.FamilyAnalysis(views=A.papaformer_views, export=A.papaformer_export,
                                route_reader=A.papaformer_reader),
               drawers={"gumbel_routes": D.gumbel_choice, "cosine_dominance": D.cosine_choice},
               pages=(Page("Table 6", _table6_page, tables=_table6_tables),),  # the paper's routing probes (PaPaformer Table 6)
               probes=TABLE6_PROBES,
               description="PaPaformer: parallel paths between full layers, Share-Linear or Gumbel combiners"),
    FamilySpec("pgpt", pgpt.PGPTConfig, pgpt.PGPT, pgpt.pgpt_param_count,
               A.FamilyAnalysis(views=A.pgpt_views, export=A.pgpt_export), drawers={"pgpt_paths": D.pgpt_paths},
               description="ParallelGPT: P paths mixed by learned weights"),
    FamilySpec("lgpt", pgpt.ShrinkGPTConfig, pgpt.ShrinkGPT, pgpt.shrink_gpt_param_count,
               description="ParallelGPT's LinearGPT: width halved every few layers"),
    FamilySpec("cgpt", pgpt.CGPTConfig, pgpt.ShrinkGPT, pgpt.shrink_gpt_param_count,
               description="ParallelGPT's ConvGPT: width halved by convolutions"),
    FamilySpec("moep", moep.MoEPConfig, moep.MoEP, moep.moep_param_count,
               A.FamilyAnalysis(views=A.topk_views, export=A.topk_export, route_reader=A.topk_reader(A.moep_description)),
               drawers=TOPK_DRAWERS, description="MoEP: top-k routing across parallel blocks, MoE shrink/grow"),
    FamilySpec("wiola", wiola.WiolaConfig, wiola.Wiola, wiola.wiola_param_count,
               A.FamilyAnalysis(views=A.wiola_views, export=A.wiola_export, second_pass=A.wiola_merge_pass),
               drawers={"dsff_gate": D.dsff_gate, "gcla_beta": D.gcla_beta, "atm_merges": D.atm_merges},
               description="Wiola: SRPE, GCLA, ATM, DSFF, WiolaRMSNorm"),
    # Hugging Face transformers models (config.label = their model_type), instrumented, not re-implemented
    FamilySpec("hf", hf.HFConfig, hf.HFModel, hf.hf_param_count,
               A.FamilyAnalysis(views=A.topk_views, export=A.topk_export, route_reader=A.topk_reader(A.hf_description)),
               drawers=TOPK_DRAWERS, description="transformers MoE models, routed as transformers routes them"),
)

_SPECS: dict[str, FamilySpec] = {s.name: s for s in BUILTIN}
_BROKEN: dict[str, str] = {}  # entry point -> why it did not load
_lock = threading.Lock()
_plugins_loaded = False


def _load_plugins() -> None:
    """Every `routescope.families` entry point, once per process. A plugin that fails to load is
    remembered with its reason (said when its family is asked for), never a traceback; a plugin
    cannot replace a built-in family."""
    global _plugins_loaded
    with _lock:
        if _plugins_loaded:
            return
        for ep in metadata.entry_points(group=ENTRY_POINTS):
            if ep.name in _SPECS:
                continue
            try:
                obj = ep.load()
                spec = obj if isinstance(obj, FamilySpec) else obj()
                if not isinstance(spec, FamilySpec) or spec.name != ep.name:
                    raise TypeError(f"expected a FamilySpec named {ep.name!r}, got {short_repr(spec)}")
            except Exception as e:  # a broken plugin must not take the app or CLI down
                _BROKEN[ep.name] = f"{ep.value}: {type(e).__name__}: {str(e)[:200]}"
                continue
            _SPECS[spec.name] = spec
        _plugins_loaded = True


def names() -> list[str]:
    """Every family: built-in ones, then plugins."""
    _load_plugins()
    return list(_SPECS)


def specs() -> list[FamilySpec]:
    _load_plugins()
    return list(_SPECS.values())


def spec(family: Any) -> FamilySpec:
    """The spec of `family`; ConfigError in one line naming the known families (and why a plugin
    of that name did not load)."""
    if isinstance(family, str) and family in _SPECS:
        return _SPECS[family]
    _load_plugins()
    if isinstance(family, str) and family in _SPECS:
        return _SPECS[family]
    if isinstance(family, str) and family in _BROKEN:
        raise ConfigError(f"family {family!r}: its plugin did not load ({_BROKEN[family]})")
    what = "unknown" if isinstance(family, str) else f"expected a string, got {json_kind(family)}"
    raise ConfigError(f"family = {short_repr(family)}: {what}; known families: {', '.join(_SPECS)}")


def spec_of(model: RouteScopeLM) -> FamilySpec:
    return spec(model.config.family)


def register(family: FamilySpec) -> None:
    """Add a family in-process (as an entry point would); a built-in family is never replaced."""
    if family.name in {s.name for s in BUILTIN}:
        raise ValueError(f"family {family.name!r} is built in")
    _SPECS[family.name] = family


def unregister(name: str) -> None:
    if name not in {s.name for s in BUILTIN}:
        _SPECS.pop(name, None)


def pages(model: RouteScopeLM) -> tuple[Page, ...]:
    """The app pages of the model's family that apply to it."""
    return tuple(p for p in spec_of(model).pages if p.applies(model))


def presets() -> dict[str, tuple[str, Mapping[str, Any]]]:
    """Presets that families declare in their specs: preset name -> (family, fields)."""
    return {name: (s.name, fields) for s in specs() for name, fields in s.presets.items()}


__all__ = ["FamilySpec", "Page", "ProbeTable", "names", "pages", "presets", "register", "spec", "spec_of", "specs", "unregister"]
