"""Routing analyses: pure functions from a `Trace` to long-format DataFrames.

Every function reads the tensors recorded at the sites the model's layers declare for a role
(`core_models.sites.ROLES`, `OPTION_ROLES`; `model.sites_of(role)`), never a site name of its own
making, and returns one row per (batch row, position, layer, option) or coarser, with the column
names of `analysis.export.columns`. So each takes the model; a few also read its weights, and each
says so. No I/O, no globals; randomness only from an explicit seed.

Traces from `core_models.generate.generate` work too: sites with a position axis are concatenated
over the prompt and every generated step, so positions run over prompt + generated tokens.

What each reads, and the families whose layers declare it today: `option_weights` (OPTION_WEIGHTS:
any routing layer; the view of a family without analyses of its own), `gumbel_routes` (LOGITS,
PROBS, CHOICE of stochastic layers: PaPaformer Gumbel), `cosine_dominance` (COMBINED and PATHS:
PaPaformer, MoEP's parallel layers), `topk_*` (INDICES, WEIGHTS, LOGITS, PROBS: MoEP, Hugging Face
MoE), `router_entropy` (PROBS: any), `pgpt_paths` (PATH_WEIGHTS, PATHS: ParallelGPT), `atm_merges` /
`atm_summary` (ADJACENT_COS, MERGE_MAP: Wiola's ATM), `dsff_gates` (GATE: Wiola's DSFF),
`gcla_betas` (BLEND: Wiola's GCLA), `pagmlp_pathways` (PATH_SCALES, PATHS: PAGMLP). Which views a
family shows is its module of `analysis.families`; `analysis.export.run_table.routing_table` turns
them into the one export table.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from routescope.core_models.base import RouteScopeLM
from routescope.core_models.sites import (ADJACENT_COS, BLEND, CHOICE, COMBINED, GATE, INDICES, LOGITS, MERGE_MAP,
                                          OPTION_WEIGHTS, PATH_SCALES, PATH_WEIGHTS, PATHS, PROBS, WEIGHTS)
from routescope.core_models.trace import Trace

from routescope.analysis.export import columns as C


# --- helpers ----------------------------------------------------------------------------------

def grid_indices(*sizes: int) -> list[np.ndarray]:
    """Flattened index arrays of a C-ordered grid: grid_indices(B, T, n) -> [b, t, o], each of B*T*n."""
    if not sizes:
        return []
    return [a.ravel() for a in np.meshgrid(*(np.arange(s) for s in sizes), indexing="ij")]


def site(trace: Trace, name: str) -> torch.Tensor:
    """trace[name], or a ValueError saying which site is missing."""
    if name not in trace:
        raise ValueError(f"the trace has no site {name!r}; run the model inside core_models.tracing() "
                         f"(all sites) to record it")
    return trace[name]


def recorded(trace: Trace, sites: dict[str, str]) -> dict[str, str]:
    """The (layer -> site) entries of `sites` (a `model.sites_of(role)`) whose site the trace recorded."""
    return {layer: name for layer, name in sites.items() if name in trace}


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy() if x.is_floating_point() else x.detach().cpu().numpy()


def gumbel_noise(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Standard Gumbel samples -log(-log(u)), u ~ U(0, 1) from `generator`."""
    u = torch.rand(shape, generator=generator, dtype=torch.float32).clamp_(1e-10, 1.0 - 1e-7)
    return -torch.log(-torch.log(u))


# --- PaPaformer Gumbel routers ----------------------------------------------------------------

def gumbel_routes(trace: Trace, model: RouteScopeLM, *, n_samples: int = 0, seed: int = 0) -> pd.DataFrame:
    """Per batch row, position, parallel layer and candidate: router logit, noise-free probability,
    whether it is the noise-free argmax, whether the call used it (recorded choice: differs from
    the argmax under sampled or forced routing) and, with n_samples > 0, routing stability: the
    fraction of `n_samples` Gumbel samples (logits + Gumbel noise, torch.Generator seeded with
    `seed`, layers drawn in order) whose argmax equals the noise-free argmax (NaN when
    n_samples = 0). Takes the model for its routing layers and option labels."""
    layers = {name: m for name, m in model.routing_modules.items() if m.stochastic}
    if not layers:
        raise ValueError(f"gumbel_routes needs a model with Gumbel routers; {model.config.label} has none")
    if n_samples < 0:
        raise ValueError(f"n_samples = {n_samples}: must be >= 0")
    gen = torch.Generator().manual_seed(seed)
    frames = []
    for layer, m in layers.items():
        labels = np.array(m.option_labels())
        roles = m.roles
        logits = site(trace, roles[LOGITS]).float()  # (B, T, n)
        probs = site(trace, roles[PROBS]).float()
        B, T, n = logits.shape
        arg = logits.argmax(-1)  # (B, T)
        choice = trace[roles[CHOICE]] if roles[CHOICE] in trace else arg
        if n_samples:
            noisy = logits.unsqueeze(0) + gumbel_noise((n_samples, B, T, n), gen)
            stab = (noisy.argmax(-1) == arg).float().mean(0)  # (B, T)
        else:
            stab = torch.full((B, T), float("nan"))
        b, t, o = grid_indices(B, T, n)
        frames.append(pd.DataFrame({
            C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.OPTION: o, C.LABEL: labels[o],
            C.LOGIT: _np(logits).ravel(), C.PROB: _np(probs).ravel(),
            C.ARGMAX: (_np(arg)[b, t] == o), C.SELECTED: (_np(choice)[b, t] == o),
            C.STABILITY: _np(stab)[b, t], C.N_SAMPLES: n_samples,
        }))
    return pd.concat(frames, ignore_index=True)


# --- any routing layer: its option weights -----------------------------------------------------

def option_names(labels: dict[str, list[str]], layers: Sequence[str] | None = None,
                 n: int | None = None) -> list[str]:
    """Label of option j over `layers` (default: every layer in `labels`, as
    `RouteScopeLM.option_labels()` gives them): the layers' own label where they agree ("path 0"),
    else every distinct one ("expert 0 / block 0"); j < n (default: the most options of any layer)."""
    layers = list(labels) if layers is None else layers
    n = max((len(labels[l]) for l in layers), default=1) if n is None else n
    return [" / ".join(dict.fromkeys(labels[l][j] for l in layers if j < len(labels[l]))) for j in range(n)]


def option_weights(trace: Trace, model: RouteScopeLM) -> pd.DataFrame:
    """Per batch row, position, routing layer that records `<layer>.option_weights` ([batch, pos,
    n_options], core_models.sites.OPTION_WEIGHTS) and option: its label, its weight in the call, and
    whether it is the layer's largest weight for that token (first on ties). The analysis of a
    family that has none of its own; layers without the site have no rows."""
    frames = []
    for layer, m in model.routing_modules.items():
        name = m.roles.get(OPTION_WEIGHTS)
        if name not in trace:
            continue
        w = trace[name].float()  # (B, T, n)
        B, T, n = w.shape
        top = F.one_hot(w.argmax(-1), n).bool()  # (B, T, n)
        b, t, o = grid_indices(B, T, n)
        frames.append(pd.DataFrame({C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.OPTION: o,
                                    C.LABEL: np.array(m.option_labels())[o], C.WEIGHT: _np(w).ravel(),
                                    C.SELECTED: _np(top).ravel()}))
    return _concat(frames, [C.BATCH, C.POSITION, C.LAYER, C.OPTION, C.LABEL, C.WEIGHT, C.SELECTED])


# --- top-k routers (MoEP, Hugging Face MoE) ----------------------------------------------------
# A top-k routing layer declares the sites of its routing roles (`RoutingLayer.roles`): INDICES and
# WEIGHTS of its picks, LOGITS, and PROBS where its router computes probabilities. MoEP's sit under
# its router (`moe_shrink.router.indices`), a transformers router's on itself
# (`model.layers.3.mlp.gate.indices`); these functions only ask the layer.

def topk_layers(trace: Trace, model: RouteScopeLM) -> dict[str, dict[str, str]]:
    """Routing layers whose top-k picks the trace recorded -> their role sites, in module order."""
    return {name: m.roles for name, m in model.routing_modules.items()
            if INDICES in m.roles and m.roles[INDICES] in trace}


def unavailable_notes(model: RouteScopeLM, layers: Sequence[str], role: str, what: str) -> list[str]:
    """One note per distinct reason why `layers` record no `role` site (the model type's record, e.g.
    gpt-oss computes no router probabilities), each naming how many layers it covers and `what` the
    view shows instead; [] where every layer records it."""
    why: dict[str, list[str]] = {}
    for layer in layers:
        reason = (getattr(model.routing_modules[layer], "unavailable", None) or {}).get(role)
        if reason:
            why.setdefault(reason, []).append(layer)
    return [f"{what} in {len(names)} layer{'s' * (len(names) > 1)} ({names[0]}{', ...' * (len(names) > 1)}): "
            f"{model.config.label} {reason}" for reason, names in why.items()]


def topk_routes(trace: Trace, model: RouteScopeLM) -> pd.DataFrame:
    """Per batch row, position and top-k routing layer, the selected options in the order the
    router returned them: rank (0 = the largest weight, the first choice), option, weight as the
    router returned it and router probability (NaN where the router computes none)."""
    frames = []
    for layer, roles in topk_layers(trace, model).items():
        idx = trace[roles[INDICES]]  # (B, T, k)
        w = trace[roles[WEIGHTS]].float()  # (B, T, k)
        B, T, k = idx.shape
        probs = roles.get(PROBS)
        prob = _np(trace[probs].float().gather(-1, idx)).ravel() if probs in trace else np.full(B * T * k, np.nan)
        b, t, _ = grid_indices(B, T, k)
        # rank by weight: a router may return its choices unsorted (DeepSeek-V3's topk(sorted=False))
        rank = torch.argsort(torch.argsort(-w, dim=-1, stable=True), dim=-1)
        frames.append(pd.DataFrame({
            C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.RANK: _np(rank).ravel(), C.OPTION: _np(idx).ravel(),
            C.WEIGHT: _np(w).ravel(), C.PROB: prob,
        }))
    df = _concat(frames, [C.BATCH, C.POSITION, C.LAYER, C.RANK, C.OPTION, C.WEIGHT, C.PROB])
    df.attrs["notes"] = unavailable_notes(model, list(topk_layers(trace, model)), PROBS, "No router probability")
    return df


def topk_utilisation(trace: Trace, model: RouteScopeLM) -> pd.DataFrame:
    """Per top-k layer and option: tokens that selected it, tokens routed, and the share of tokens
    selecting it (shares of a layer sum to k)."""
    frames = []
    for layer, roles in topk_layers(trace, model).items():
        idx = trace[roles[INDICES]]
        n = trace[roles[LOGITS]].shape[-1]
        n_tok = idx.shape[0] * idx.shape[1]
        counts = _np(torch.bincount(idx.flatten(), minlength=n)).astype(np.int64)
        frames.append(pd.DataFrame({C.LAYER: layer, C.OPTION: np.arange(n), C.COUNT: counts, C.N_TOKENS: n_tok,
                                    C.SHARE: counts / n_tok}))
    return _concat(frames, [C.LAYER, C.OPTION, C.COUNT, C.N_TOKENS, C.SHARE])


def topk_coselection(trace: Trace, model: RouteScopeLM) -> pd.DataFrame:
    """Per top-k layer and option pair (a < b): how many tokens selected both together."""
    frames = []
    for layer, roles in topk_layers(trace, model).items():
        idx = trace[roles[INDICES]]
        n = trace[roles[LOGITS]].shape[-1]
        sel = F.one_hot(idx, n).sum(-2).flatten(0, 1).clamp(max=1).float()  # (N, n) 0/1
        both = sel.T @ sel  # (n, n) tokens selecting both (exact: counts below 2^24)
        a, b = torch.triu_indices(n, n, offset=1)  # every pair a < b, in itertools.combinations' order
        frames.append(pd.DataFrame({C.LAYER: layer, C.OPTION_A: _np(a), C.OPTION_B: _np(b),
                                    C.COUNT: _np(both[a, b]).astype(np.int64)}))
    return _concat(frames, [C.LAYER, C.OPTION_A, C.OPTION_B, C.COUNT])


# Beyond this many options a layer's options are told apart by their place on an axis, not by colour
# (24 colours repeat, and a 64- or 128-entry legend overlaps itself); the seed families' 2 to 4 paths
# keep their categorical colours.
MANY_OPTIONS = 12
# a top-k layer's option is dead below DEAD_FRACTION of the uniform share k/n, overloaded above
# OVERLOAD_FACTOR times it (as the corpus view flags them: analysis.corpus.stats); a single run calls
DEAD_FRACTION, OVERLOAD_FACTOR, DEAD_PER_OPTION = 0.01, 2.0, 5  # none dead under 5 selections per option:
TOO_FEW_FOR_DEAD = "too few tokens to call an expert dead"  # 33 tokens x top-8 cannot reach 128 experts


def many_options(model: RouteScopeLM) -> bool:
    """Whether some routing layer has more options than colours can tell apart."""
    return any(m.n_options > MANY_OPTIONS for m in model.routing_modules.values())


def topk_probs(trace: Trace, model: RouteScopeLM) -> pd.DataFrame:
    """Per batch row, position, top-k layer and option: the router's probability (its returned weight
    where it computes no probabilities, 0 for options it did not pick), whether the option is among
    the picks and its rank (-1 where not picked). The token x option matrix of a many-expert layer."""
    frames = []
    for layer, roles in topk_layers(trace, model).items():
        idx = trace[roles[INDICES]]  # (B, T, k)
        w = trace[roles[WEIGHTS]].float()
        n = trace[roles[LOGITS]].shape[-1]
        B, T, k = idx.shape
        if roles.get(PROBS) in trace:
            p = trace[roles[PROBS]].float()  # (B, T, n)
        else:
            p = torch.zeros(B, T, n).scatter_(-1, idx, w)
        rank_of = torch.full((B, T, n), -1, dtype=torch.long)
        ranks = torch.argsort(torch.argsort(-w, dim=-1, stable=True), dim=-1)  # by weight, as topk_routes
        rank_of.scatter_(-1, idx, ranks)
        b, t, o = grid_indices(B, T, n)
        frames.append(pd.DataFrame({C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.OPTION: o, C.PROB: _np(p).ravel(),
                                    C.SELECTED: _np(rank_of >= 0).ravel(), C.RANK: _np(rank_of).ravel()}))
    df = _concat(frames, [C.BATCH, C.POSITION, C.LAYER, C.OPTION, C.PROB, C.SELECTED, C.RANK])
    df.attrs["notes"] = unavailable_notes(model, list(topk_layers(trace, model)), PROBS,
                                          "The router's returned weights, not probabilities,")
    return df


BALANCE_COLUMNS = ["layer", "options", "tokens", "max_over_mean", "cv", "entropy", "dead", "overloaded"]


def load_balance(util: pd.DataFrame, k: dict[str, int] | None = None) -> pd.DataFrame:
    """Per layer of a utilisation frame (`topk_utilisation`: layer, option, count): how evenly its
    options are used. max_over_mean: the busiest option's count over the mean count (1 = even);
    cv: the counts' coefficient of variation (population std / mean); entropy: the entropy of the
    count distribution over log(n) (1 = even, 0 = one option takes all); dead / overloaded: options below
    DEAD_FRACTION / above OVERLOAD_FACTOR times the mean (0 where none routed; dead <NA> under DEAD_PER_OPTION)."""
    rows = []
    for layer, g in util.groupby(C.LAYER, sort=False):
        c = g[C.COUNT].to_numpy(dtype=float)
        n, total = len(c), c.sum()
        mean = total / n if n else 0.0
        nz = c[c > 0] / total if total else c[:0]
        entropy = float(-(nz * np.log(nz)).sum() / math.log(n)) if n > 1 and total else float("nan")
        dead = (int((c < DEAD_FRACTION * mean).sum()) if total >= DEAD_PER_OPTION * n else pd.NA) if mean else 0
        rows.append((layer, n, int(g[C.N_TOKENS].iloc[0]) if C.N_TOKENS in g else int(total),
                     float(c.max() / mean) if mean else float("nan"), float(c.std() / mean) if mean else float("nan"),
                     entropy, dead, int((c > OVERLOAD_FACTOR * mean).sum()) if mean else 0))
    df = pd.DataFrame(rows, columns=BALANCE_COLUMNS).astype({"dead": "Int64"})
    df.attrs["notes"] = [f"Load balance, dead left empty: {TOO_FEW_FOR_DEAD}."] if df["dead"].isna().any() else []
    return df


ENTROPY_COLUMNS = ["layer", "options", "tokens", "token_entropy", "token_entropy_norm", "mean_entropy_norm"]


def router_entropy(trace: Trace, model: RouteScopeLM) -> pd.DataFrame | None:
    """Per routing layer whose router probabilities were recorded (the PROBS role; any family): how
    sure its router is of each token, token_entropy = mean over tokens of H(p_t) in nats and
    token_entropy_norm = that over log(n) (0 = one option, 1 = uniform); and how evenly it spreads
    the tokens, mean_entropy_norm = H(mean_t p_t) / log(n). None when no layer recorded any."""
    rows = []
    for layer, m in model.routing_modules.items():
        site = m.roles.get(PROBS)
        if site is None or site not in trace:
            continue
        p = trace[site].double()
        p = p.reshape(-1, p.shape[-1])  # (tokens, n)
        n = p.shape[-1]
        h = torch.special.entr(p).sum(-1)  # 0 log 0 = 0
        norm = math.log(n) if n > 1 else float("nan")
        rows.append((layer, n, p.shape[0], float(h.mean()), float(h.mean()) / norm,
                     float(torch.special.entr(p.mean(0)).sum()) / norm))
    return pd.DataFrame(rows, columns=ENTROPY_COLUMNS) if rows else None


# --- path outputs vs the combined output (PaPaformer, MoEP) ----------------------------------

def cosine_dominance(trace: Trace, model: RouteScopeLM) -> pd.DataFrame:
    """Per batch row, position, layer recording its COMBINED output and path (PATHS: block) output
    recorded in the trace: its cosine similarity with the layer's combined output, and whether it is
    the dominant (highest cosine) path of that token. Paths that did not run (dropped; unselected MoEP
    blocks) have no rows. Where the combined output has another width than the paths (PaPaformer
    fused_grow: the last Share-Linear layer maps to d_model directly) the cosine is undefined: NaN,
    no dominant path, and a note in `df.attrs["notes"]`. Takes the model for its layers' roles."""
    frames, notes = [], []
    path_sites = model.option_sites_of(PATHS)
    for layer, combined in recorded(trace, model.sites_of(COMBINED)).items():
        comb = trace[combined].float()  # (B, T, w)
        paths = [(j, trace[name].float()) for j, name in enumerate(path_sites.get(layer, ())) if name in trace]
        if not paths:
            continue
        B, T, _ = comb.shape
        if any(p.shape != comb.shape for _, p in paths):
            notes.append(f"{layer}: combined output has width {comb.shape[-1]} but paths have "
                         f"{paths[0][1].shape[-1]} (fused grow projection); cosine undefined")
            cos = torch.full((len(paths), B, T), float("nan"))
            dom = torch.zeros((len(paths), B, T), dtype=torch.bool)
        else:
            cos = torch.stack([F.cosine_similarity(p, comb, dim=-1) for _, p in paths])  # (P, B, T)
            dom = F.one_hot(cos.argmax(0), len(paths)).permute(2, 0, 1).bool()
        opts = np.array([j for j, _ in paths])
        b, t, o = grid_indices(B, T, len(paths))
        frames.append(pd.DataFrame({C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.OPTION: opts[o],
                                    C.COSINE: _np(cos.permute(1, 2, 0)).ravel(),
                                    C.DOMINANT: _np(dom.permute(1, 2, 0)).ravel()}))
    df = _concat(frames, [C.BATCH, C.POSITION, C.LAYER, C.OPTION, C.COSINE, C.DOMINANT])
    df.attrs["notes"] = notes
    return df


# --- ParallelGPT --------------------------------------------------------------------------------

def pgpt_paths(trace: Trace, model: RouteScopeLM) -> pd.DataFrame:
    """Per batch row, position, layer with per-call PATH_WEIGHTS (ParallelGPT's paths) and path:
    the learned mixing weight w_j of the call (already renormalised, 0 where dropped), the norm
    ||w_j * path_j|| of its contribution to the mixed output and its norm share
    ||w_j path_j|| / sum_k ||w_k path_k||. Dropped paths (not run) get norm and share 0. Takes the
    model for its layers' roles."""
    layers = model.sites_of(PATH_WEIGHTS)
    if not layers:
        raise ValueError(f"pgpt_paths needs a model whose paths are mixed by per-call weights; "
                         f"{model.config.label} has none")
    path_sites = model.option_sites_of(PATHS)
    frames = []
    for layer, weights in layers.items():
        w = site(trace, weights).float()  # (P,)
        outs = {j: trace[name].float() for j, name in enumerate(path_sites.get(layer, ())) if name in trace}
        if not outs:
            raise ValueError(f"the trace has no path outputs of {layer}; trace the call with tracing()")
        B, T, _ = next(iter(outs.values())).shape
        P = w.shape[0]
        norms = torch.stack([(w[j] * outs[j]).norm(dim=-1) if j in outs else torch.zeros(B, T) for j in range(P)])
        share = norms / norms.sum(0).clamp_min(1e-30)  # (P, B, T)
        dom = F.one_hot(norms.argmax(0), P).permute(2, 0, 1).bool()
        b, t, o = grid_indices(B, T, P)
        flat = lambda x: _np(x.permute(1, 2, 0)).ravel()  # noqa: E731  (P, B, T) -> rows in (b, t, o) order
        frames.append(pd.DataFrame({C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.OPTION: o, C.WEIGHT: _np(w)[o],
                                    C.NORM: flat(norms), C.SHARE: flat(share), C.DOMINANT: flat(dom)}))
    return pd.concat(frames, ignore_index=True)


# --- Wiola: ATM, DSFF, GCLA ---------------------------------------------------------------------

def merge_pairs(cos: Sequence[float], tau: float) -> list[tuple[int, int]]:
    """Greedy left-to-right ATM merging from adjacent cosines cos[t] = cos(x_t, x_{t+1}): t merges
    with t + 1 when cos[t] > tau and t is not already merged with t - 1 (pairs never overlap)."""
    pairs, t = [], 0
    while t < len(cos):
        if cos[t] > tau:
            pairs.append((t, t + 1))
            t += 2
        else:
            t += 1
    return pairs


def _groups_from_pairs(pairs: list[tuple[int, int]], T: int) -> list[int]:
    second = {b for _, b in pairs}
    groups, g = [], -1
    for t in range(T):
        g += t not in second
        groups.append(g)
    return groups


def atm_merges(trace: Trace, model: RouteScopeLM, *, tau: float | None = None) -> pd.DataFrame:
    """Per batch row, active token-merging layer (one recording ADJACENT_COS: Wiola's ATM,
    "blocks.{i}.atm") and position: the adjacent cosine cos(x_t, x_{t+1}) (NaN at the last
    position), the merge group, the partner position (NA when unmerged), and per (row, layer) the
    merge ratio mu = tokens removed by merging / T and the attention-FLOP saving
    mu (2 - mu) = 1 - (1 - mu)^2.

    tau None: the merge map the model recorded (MERGE_MAP, its own threshold). A number: merges
    recomputed greedily from the recorded cosines at that threshold, as the model would have merged
    (no retraining needed). Needs a call traced with atm=True (or a model with atm_inference).
    Takes the model for its layers' roles."""
    frames = []
    maps = model.sites_of(MERGE_MAP)
    for layer, adjacent in recorded(trace, model.sites_of(ADJACENT_COS)).items():
        cos = _np(trace[adjacent])  # (B, T-1)
        recorded_map = _np(site(trace, maps[layer])) if tau is None else None
        B, T = cos.shape[0], cos.shape[1] + 1
        for b in range(B):
            if tau is None:
                g = recorded_map[b].tolist()
                pairs = [(t, t + 1) for t in range(T - 1) if g[t] == g[t + 1]]
            else:
                pairs = merge_pairs(cos[b].tolist(), tau)
            partner: list[Any] = [pd.NA] * T
            for a, c in pairs:
                partner[a], partner[c] = c, a
            mu = len(pairs) / T
            frames.append(pd.DataFrame({
                C.BATCH: b, C.LAYER: layer, C.POSITION: np.arange(T), C.ADJACENT_COS: np.append(cos[b], np.nan),
                C.GROUP: _groups_from_pairs(pairs, T), C.PARTNER: pd.array(partner, dtype="Int64"),
                C.MERGED: [p is not pd.NA for p in partner], C.TAU: np.nan if tau is None else float(tau),
                C.MU: mu, C.FLOP_SAVING: mu * (2 - mu)}))
    return _concat(frames, [C.BATCH, C.LAYER, C.POSITION, C.ADJACENT_COS, C.GROUP, C.PARTNER, C.MERGED,
                            C.TAU, C.MU, C.FLOP_SAVING])


def atm_summary(trace: Trace, model: RouteScopeLM, *, tau: float | None = None) -> pd.DataFrame:
    """Per batch row and ATM layer: tokens, merged pairs, mu and the attention-FLOP saving."""
    df = atm_merges(trace, model, tau=tau)
    keys = [C.BATCH, C.LAYER]
    first = df.drop_duplicates(keys).reset_index(drop=True)  # mu, tau, saving are per (row, layer)
    sizes = df.groupby(keys, sort=False)[C.MERGED].agg(["size", "sum"]).reset_index(drop=True)
    return pd.DataFrame({C.BATCH: first[C.BATCH], C.LAYER: first[C.LAYER], C.N_TOKENS: sizes["size"],
                         C.N_PAIRS: (sizes["sum"] // 2).astype("int64"), C.TAU: first[C.TAU], C.MU: first[C.MU],
                         C.FLOP_SAVING: first[C.FLOP_SAVING]})


def dsff_gates(trace: Trace, model: RouteScopeLM) -> pd.DataFrame:
    """Per batch row, position and layer with a per-dimension GATE (Wiola's DSFF, "blocks.{i}.dsff"):
    the gate (alpha, the per-dimension weight of option 0, stream A) averaged over the model
    dimension. DSFF runs per token, also in ATM blocks (token merging applies to attention only).
    Takes the model for its layers' roles."""
    frames = []
    for layer, gate in recorded(trace, model.sites_of(GATE)).items():
        g = trace[gate].float().mean(-1)  # (B, T)
        B, T = g.shape
        b, t = grid_indices(B, T)
        frames.append(pd.DataFrame({C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.GATE_MEAN: _np(g).ravel()}))
    return _concat(frames, [C.BATCH, C.POSITION, C.LAYER, C.GATE_MEAN])


def gcla_betas(trace: Trace, model: RouteScopeLM) -> pd.DataFrame:
    """Per layer with a per-call BLEND of two paths (Wiola's GCLA, "blocks.{i}.attn"; block 0 has no
    cross-layer attention): beta. Takes the model for its layers' roles."""
    rows = [(layer, float(trace[beta])) for layer, beta in recorded(trace, model.sites_of(BLEND)).items()]
    return pd.DataFrame(rows, columns=[C.LAYER, C.BETA])


# --- PAGMLP ------------------------------------------------------------------------------------

PAGMLP_LABELS = ("swiglu", "geglu")


def pagmlp_pathways(trace: Trace, model: Any) -> pd.DataFrame:
    """Per batch row, position, layer with per-call PATH_SCALES (PAGMLP, "blocks.{i}.ffn") and pathway
    (0 SwiGLU, 1 GEGLU): the pathway scale (alpha / beta), the norm of its scaled activation (PATHS),
    the norm of its output contribution W_j @ act, W_j the layer's projection of pathway j
    (`path_projections()`, from the model's weights; the shared down bias, if any, belongs to neither)
    and its share of the two output norms. Takes the model for its layers' roles and projections."""
    frames = []
    path_sites = model.option_sites_of(PATHS)
    for layer, scale_sites in model.option_sites_of(PATH_SCALES).items():
        if scale_sites[0] not in trace:
            continue
        down = [w.detach().float().cpu() for w in model.get_submodule(layer).path_projections()]  # (d, h/2) each
        scales = [float(trace[name]) for name in scale_sites]
        acts = [site(trace, name).float() for name in path_sites[layer]]
        act_norm = torch.stack([a.norm(dim=-1) for a in acts])  # (2, B, T)
        out_norm = torch.stack([(a @ w.T).norm(dim=-1) for a, w in zip(acts, down)])
        share = out_norm / out_norm.sum(0).clamp_min(1e-30)
        _, B, T = act_norm.shape
        b, t, o = grid_indices(B, T, 2)
        flat = lambda x: _np(x.permute(1, 2, 0)).ravel()  # noqa: E731  (2, B, T) -> rows in (b, t, o) order
        frames.append(pd.DataFrame({
            C.BATCH: b, C.POSITION: t, C.LAYER: layer, C.OPTION: o, C.LABEL: np.array(PAGMLP_LABELS)[o],
            C.SCALE: np.array(scales)[o], C.ACT_NORM: flat(act_norm), C.OUT_NORM: flat(out_norm),
            C.SHARE: flat(share)}))
    return _concat(frames, [C.BATCH, C.POSITION, C.LAYER, C.OPTION, C.LABEL, C.SCALE, C.ACT_NORM, C.OUT_NORM,
                            C.SHARE])


def _concat(frames: list[pd.DataFrame], cols: list[str]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
