"""The analysis of top-k routers: MoEP (paper Sec. 3: top-k over parallel blocks, MoE shrink/grow)
and every Hugging Face MoE (family "hf"): picks, utilisation, load balance, co-selection and, with
many options, the token x option probability matrix; per-token routes are each router's first
choice. Every site comes from the layers' roles (INDICES, WEIGHTS, LOGITS, PROBS).

Export rows: "prob" per option (selected = in the top-k), only where the router computes
probabilities (not gpt-oss), and "weight" per selected option.
"""
from __future__ import annotations

import functools

import html
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from routescope.core_models.base import RouteScopeLM
from routescope.core_models.sites import INDICES, PROBS, WEIGHTS
from routescope.core_models.trace import Trace

from routescope.analysis.export import columns as C
from routescope.analysis.runs import routing as R
from routescope.analysis.runs.views import FAMILY, FamilyAnalysis, RouteReader, RunViews, export_rows, views_of


def topk_views(trace: Trace, model: RouteScopeLM, **_: Any) -> RunViews:
    """The picks per token, each option's utilisation, the layers' load balance and which options
    are picked together; with many options (`R.MANY_OPTIONS`) also every option's probability per
    token (the token x expert matrix that replaces colours)."""
    util = functools.cache(lambda: R.topk_utilisation(trace, model))  # balance reads it too
    return views_of(("topk_routes", lambda: R.topk_routes(trace, model), FAMILY),
                    ("topk_probs", (lambda: R.topk_probs(trace, model)) if R.many_options(model) else None, FAMILY),
                    ("topk_utilisation", util, FAMILY),
                    ("topk_balance", lambda: R.load_balance(util()), "table"),
                    ("topk_coselection", lambda: R.topk_coselection(trace, model), FAMILY))


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


MOEP = FamilyAnalysis(views=topk_views, export=topk_export, route_reader=topk_reader(moep_description))
HF = FamilyAnalysis(views=topk_views, export=topk_export, route_reader=topk_reader(hf_description))
