"""One analysed run of a prompt: generation with per-step candidates, the routing trace, the
export table and the family's routing views. Pure (no Streamlit); the app caches these objects
and treats them as read-only, since one cached run may serve several browser sessions."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd
import torch

from core_models.generate import Generation, Sampling, generate
from core_models.runtime import Ablation, Trace, tracing

from . import routing as R
from .table import ExportMeta, RowMeta, routing_table


@dataclass(frozen=True)
class RunSettings:
    """Everything besides the prompt and the ablation that changes a run (hashable: a cache key)."""

    max_new_tokens: int = 24
    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    routing: str = "deterministic"  # Gumbel routing at inference: noise-free argmax, or seeded samples
    top_n: int = 10  # next-token candidates kept per step
    atm_tau: float | None = None  # Wiola: None = the model's threshold

    def sampling(self) -> Sampling:
        return Sampling(greedy=self.greedy, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                        seed=self.seed)


@dataclass
class Run:
    model_name: str
    family: str
    prompt: str
    settings: RunSettings
    ablation: Ablation
    generation: Generation
    tokens: list[str]  # decoded text of every position as run (prompt, then generated)
    table: pd.DataFrame  # the export table (analysis.columns.EXPORT_SCHEMA)
    views: dict[str, pd.DataFrame]  # family routing views, by name
    seconds: float  # wall time of the run (forward passes + analyses)
    atm_trace: Trace | None = None  # Wiola: a forward with token merging on (for merge maps)
    notes: list[str] = field(default_factory=list)

    @property
    def n_prompt(self) -> int:
        return len(self.generation.prompt_ids)

    @property
    def ids(self) -> list[int]:
        return self.generation.ids


def family_of(model: Any) -> str:
    c = model.config
    if c.family == "papaformer":
        return "papaformer-share-linear" if c.combiner == "share_linear" else f"papaformer-{c.combiner.replace('_', '-')}"
    if c.family == "llama" and getattr(c, "ffn", "") == "pagmlp":
        return "pagmlp"
    return c.family


def family_views(trace: Trace, model: Any, *, atm_trace: Trace | None = None, atm_tau: float | None = None
                 ) -> dict[str, pd.DataFrame]:
    """The analysis tables the app draws for this model's family."""
    c, views = model.config, {}
    if c.family == "papaformer":
        views["cosine"] = R.cosine_dominance(trace)
        if c.combiner != "share_linear":
            views["gumbel"] = R.gumbel_routes(trace, c)
    elif c.family == "moep":
        views["topk"] = R.topk_routes(trace)
        views["utilisation"] = R.topk_utilisation(trace)
        views["coselection"] = R.topk_coselection(trace)
    elif c.family == "pgpt":
        views["pgpt"] = R.pgpt_paths(trace)
    elif c.family == "wiola":
        views["dsff"] = R.dsff_gates(trace)
        views["gcla"] = R.gcla_betas(trace)
        if atm_trace is not None:
            views["atm"] = R.atm_merges(atm_trace, tau=atm_tau)
            views["atm_summary"] = R.atm_summary(atm_trace, tau=atm_tau)
    elif c.family == "llama" and c.ffn == "pagmlp":
        views["pagmlp"] = R.pagmlp_pathways(trace, model)
    return views


def decode_tokens(tokenizer: Any, ids: list[int]) -> list[str]:
    if tokenizer is None:
        return [f"<{i}>" for i in ids]
    return [tokenizer.decode([i]) for i in ids]


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    if tokenizer is None:
        raise ValueError("this checkpoint has no tokenizer.json: text prompts need a tokenizer")
    if not prompt or not prompt.strip():
        raise ValueError("the prompt is empty: type some text to continue")
    ids = tokenizer.encode(prompt).ids
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return ids


@torch.inference_mode()
def run_prompt(model: Any, tokenizer: Any, prompt: str, *, settings: RunSettings = RunSettings(),
               ablation: Ablation | None = None, model_name: str = "model", prompt_id: str = "p0") -> Run:
    """Generate, trace every routing site of prompt and continuation, and build the tables."""
    t0 = time.perf_counter()
    ablation = ablation or Ablation()
    ids = encode_prompt(tokenizer, prompt)
    gen = generate(model, ids, max_new_tokens=settings.max_new_tokens, sampling=settings.sampling(),
                   top_n=settings.top_n, ablation=ablation, routing=settings.routing, routing_seed=settings.seed,
                   trace_sites=None)
    tokens = decode_tokens(tokenizer, gen.ids)
    atm_trace = None
    if model.config.family == "wiola":  # merge maps need a forward with ATM on (no KV cache)
        sites = [n for n in model.site_names() if ".atm." in n]
        with tracing(sites) as atm_trace:
            model(torch.tensor([gen.ids]), ablation=ablation, atm=True, atm_tau=settings.atm_tau)
    meta = ExportMeta(model=model_name, rows=[RowMeta(prompt_id=prompt_id, token_ids=gen.ids, tokens=tokens,
                                                      n_prompt=len(gen.prompt_ids))],
                      ablation=ablation.describe(), seed=settings.seed)
    views = family_views(gen.trace, model, atm_trace=atm_trace, atm_tau=settings.atm_tau)
    table = routing_table(gen.trace, model, meta=meta, views=views)  # reuses the views' frames
    return Run(model_name=model_name, family=family_of(model), prompt=prompt, settings=settings,
               ablation=ablation, generation=gen, tokens=tokens, table=table, views=views,
               seconds=time.perf_counter() - t0, atm_trace=atm_trace, notes=list(gen.notes))


def candidates_table(run: Run, tokenizer: Any = None) -> pd.DataFrame:
    """One row per generated step and candidate: the paper's "girl - 99.5%, boy - 0.5%" view."""
    rows = []
    for i, s in enumerate(run.generation.steps):
        texts = decode_tokens(tokenizer, s.top_ids)
        for rank, (tid, p, text) in enumerate(zip(s.top_ids, s.top_probs, texts)):
            rows.append({"step": i, "position": s.position, "chosen_token": run.tokens[s.position],
                         "chosen_prob": s.prob, "rank": rank, "candidate": text, "candidate_id": tid, "prob": p})
    return pd.DataFrame(rows)


def provenance(run: Run) -> dict[str, Any]:
    """What an export needs to be reproduced."""
    return {"model": run.model_name, "family": run.family, "prompt": run.prompt,
            "settings": asdict(run.settings), "ablation": run.ablation.describe()}


def option_labels(model: Any) -> dict[str, list[str]]:
    """Human names of the options of every routing layer (what an ablation toggle drops)."""
    c, out = model.config, {}
    for layer, n in model.routing_layers().items():
        if c.family == "papaformer":
            names = [f"path {j + 1}" for j in range(c.n_paths)] + (["combined"] if n > c.n_paths else [])
        elif c.family == "pgpt":
            names = [f"path {j + 1}" for j in range(n)]
        elif c.family == "moep":
            names = [f"{'expert' if layer.startswith('moe_') else 'block'} {j}" for j in range(n)]
        elif c.family == "wiola":
            names = ["stream A (SwiGLU)", "stream B (GELU)"]
        elif layer.endswith(".ffn"):
            names = ["SwiGLU pathway", "GEGLU pathway"]
        else:
            names = [f"option {j}" for j in range(n)]
        out[layer] = names
    return out


def can_force(model: Any) -> bool:
    """Whether forcing a route means something beyond dropping the others (a router decides)."""
    c = model.config
    return (c.family == "papaformer" and c.combiner != "share_linear") or c.family in ("moep", "pgpt", "wiola")
