"""What analysis knows per family, in one table: `FAMILIES[config.family]` gives the routing views
the app draws and the rows a traced call adds to the export table.

Everything else about a family comes from its model: routing layers, their option labels and
whether forcing means anything (`core_models.sites.RoutingLayer`), its label (`config.label`), its
per-call options (`model.run_options()`). A family without an entry here gets `GENERIC`, built from
the `<layer>.option_weights` site of each routing layer (`analysis.routing.option_weights`), so a
new routed family needs no analysis code to be explored and exported.

Export rows per family (what `value` means for each `kind`: `columns.KINDS`):
- PaPaformer Gumbel: "prob" per candidate (selected = the recorded choice), "cosine" per path.
- PaPaformer Share-Linear: "cosine" per path (selected = dominant). With fused_grow the last
  layer's cosine is undefined and the layer is skipped (noted in `df.attrs["notes"]`).
- MoEP: "prob" per option of moe_shrink, parallel.{i}, moe_grow (selected = in the top-k), and
  "weight" per selected option.
- ParallelGPT: "weight" per path (per call), "contribution" per token and path.
- Wiola: "gate_mean" per token and DSFF layer, "beta" per GCLA block (per call), and with ATM on
  "adjacent_cos" and "merge" per token and ATM layer.
- PAGMLP (llama with ffn pagmlp): "alpha"/"beta" per layer (per call), "norm" and "contribution"
  per token and pathway.
- Generic: "weight" per token and option of every layer recording its option weights (selected =
  the largest).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
import torch

from core_models.base import RouteScopeLM
from core_models.runtime import Ablation, Trace, tracing
from core_models.sites import site_name

from . import columns as C
from . import routing as R


@dataclass(frozen=True)
class RoutingViews:
    """The analysis frames of one traced run that the app draws (None: not this model's). Every
    frame is a long table of `analysis.routing`; read-only, as one run may serve many sessions."""

    options: pd.DataFrame | None = None  # R.option_weights: any routing layer's option weights
    gumbel: pd.DataFrame | None = None  # R.gumbel_routes
    cosine: pd.DataFrame | None = None  # R.cosine_dominance (notes in .attrs["notes"])
    topk: pd.DataFrame | None = None  # R.topk_routes
    utilisation: pd.DataFrame | None = None  # R.topk_utilisation
    coselection: pd.DataFrame | None = None  # R.topk_coselection
    pgpt: pd.DataFrame | None = None  # R.pgpt_paths
    dsff: pd.DataFrame | None = None  # R.dsff_gates
    gcla: pd.DataFrame | None = None  # R.gcla_betas
    atm: pd.DataFrame | None = None  # R.atm_merges of the merge pass
    atm_summary: pd.DataFrame | None = None  # R.atm_summary of the merge pass
    atm_tau: float | None = None  # the threshold the merge pass used
    pagmlp: pd.DataFrame | None = None  # R.pagmlp_pathways

    def frames(self) -> dict[str, pd.DataFrame]:
        """The views this run has, by field name."""
        return {f.name: v for f in dataclasses.fields(self) if isinstance(v := getattr(self, f.name), pd.DataFrame)}


Views = Callable[..., RoutingViews]  # (trace, model, *, second: Trace | None, options: Mapping) -> RoutingViews
Export = Callable[[Trace, RouteScopeLM, int, RoutingViews], "tuple[list[pd.DataFrame], list[str]]"]
SecondPass = Callable[[RouteScopeLM, list[int], Ablation, Mapping[str, Any]], Trace]


@dataclass(frozen=True)
class FamilyAnalysis:
    """How analysis handles one family. `second_pass`: a forward besides generation whose trace
    the views need (Wiola: merge maps come from a pass with token merging on, which generation's
    KV cache cannot run)."""

    views: Views
    export: Export
    second_pass: SecondPass | None = None


# --- rows of the export table -------------------------------------------------------------------

def export_rows(df: pd.DataFrame, *, layer: str | None = None, site: Any, kind: str, value: Any,
                option: Any = C.OPTION, selected: Any = None, per_token: bool = True) -> pd.DataFrame:
    """Reshape an analysis frame into export columns (batch, position, layer, site, kind, option,
    value, selected); `analysis.table.routing_table` adds the rest. Column names or
    arrays/scalars are accepted."""
    def get(v: Any) -> Any:
        if isinstance(v, str) and v in df.columns:
            return df[v].to_numpy()
        return v.to_numpy() if isinstance(v, pd.Series) else v  # never align on a filtered index

    n = len(df)
    return pd.DataFrame({
        C.BATCH: df[C.BATCH].to_numpy() if C.BATCH in df.columns else np.zeros(n, dtype=int),
        C.POSITION: df[C.POSITION].to_numpy() if per_token else np.full(n, -1),
        C.LAYER: df[C.LAYER].to_numpy() if layer is None else layer,
        C.SITE: get(site), C.KIND: kind, C.OPTION: get(option), C.VALUE: get(value),
        C.SELECTED: get(selected) if selected is not None else pd.NA,
    }, index=range(n))


def per_call_rows(rows: list[tuple[str, str, str, int | None, float]], n_batch: int) -> pd.DataFrame:
    """Per-call values (layer, site, kind, option, value), repeated for every batch row."""
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows * n_batch, columns=[C.LAYER, C.SITE, C.KIND, C.OPTION, C.VALUE])
    df[C.BATCH] = np.repeat(np.arange(n_batch), len(rows))
    df[C.POSITION] = -1
    df[C.SELECTED] = pd.NA
    return df


def _sites(layers: pd.Series, *parts: Any) -> pd.Series:
    """site_name(layer, *parts) for a column of layers (parts may be Series of the same length)."""
    out = layers.astype(str)
    for p in parts:
        out = out + "." + (p.astype(str) if isinstance(p, pd.Series) else str(p))
    return out


# --- generic: any routing layer's option weights --------------------------------------------------

def _generic_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RoutingViews:
    w = R.option_weights(trace, model)
    return RoutingViews(options=w if len(w) else None)


def _generic_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RoutingViews):
    w = views.options
    if w is None:
        return [], [f"{model.config.label} records no option weights of its routing layers to export"
                    if model.routing_modules else f"{model.config.label} has no routing layers to export"]
    return [export_rows(w, site=_sites(w[C.LAYER], "option_weights"), kind="weight", value=C.WEIGHT,
                        selected=C.SELECTED)], []


GENERIC = FamilyAnalysis(views=_generic_views, export=_generic_export)


# --- PaPaformer ---------------------------------------------------------------------------------

def _papaformer_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RoutingViews:
    gumbel = R.gumbel_routes(trace, model) if any(m.stochastic for m in model.routing_modules.values()) else None
    return RoutingViews(cosine=R.cosine_dominance(trace), gumbel=gumbel)


def _papaformer_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RoutingViews):
    parts = []
    if views.gumbel is not None:
        g = views.gumbel
        parts.append(export_rows(g, site=_sites(g[C.LAYER], "router", "probs"), kind="prob", value=C.PROB,
                                 selected=C.SELECTED))
    cos = views.cosine
    notes = list(cos.attrs.get("notes", []))
    cos = cos[cos[C.COSINE].notna()]
    parts.append(export_rows(cos, site=_sites(cos[C.LAYER], "paths", cos[C.OPTION], "out"), kind="cosine",
                             value=C.COSINE, selected=C.DOMINANT))
    return parts, notes


# --- MoEP ---------------------------------------------------------------------------------------

def _moep_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RoutingViews:
    return RoutingViews(topk=R.topk_routes(trace), utilisation=R.topk_utilisation(trace),
                        coselection=R.topk_coselection(trace))


def _moep_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RoutingViews):
    parts = []
    for layer in R.topk_layers(trace):
        probs = trace[site_name(layer, "router", "probs")].float()  # (B, T, n)
        idx = trace[site_name(layer, "router", "indices")]  # (B, T, k)
        sel = np.zeros(probs.shape, dtype=bool)
        np.put_along_axis(sel, idx.numpy(), True, axis=-1)
        B, T, n = probs.shape
        b, t, o = R.grid_indices(B, T, n)
        df = pd.DataFrame({C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.OPTION: o,
                           C.PROB: probs.numpy().ravel(), C.SELECTED: sel.ravel()})
        parts.append(export_rows(df, site=site_name(layer, "router", "probs"), kind="prob", value=C.PROB,
                                 selected=C.SELECTED))
    w = views.topk
    parts.append(export_rows(w, site=_sites(w[C.LAYER], "router", "weights"), kind="weight", value=C.WEIGHT,
                             selected=True))
    return parts, []


# --- ParallelGPT --------------------------------------------------------------------------------

def _pgpt_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RoutingViews:
    return RoutingViews(pgpt=R.pgpt_paths(trace))


def _pgpt_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RoutingViews):
    p = views.pgpt
    (layer,) = model.routing_modules  # the paths
    parts = [export_rows(p, site=_sites(p[C.LAYER], p[C.OPTION], "out"), kind="contribution", value=C.SHARE,
                         selected=C.DOMINANT)]
    weights = site_name("mixer", "weights")
    w = trace[weights].float().tolist()
    parts.append(per_call_rows([(layer, weights, "weight", j, x) for j, x in enumerate(w)], n_batch))
    return parts, []


# --- Wiola --------------------------------------------------------------------------------------

def _wiola_merge_pass(model: RouteScopeLM, ids: list[int], ablation: Ablation, options: Mapping[str, Any]) -> Trace:
    """A forward of the whole sequence with token merging on, tracing the ATM sites only."""
    from core_models.wiola import ATM

    sites = [n for n in model.site_names() if ".atm." in n]
    with tracing(sites) as tr:
        model(torch.tensor([ids]), ablation=ablation, **{**options, ATM: True})
    return tr


def _wiola_views(trace: Trace, model: RouteScopeLM, *, second: Trace | None = None,
                 options: Mapping[str, Any] = {}) -> RoutingViews:
    from core_models.wiola import ATM_TAU

    tau = options.get(ATM_TAU)
    atm = dict(atm=R.atm_merges(second, tau=tau), atm_summary=R.atm_summary(second, tau=tau),
               atm_tau=model.config.atm_tau if tau is None else tau) if second is not None else {}
    return RoutingViews(dsff=R.dsff_gates(trace), gcla=R.gcla_betas(trace), **atm)


def _wiola_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RoutingViews):
    g = views.dsff
    site = _sites(g[C.LAYER], "gate")
    a = g[C.GATE_MEAN].to_numpy()
    parts = [export_rows(g, site=site, kind="gate_mean", option=0, value=a, selected=a >= 0.5),
             export_rows(g, site=site, kind="gate_mean", option=1, value=1.0 - a, selected=a < 0.5)]
    betas = views.gcla
    parts.append(per_call_rows([(layer, site_name(layer, "gcla_beta"), "beta", None, b)
                                for layer, b in zip(betas[C.LAYER], betas[C.BETA])], n_batch))
    atm = R.atm_merges(trace)  # rows only when this call merged tokens
    if len(atm):
        cos = atm[atm[C.ADJACENT_COS].notna()]
        parts.append(export_rows(cos, site=_sites(cos[C.LAYER], "adjacent_cos"), kind="adjacent_cos", option=None,
                                 value=C.ADJACENT_COS))
        parts.append(export_rows(atm, site=_sites(atm[C.LAYER], "merge_map"), kind="merge", option=None,
                                 value=atm[C.GROUP].astype(float).to_numpy(), selected=C.MERGED))
    return parts, []


# --- Llama (PAGMLP) ----------------------------------------------------------------------------

def _llama_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RoutingViews:
    p = R.pagmlp_pathways(trace, model)
    return RoutingViews(pagmlp=p if len(p) else None)


def _llama_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RoutingViews):
    p = views.pagmlp
    if p is None:
        return [], [f"{model.config.label} has no routing layers to export"]
    site = _sites(p[C.LAYER], p[C.LABEL] + "_out")
    share = p[C.SHARE].to_numpy()
    dominant = share >= np.repeat(share.reshape(-1, 2).max(1), 2)
    parts = [export_rows(p, site=site, kind="norm", value=C.OUT_NORM),
             export_rows(p, site=site, kind="contribution", value=share, selected=dominant)]
    per_call = []
    for layer in dict.fromkeys(p[C.LAYER]):
        per_call += [(layer, site_name(layer, "alpha"), "alpha", 0, float(trace[site_name(layer, "alpha")])),
                     (layer, site_name(layer, "beta"), "beta", 1, float(trace[site_name(layer, "beta")]))]
    parts.append(per_call_rows(per_call, n_batch))
    return parts, []


# config.family -> its analysis; families not listed get GENERIC
FAMILIES: dict[str, FamilyAnalysis] = {
    "papaformer": FamilyAnalysis(views=_papaformer_views, export=_papaformer_export),
    "moep": FamilyAnalysis(views=_moep_views, export=_moep_export),
    "pgpt": FamilyAnalysis(views=_pgpt_views, export=_pgpt_export),
    "wiola": FamilyAnalysis(views=_wiola_views, export=_wiola_export, second_pass=_wiola_merge_pass),
    "llama": FamilyAnalysis(views=_llama_views, export=_llama_export),
}


def family_analysis(model: RouteScopeLM) -> FamilyAnalysis:
    return FAMILIES.get(model.config.family, GENERIC)


def routing_views(trace: Trace, model: RouteScopeLM, *, second: Trace | None = None,
                  options: Mapping[str, Any] = {}) -> RoutingViews:
    """The views the app draws for this model's traced call (`second`: the family's second pass)."""
    return family_analysis(model).views(trace, model, second=second, options=options)
