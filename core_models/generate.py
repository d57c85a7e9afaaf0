"""KV-cache decoding with per-step top-k candidates and routing records."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from .ablation import Ablation
from .base import InputError, RouteScopeLM
from .trace import Trace, tracing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature = {self.temperature}: must be > 0")
        if self.top_k < 0:
            raise ValueError(f"top_k = {self.top_k}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p = {self.top_p}: must be in (0, 1]")


@dataclass
class Step:
    position: int  # position of the generated token in the (possibly truncated) sequence
    token_id: int
    prob: float  # model probability (temperature 1, unfiltered) of the chosen token
    top_ids: list[int]
    top_probs: list[float]


@dataclass
class Generation:
    prompt_ids: list[int]  # the prompt as run (after truncation)
    new_ids: list[int]
    steps: list[Step]
    truncated: int = 0  # prompt tokens dropped from the front to fit the context
    prompt_logits: torch.Tensor | None = None  # (T_prompt, V) logits at every prompt position, where asked
    # for (`keep_prompt_logits`): float32 at the model's vocabulary, 12.9 MB for 64 tokens of 50,304, kept
    # by every cached run otherwise
    trace: Trace | None = None  # prompt records first, then one record per generated token
    notes: list[str] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.new_ids


def fit_prompt(prompt_ids: list[int], context: int, max_new_tokens: int) -> tuple[list[int], int]:
    """Keep the last tokens of a prompt so prompt + new tokens fit the context."""
    if max_new_tokens >= context:
        raise InputError(f"max_new_tokens = {max_new_tokens} leaves no room for a prompt in context {context}")
    room = context - max_new_tokens
    drop = max(0, len(prompt_ids) - room)
    return prompt_ids[drop:], drop


def filter_logits(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Apply temperature, top-k and top-p to (V,) logits."""
    logits = logits / s.temperature
    if s.top_k:
        kth = logits.topk(min(s.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        remove = cum - sorted_logits.softmax(-1) >= s.top_p  # keep the smallest set reaching top_p
        logits = logits.masked_fill(torch.zeros_like(remove).scatter(0, order, remove), float("-inf"))
    return logits


@torch.inference_mode()
def generate(model: RouteScopeLM, prompt_ids: list[int], *, max_new_tokens: int = 32,
             sampling: Sampling = Sampling(), top_n: int = 5, ablation: Ablation | None = None,
             routing: str = "deterministic", routing_seed: int = 0, trace_sites: list[str] | None | bool = False,
             stop_ids: tuple[int, ...] = (), keep_prompt_logits: bool = False) -> Generation:
    """Decode greedily or by sampling. `trace_sites`: False = no trace, None = every site, or names.
    `keep_prompt_logits`: keep the prompt pass's logits on the result (`Generation.prompt_logits`)."""
    if not prompt_ids:
        raise InputError("empty prompt: nothing to continue")
    if max_new_tokens < 0:
        raise InputError(f"max_new_tokens = {max_new_tokens}: must be >= 0")
    ids, dropped = fit_prompt(list(prompt_ids), model.context, max_new_tokens)
    gen = Generation(prompt_ids=ids, new_ids=[], steps=[], truncated=dropped)
    if dropped:
        gen.notes.append(f"prompt truncated: kept the last {len(ids)} of {len(prompt_ids)} tokens "
                         f"to fit context {model.context} with {max_new_tokens} new tokens")
        log.warning(gen.notes[-1])
    sampler = torch.Generator().manual_seed(sampling.seed)
    router_gen = torch.Generator().manual_seed(routing_seed)
    cache = model.new_cache()
    device = model.device  # ids go to the model; logits come back to the CPU for sampling (CPU generator)
    call = dict(ablation=ablation, routing=routing, generator=router_gen, cache=cache)
    trace_ctx = tracing(None if trace_sites is None else list(trace_sites)) if trace_sites is not False else None
    tr = trace_ctx.__enter__() if trace_ctx else None
    try:
        logits = model(torch.tensor([ids], device=device), **call).logits[0]  # (T, V)
        last = logits[-1].to("cpu", copy=True)  # a row of its own: a view would keep every row alive
        if keep_prompt_logits:
            gen.prompt_logits = logits.cpu()
        del logits
        for i in range(max_new_tokens):
            probs = torch.softmax(last.float(), -1)
            if sampling.greedy:
                tok = int(probs.argmax())
            else:
                p = torch.softmax(filter_logits(last.float(), sampling), -1)
                tok = int(torch.multinomial(p, 1, generator=sampler))
            top = probs.topk(min(top_n, probs.numel()))
            gen.steps.append(Step(position=len(ids) + i, token_id=tok, prob=float(probs[tok]),
                                  top_ids=top.indices.tolist(), top_probs=top.values.tolist()))
            gen.new_ids.append(tok)
            done = tok in stop_ids or i == max_new_tokens - 1
            if done and tr is None:
                break  # the last token's own forward is only needed for its routing records
            last = model(torch.tensor([[tok]], device=device), **call).logits[0, -1].cpu()
            if done:
                break
    finally:
        if trace_ctx:
            trace_ctx.__exit__(None, None, None)
    gen.trace = tr
    return gen
