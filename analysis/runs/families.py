"""The analysis half of each family's spec (`routescope.families.FamilySpec.analysis`): the routing
views of a traced run (name -> `View`: a tidy frame; the app's Routing and Export views loop over
them), the rows a traced call adds to the export table, the family's per-token routes
(`route_reader`: the report, probe routes, corpus statistics) and a second pass where its views need one.
Code elsewhere asks the model's spec (`family_analysis(model)`), never compares family names.

Everything else about a family comes from its model: routing layers, their roles, option labels and
whether forcing means anything (`core_models.sites.RoutingLayer`), its label (`config.label`), its
per-call options (`model.run_options()`). A family whose spec gives no analysis gets `GENERIC`, built
from the OPTION_WEIGHTS role of each routing layer (`analysis.runs.routing.option_weights`), so a new
routed family needs no analysis code to be explored and exported.

Export rows per family (what `value` means for each `kind`: `columns.KINDS`):
- PaPaformer Gumbel: "prob" per candidate (selected = the recorded choice), "cosine" per path.
- PaPaformer Share-Linear: "cosine" per path (selected = dominant). With fused_grow the last
  layer's cosine is undefined and the layer is skipped (noted in `df.attrs["notes"]`).
- MoEP: "prob" per option of moe_shrink, parallel.{i}, moe_grow (selected = in the top-k), and
  "weight" per selected option.
- Hugging Face MoE (family "hf", label = model_type): as MoEP for every router
  (`model.layers.i.mlp.gate`), "prob" only where the router computes probabilities (not gpt-oss).
- ParallelGPT: "weight" per path (per call), "contribution" per token and path.
- Wiola: "gate_mean" per token and DSFF layer, "beta" per GCLA block (per call), and with ATM on
  "adjacent_cos" and "merge" per token and ATM layer.
- PAGMLP (llama with ffn pagmlp): "alpha"/"beta" per layer (per call), "norm" and "contribution"
  per token and pathway.
- Generic: "weight" per token and option of every layer recording its option weights (selected =
  the largest).
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
import torch

from routescope.core_models.ablation import Ablation
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.sites import (ADJACENT_COS, BLEND, CHOICE, COMBINED, GATE, INDICES, MERGE_MAP,
                                          OPTION_WEIGHTS, PATH_SCALES, PATH_WEIGHTS, PATHS, PROBS, WEIGHTS)
from routescope.core_models.trace import Trace, tracing
from routescope.core_models.wiola import ATM, ATM_CAUSAL, ATM_TAU

from routescope.analysis.export import columns as C
from routescope.analysis.runs import routing as R


@dataclass(frozen=True)
class View:
    """One named view of a traced run: a tidy frame (a long table of `analysis.runs.routing`) and its kind,
    which names the common drawer that draws it (`routescope.rendering.drawers.DRAWERS`) unless
    the family's spec has a drawer for the view's name.
    `params`: what the drawer needs besides the frame (e.g. the ATM threshold used). Read-only: one
    run may serve many browser sessions. Notes about the frame are in `frame.attrs["notes"]`."""

    frame: pd.DataFrame
    drawer: str
    params: Mapping[str, Any] = field(default_factory=dict)


FAMILY = "family"  # the kind of a view that its family's spec draws (`FamilySpec.drawers`)
RunViews = Mapping[str, View]  # view name -> view, in the order the app shows them


def views_of(*named: tuple[str, pd.DataFrame | None, str] | tuple[str, pd.DataFrame | None, str, Mapping]) -> RunViews:
    """The views of a run from (name, frame, drawer[, params]); frames that are None are left out."""
    out = {}
    for name, frame, drawer, *params in named:
        if frame is not None:
            out[name] = View(frame, drawer, MappingProxyType(dict(params[0])) if params else MappingProxyType({}))
    return MappingProxyType(out)


@dataclass(frozen=True)
class RouteReader:
    """How a family's per-token routes are read (the report, probe routes and corpus statistics):
    its routing layers in forward order, the label of each 1-based route r (= option r - 1), the
    sites to trace, and `routes(trace)` -> (L, B, T) 1-based routes, 0 where undefined (a probe's
    expected path r = route r, where the family's spec declares probes). `topk(trace)`, for
    families whose layers pick several options per token: (L, B, T, k) 1-based picks best first,
    0 where undefined or where a layer picks fewer than k (its `sites` are among `sites`).
    `routed`: per layer, how many of its options (the first ones) its router picks among; later
    ones run for every token (a shared expert). None: every option is routed."""

    layers: list[str]
    labels: list[str]
    sites: list[str]
    routes: Callable[[Any], np.ndarray]
    description: str  # for pages: the model and how a route is read
    topk: Callable[[Any], np.ndarray] | None = None
    routed: tuple[int, ...] | None = None
    # (routes, top-k or None) as int64 tensors where the trace holds its records (a GPU corpus traces
    # `on_device` and counts there); None: the reader has numpy only
    tensors: Callable[[Any], tuple[torch.Tensor, torch.Tensor | None]] | None = None


Views = Callable[..., RunViews]  # (trace, model, *, second: Trace | None, options: Mapping) -> RunViews
Export = Callable[[Trace, RouteScopeLM, int, RunViews], "tuple[list[pd.DataFrame], list[str]]"]
SecondPass = Callable[[RouteScopeLM, list[int], Ablation, Mapping[str, Any]], Trace]


@dataclass(frozen=True)
class FamilyAnalysis:
    """How analysis handles one family. `second_pass`: a forward besides generation whose trace
    the views need (Wiola: merge maps come from a pass with token merging on, which generation's
    KV cache cannot run). `route_reader`: the family's per-token routes (None: it has none, e.g.
    pgpt's one learned mix per call)."""

    views: Views
    export: Export
    second_pass: SecondPass | None = None
    route_reader: Callable[[RouteScopeLM], RouteReader] | None = None


# --- rows of the export table -------------------------------------------------------------------

def export_rows(df: pd.DataFrame, *, layer: str | None = None, site: Any, kind: str, value: Any,
                option: Any = C.OPTION, selected: Any = None, per_token: bool = True) -> pd.DataFrame:
    """Reshape an analysis frame into export columns (batch, position, layer, site, kind, option,
    value, selected); `analysis.export.table.routing_table` adds the rest. Column names or
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


def _role_sites(df: pd.DataFrame, model: RouteScopeLM, role: str) -> np.ndarray:
    """The site of `role` (`model.sites_of`) at each row's layer."""
    return df[C.LAYER].map(model.sites_of(role)).to_numpy()


def _option_sites(df: pd.DataFrame, model: RouteScopeLM, role: str) -> np.ndarray:
    """The site of the per-option `role` (`model.option_sites_of`) at each row's layer and option."""
    sites = model.option_sites_of(role)
    return np.array([sites[layer][j] for layer, j in zip(df[C.LAYER], df[C.OPTION])], dtype=object)


# --- generic: any routing layer's option weights --------------------------------------------------

def _generic_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RunViews:
    w = R.option_weights(trace, model)
    return views_of(("options", w if len(w) else None, "option_weights"))


def _generic_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    if "options" not in views:
        return [], [f"{model.config.label} records no option weights of its routing layers to export"
                    if model.routing_modules else f"{model.config.label} has no routing layers to export"]
    w = views["options"].frame
    return [export_rows(w, site=_role_sites(w, model, OPTION_WEIGHTS), kind="weight", value=C.WEIGHT,
                        selected=C.SELECTED)], []


GENERIC = FamilyAnalysis(views=_generic_views, export=_generic_export)


# --- PaPaformer ---------------------------------------------------------------------------------

def papaformer_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RunViews:
    gumbel = R.gumbel_routes(trace, model) if any(m.stochastic for m in model.routing_modules.values()) else None
    cosine = R.cosine_dominance(trace, model)
    return views_of(("gumbel_routes", gumbel, FAMILY), ("cosine_dominance", cosine, FAMILY))


def papaformer_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    parts = []
    if "gumbel_routes" in views:
        g = views["gumbel_routes"].frame
        probs = {name: m.roles[PROBS] for name, m in model.routing_modules.items() if PROBS in m.roles}
        parts.append(export_rows(g, site=g[C.LAYER].map(probs), kind="prob", value=C.PROB, selected=C.SELECTED))
    cos = views["cosine_dominance"].frame
    notes = list(cos.attrs.get("notes", []))
    cos = cos[cos[C.COSINE].notna()]
    parts.append(export_rows(cos, site=_option_sites(cos, model, PATHS), kind="cosine",
                             value=C.COSINE, selected=C.DOMINANT))
    return parts, notes


def papaformer_token_routes(trace: Trace, model: RouteScopeLM) -> np.ndarray:
    """(n_parallel_layers, B, T) 1-based route of every token, 0 where undefined. A layer with a
    router (Gumbel) routes by its recorded choice; a Share-Linear layer by the path whose output has
    the highest cosine with the combined output (undefined where the cosine is: fused grow). Pure."""
    per_layer = []
    cos = None
    for layer in _parallel_layers(model):
        choice = model.routing_modules[layer].roles.get(CHOICE)
        if model.routing_modules[layer].stochastic:
            if choice not in trace:
                raise ValueError(f"the trace has no site {choice!r}")
            per_layer.append(trace[choice].cpu().numpy().astype(np.int64) + 1)
            continue
        cos = R.cosine_dominance(trace, model) if cos is None else cos
        c = cos[cos[C.LAYER] == layer]
        if not len(c):
            raise ValueError(f"the trace has no path/combined outputs for {layer}")
        B, T = int(c[C.BATCH].max()) + 1, int(c[C.POSITION].max()) + 1
        dom = c[c[C.DOMINANT]]
        r = np.zeros((B, T), dtype=np.int64)
        r[dom[C.BATCH].to_numpy(), dom[C.POSITION].to_numpy()] = dom[C.OPTION].to_numpy() + 1
        per_layer.append(r)
    return np.stack(per_layer)


def _parallel_layers(model: RouteScopeLM) -> list[str]:
    return list(model.routing_layers())  # PaPaformer's routing layers are its parallel layers, in order


def _papaformer_route_sites(model: RouteScopeLM) -> list[str]:
    """The sites `papaformer_token_routes` reads (Gumbel: router choices; Share-Linear: path and
    combined outputs)."""
    out = []
    for m in model.routing_modules.values():
        out += [m.roles[CHOICE]] if m.stochastic else [m.roles[COMBINED], *m.option_roles[PATHS]]
    return out


def route_labels(config: Any) -> list[str]:
    """Label of each 1-based route as the PaPaformer paper numbers them (route r = option r - 1):
    index r - 1 -> "route r", the last Gumbel route "combined"."""
    return [f"route {j}" for j in range(1, config.n_paths + 1)] + (["combined"] if config.has_combined_route else [])


def papaformer_reader(model: RouteScopeLM) -> RouteReader:
    cfg = model.config
    return RouteReader(
        _parallel_layers(model), route_labels(cfg), _papaformer_route_sites(model),
        lambda tr: papaformer_token_routes(tr, model),
        f"PaPaformer, combiner <b>{html.escape(cfg.combiner)}</b>, {cfg.n_parallel_layers} parallel layers of "
        f"{cfg.n_paths} paths. A route is the Gumbel router's choice, or Share-Linear's path whose output has "
        "the highest cosine with the combined output (undefined routes left out). Routes are 1-based like "
        "the paper (route r = path r - 1).")


# --- top-k routers: MoEP and Hugging Face MoE (sites from each layer's roles) ----------------------

def topk_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RunViews:
    """The picks per token, each option's utilisation, the layers' load balance and which options
    are picked together; with many options (`R.MANY_OPTIONS`) also every option's probability per
    token (the token x expert matrix that replaces colours)."""
    util = R.topk_utilisation(trace, model)
    return views_of(("topk_routes", R.topk_routes(trace, model), FAMILY),
                    ("topk_probs", R.topk_probs(trace, model) if R.many_options(model) else None, FAMILY),
                    ("topk_utilisation", util, FAMILY),
                    ("topk_balance", R.load_balance(util), "table"),
                    ("topk_coselection", R.topk_coselection(trace, model), FAMILY))


def topk_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    """Rows of top-k routers: "prob" per option where the router computes probabilities (selected =
    in its top-k), "weight" per selected option as the router returned it."""
    parts = []
    layers = R.topk_layers(trace, model)
    for layer, roles in layers.items():
        if roles.get(PROBS) not in trace:  # gpt-oss: the router computes no probabilities over its experts
            continue
        probs = trace[roles[PROBS]].float()  # (B, T, n)
        idx = trace[roles[INDICES]]  # (B, T, k)
        sel = np.zeros(probs.shape, dtype=bool)
        np.put_along_axis(sel, idx.numpy(), True, axis=-1)
        B, T, n = probs.shape
        b, t, o = R.grid_indices(B, T, n)
        df = pd.DataFrame({C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.OPTION: o,
                           C.PROB: probs.numpy().ravel(), C.SELECTED: sel.ravel()})
        parts.append(export_rows(df, site=roles[PROBS], kind="prob", value=C.PROB, selected=C.SELECTED))
    w = views["topk_routes"].frame
    weights = {layer: roles[WEIGHTS] for layer, roles in layers.items()}
    parts.append(export_rows(w, site=w[C.LAYER].map(weights), kind="weight", value=C.WEIGHT, selected=True))
    return parts, []


def topk_reader(describe: Callable[[RouteScopeLM], str]) -> Callable[[RouteScopeLM], RouteReader]:
    """Routes of top-k routing layers: each token's first choice, the option its router gave the
    largest weight (read from the recorded weights: a router may return its picks unsorted, as
    DeepSeek-V3's does), and every pick (`topk`)."""
    def reader(model: RouteScopeLM) -> RouteReader:
        layers = list(model.routing_layers())
        labels = R.option_names(model.option_labels(), layers)
        roles = [model.routing_modules[l].roles for l in layers]

        def first(tr: Any) -> torch.Tensor:  # (L, B, T) where the trace holds its records
            idx, w = [tr[r[INDICES]] for r in roles], [tr[r[WEIGHTS]] for r in roles]
            if len({(i.shape, x.shape) for i, x in zip(idx, w)}) == 1:  # one gather over every layer at once
                return torch.stack(idx).gather(-1, torch.stack(w).float().argmax(-1, keepdim=True))[..., 0].long() + 1
            return torch.stack([i.gather(-1, x.float().argmax(-1, keepdim=True))[..., 0] for i, x in zip(idx, w)]).long() + 1

        def picks(tr: Any) -> torch.Tensor:  # (L, B, T, k): every pick; a layer with a smaller k padded with 0
            idx = [tr[r[INDICES]].long() + 1 for r in roles]
            k = max(i.shape[-1] for i in idx)
            return torch.stack([torch.nn.functional.pad(i, (0, k - i.shape[-1])) for i in idx])

        sites = [r[s] for r in roles for s in (INDICES, WEIGHTS)]
        routed = tuple(model.routing_modules[l].n_routed for l in layers)
        return RouteReader(layers, labels, sites, lambda tr: first(tr).cpu().numpy(), describe(model),
                           topk=lambda tr: picks(tr).cpu().numpy(), routed=routed,
                           tensors=lambda tr: (first(tr), picks(tr)))
    return reader


def moep_description(model: RouteScopeLM) -> str:
    cfg = model.config
    return (f"MoEP, {cfg.expert} experts: moe_shrink and moe_grow pick top-{cfg.expert_top_k} of {cfg.n_experts} "
            f"experts, each of {cfg.n_parallel_layers} parallel layers top-{cfg.top_k} of {cfg.n_blocks} blocks. A "
            "token's route is its router's first choice (the largest weight). Options are numbered from 0 as in "
            "the app and ablation specs.")


def hf_description(model: RouteScopeLM) -> str:
    layers = model.routing_modules
    picks = ", ".join(f"top-{k} of {n} experts" for k, n in sorted({(m.top_k, m.n_experts) for m in layers.values()}))
    return (f"{html.escape(model.config.label)} (Hugging Face transformers): {len(layers)} MoE layers, each router "
            f"picks {picks or 'nothing'}. A token's route is its router's first choice (the largest weight it "
            "returned). Options are numbered from 0 as in the app and ablation specs.")


# --- ParallelGPT --------------------------------------------------------------------------------

def pgpt_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RunViews:
    return views_of(("pgpt_paths", R.pgpt_paths(trace, model), FAMILY))


def pgpt_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    p = views["pgpt_paths"].frame
    parts = [export_rows(p, site=_option_sites(p, model, PATHS), kind="contribution", value=C.SHARE,
                         selected=C.DOMINANT)]
    for layer, weights in model.sites_of(PATH_WEIGHTS).items():
        w = trace[weights].float().tolist()
        parts.append(per_call_rows([(layer, weights, "weight", j, x) for j, x in enumerate(w)], n_batch))
    return parts, []


# --- Wiola --------------------------------------------------------------------------------------

NON_CAUSAL_ATM = ("Token merging here is the paper's ATM, which is not causal: a merged pair's output is copied back "
                  "to its first token, so that position reads the next token (README deviations; atm_causal=True "
                  "merges causally).")


def wiola_merge_pass(model: RouteScopeLM, ids: list[int], ablation: Ablation, options: Mapping[str, Any]) -> Trace:
    """A forward of the whole sequence with token merging on, tracing the ATM sites only."""
    sites = [*model.sites_of(ADJACENT_COS).values(), *model.sites_of(MERGE_MAP).values()]
    with tracing(sites) as tr:
        model(torch.tensor([ids]), ablation=ablation, **{**options, ATM: True})
    return tr


def wiola_views(trace: Trace, model: RouteScopeLM, *, second: Trace | None = None,
                 options: Mapping[str, Any] = {}) -> RunViews:
    tau = options.get(ATM_TAU)
    atm = atm_summary = None
    if second is not None:
        atm, atm_summary = R.atm_merges(second, model, tau=tau), R.atm_summary(second, model, tau=tau)
        atm = atm if len(atm) else None
        causal = options.get(ATM_CAUSAL, model.config.atm_causal)
        if atm is not None and not causal:  # said under the view (the Routing view shows frames' notes)
            atm.attrs["notes"] = [*atm.attrs.get("notes", []), NON_CAUSAL_ATM]
    used = {"tau": model.config.atm_tau if tau is None else tau}
    return views_of(("dsff_gate", R.dsff_gates(trace, model), FAMILY),
                    ("gcla_beta", R.gcla_betas(trace, model), FAMILY),
                    ("atm_merges", atm, FAMILY, used), ("atm_summary", atm_summary, "table", used))


def wiola_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    g = views["dsff_gate"].frame
    site = _role_sites(g, model, GATE)
    a = g[C.GATE_MEAN].to_numpy()
    parts = [export_rows(g, site=site, kind="gate_mean", option=0, value=a, selected=a >= 0.5),
             export_rows(g, site=site, kind="gate_mean", option=1, value=1.0 - a, selected=a < 0.5)]
    betas = views["gcla_beta"].frame
    beta_sites = model.sites_of(BLEND)
    parts.append(per_call_rows([(layer, beta_sites[layer], "beta", None, b)
                                for layer, b in zip(betas[C.LAYER], betas[C.BETA])], n_batch))
    atm = R.atm_merges(trace, model)  # rows only when this call merged tokens
    if len(atm):
        cos = atm[atm[C.ADJACENT_COS].notna()]
        parts.append(export_rows(cos, site=_role_sites(cos, model, ADJACENT_COS), kind="adjacent_cos", option=None,
                                 value=C.ADJACENT_COS))
        parts.append(export_rows(atm, site=_role_sites(atm, model, MERGE_MAP), kind="merge", option=None,
                                 value=atm[C.GROUP].astype(float).to_numpy(), selected=C.MERGED))
    return parts, []


# --- Llama (PAGMLP) ----------------------------------------------------------------------------

def llama_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RunViews:
    p = R.pagmlp_pathways(trace, model)
    return views_of(("pagmlp_pathways", p if len(p) else None, FAMILY))


def llama_export(trace: Trace, model: RouteScopeLM, n_batch: int, views: RunViews):
    if "pagmlp_pathways" not in views:
        return [], [f"{model.config.label} has no routing layers to export"]
    p = views["pagmlp_pathways"].frame
    site = _option_sites(p, model, PATHS)
    share = p[C.SHARE].to_numpy()
    dominant = share >= np.repeat(share.reshape(-1, 2).max(1), 2)
    parts = [export_rows(p, site=site, kind="norm", value=C.OUT_NORM),
             export_rows(p, site=site, kind="contribution", value=share, selected=dominant)]
    per_call = []
    scales = model.option_sites_of(PATH_SCALES)
    for layer in dict.fromkeys(p[C.LAYER]):
        alpha, beta = scales[layer]
        per_call += [(layer, alpha, "alpha", 0, float(trace[alpha])), (layer, beta, "beta", 1, float(trace[beta]))]
    parts.append(per_call_rows(per_call, n_batch))
    return parts, []
