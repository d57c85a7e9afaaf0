"""One analysed run of a prompt: generation with per-step candidates, the routing trace, the
export table and the family's routing views. Pure (no Streamlit); the app caches these objects
and treats them as read-only, since one cached run may serve several browser sessions."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd
import torch

from routescope.core_models.ablation import Ablation
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.checkpoint import require_tokenizer
from routescope.core_models.generate import Generation, Sampling, generate

from routescope.analysis.runs.views import RunViews, once
from routescope.analysis.runs.family_table import family_analysis, routing_views
from routescope.analysis.inputs.prompts import check_prompt
from routescope.analysis.export.run_table import ExportMeta, RowMeta, routing_table


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
    # the family's own per-call options (model.run_options(), e.g. Wiola's atm_tau) as (name, value)
    # pairs, for the family's second pass (generation runs with the KV cache and the model's defaults)
    options: tuple[tuple[str, Any], ...] = ()

    def sampling(self) -> Sampling:
        return Sampling(greedy=self.greedy, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                        seed=self.seed)


@dataclass(frozen=True)
class TokenSpan:
    """Positions start..end-1 whose text only decodes together (a character split over byte-level
    tokens, e.g. an emoji or a Hebrew letter); `text` is their decoded text."""

    start: int
    end: int
    text: str


@dataclass
class Run:
    model_name: str
    family: str  # config.label
    prompt: str
    settings: RunSettings
    ablation: Ablation
    generation: Generation
    tokens: list[str]  # decoded text of every position as run (prompt, then generated), token by token
    spans: list[TokenSpan]  # every position once, in order: single tokens, or tokens decoding only together
    table: pd.DataFrame | None  # the export table (analysis.export.columns.EXPORT_SCHEMA); None where
    # run_prompt was asked not to build it (the app builds it for the Export view only: `run_table`)
    views: RunViews  # the family's routing views: name -> View (tidy frame + drawer), read-only
    seconds: float  # wall time of the run (forward passes + analyses)
    notes: list[str] = field(default_factory=list)

    @property
    def n_prompt(self) -> int:
        return len(self.generation.prompt_ids)

    @property
    def ids(self) -> list[int]:
        return self.generation.ids

    def display_tokens(self) -> list[str]:
        """Per position, the text to show: its own, or for a token of a multi-token span the span's
        text with the token's place in it ("😀 (1/2)"), never a replacement character per byte."""
        out = list(self.tokens)
        for sp in self.spans:
            n = sp.end - sp.start
            if n > 1:
                for k in range(n):
                    out[sp.start + k] = f"{sp.text} ({k + 1}/{n})"
        return out


def decode_tokens(tokenizer: Any, ids: list[int]) -> list[str]:
    if tokenizer is None:
        return [f"<{i}>" for i in ids]
    return [tokenizer.decode([i]) for i in ids]


REPLACEMENT = "\ufffd"  # what decoding shows for an incomplete UTF-8 sequence
MAX_SPAN = 8  # tokens: a character is at most 4 bytes, and a token holds at least one of them


def token_spans(tokenizer: Any, ids: list[int]) -> list[TokenSpan]:
    """Group positions whose tokens decode to U+FFFD alone but to text together (byte-level BPE
    splits multi-byte characters over tokens): the shortest run from a token with a replacement
    character (up to MAX_SPAN tokens) that decodes to fewer replacement characters than its tokens
    one by one. Other positions are spans of one token."""
    texts = decode_tokens(tokenizer, ids)
    spans, i = [], 0
    while i < len(ids):
        end = i + 1
        if tokenizer is not None and REPLACEMENT in texts[i]:
            alone = texts[i].count(REPLACEMENT)
            for j in range(i + 2, min(len(ids), i + MAX_SPAN) + 1):
                alone += texts[j - 1].count(REPLACEMENT)
                joined = tokenizer.decode(ids[i:j])
                if joined.count(REPLACEMENT) < alone and REPLACEMENT not in joined[-1:]:
                    end = j
                    break
        spans.append(TokenSpan(i, end, texts[i] if end == i + 1 else tokenizer.decode(ids[i:end])))
        i = end
    return spans


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    require_tokenizer(tokenizer)
    check_prompt(prompt)  # the CLI's rule too: not blank, UTF-8 text
    ids = tokenizer.encode(prompt).ids
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return ids


@torch.inference_mode()
def run_prompt(model: RouteScopeLM, tokenizer: Any, prompt: str, *, settings: RunSettings = RunSettings(),
               ablation: Ablation | None = None, model_name: str = "model", prompt_id: str = "p0",
               table: bool = True) -> Run:
    """Generate, trace every routing site of prompt and continuation, and build the views and (with
    `table`) the export table. The app passes table=False: its routing views and every ablation
    toggle never read the long table (at 64 experts x 16 layers, 65,536 rows for 64 tokens), and its
    Export view builds it once (`run_table`)."""
    t0 = time.perf_counter()
    ablation = ablation or Ablation()
    options = model.check_options(dict(settings.options))  # a family's own options, or a clear error
    ids = encode_prompt(tokenizer, prompt)
    gen = generate(model, ids, max_new_tokens=settings.max_new_tokens, sampling=settings.sampling(),
                   top_n=settings.top_n, ablation=ablation, routing=settings.routing, routing_seed=settings.seed,
                   trace_sites=None)
    tokens = decode_tokens(tokenizer, gen.ids)
    family = family_analysis(model)
    # the family's second pass runs when a view that reads it is first asked for (a toggle on a page
    # without those views never runs it)
    second = once(lambda: family.second_pass(model, gen.ids, ablation, options)) if family.second_pass else None
    views = routing_views(gen.trace, model, second=second, options=options)
    run = Run(model_name=model_name, family=model.config.label, prompt=prompt, settings=settings,
              ablation=ablation, generation=gen, tokens=tokens, spans=token_spans(tokenizer, gen.ids), table=None,
              views=views, seconds=0.0, notes=list(gen.notes))
    if table:
        run.table = run_table(run, model, prompt_id=prompt_id)
    run.seconds = time.perf_counter() - t0
    return run


def run_table(run: Run, model: RouteScopeLM, *, prompt_id: str = "p0") -> pd.DataFrame:
    """The run's export table (analysis.export.columns.EXPORT_SCHEMA), from its trace; reuses the
    views' frames."""
    meta = ExportMeta(model=run.model_name, rows=[RowMeta(prompt_id=prompt_id, token_ids=run.ids, tokens=run.tokens,
                                                          n_prompt=run.n_prompt)],
                      ablation=run.ablation.describe(), seed=run.settings.seed)
    return routing_table(run.generation.trace, model, meta=meta, views=run.views)


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
