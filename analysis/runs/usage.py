"""How often the unablated model picks each option of each routing layer: the counts an ablation
spec's "top N" ranks by (`core_models.specs`' grammar), and `ablation_for`, the one place
callers turn specs into a checked `Ablation` for a loaded model (the CLI's commands, `rs.run`, the app).

"top N" (= "top N@run") ranks by the picks over the tokens this command runs: the prompt(s), or
the corpus for `routescope corpus`; "top N@corpus" by a corpus's statistics where one is at hand
(the corpus command, the app's Corpus view). A pick is one of a token's top-k slots (first choice
alone for top-1 routers), as the corpus view's `slots` count them."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from routescope.core_models.ablation import Ablation
from routescope.core_models.devices import model_device
from routescope.core_models.specs import AblationError
from routescope.core_models.trace import tracing

from routescope.analysis.runs.family_table import route_reader

Counts = dict[str, np.ndarray]  # layer -> picks per option (index o: option o)


def _reader(model: Any):
    try:
        return route_reader(model)
    except ValueError as e:
        raise AblationError(f"top N needs per-token routes to rank options by use: {e}") from None


@torch.inference_mode()
def run_usage(model: Any, id_lists: Iterable[Sequence[int]]) -> Counts:
    """Picks per option and routing layer of the unablated model (deterministic routing) over every
    token of each id list (one forward each: no padding to mask)."""
    reader = _reader(model)
    sizes = model.routing_layers()
    n = [sizes.get(l, len(reader.labels)) for l in reader.layers]
    counts = np.zeros((len(reader.layers), max(n, default=0) + 1), dtype=np.int64)
    for ids in id_lists:
        with tracing(reader.sites) as tr:
            model(torch.tensor([list(ids)], dtype=torch.long, device=model_device(model)))
        picks = reader.topk(tr) if reader.topk is not None else reader.routes(tr)[..., None]  # (L, B, T, k), 1-based
        for l in range(len(reader.layers)):
            counts[l] += np.bincount(np.asarray(picks[l]).ravel().astype(np.int64), minlength=counts.shape[1])[
                :counts.shape[1]]
    return {layer: counts[l, 1:n[l] + 1].copy() for l, layer in enumerate(reader.layers)}  # index 0: undefined


def corpus_usage(result: Any) -> Counts:
    """The same counts from a finished corpus run (`corpus_run.CorpusResult` with per-token routes)."""
    lay = result.layout
    if not lay.routes:
        raise AblationError(f"top N@corpus needs per-token routes; {result.family} has none")
    return {layer: np.asarray(result.stats.slots[l, 1:lay.n_options[l] + 1]).copy() for l, layer in enumerate(lay.layers)}


def ablation_for(model: Any, drop: Sequence[str] = (), force: Sequence[str] = (), modes: Sequence[str] = (), *,
                 run_ids: Callable[[], Iterable[Sequence[int]]] | None = None,
                 run_counts: Callable[[], Counts] | None = None,
                 corpus: Callable[[], Counts] | None = None) -> Ablation:
    """Specs resolved against `model` and checked (`Ablation.validate`). `run_ids()` gives the token
    ids "top N@run" counts over (or `run_counts()` the counts themselves), `corpus()` the counts of
    "top N@corpus"; each is asked at most once, and only when a spec needs it."""
    cache: dict[str, Counts] = {}

    def usage(source: str) -> Counts:
        if source not in cache:
            if source == "run" and run_counts is not None:
                cache[source] = run_counts()
            elif source == "run" and run_ids is not None:
                cache[source] = run_usage(model, run_ids())
            elif source == "corpus" and corpus is not None:
                cache[source] = corpus()
            else:
                where = ("no corpus statistics here (routescope corpus, or the app's Corpus view, has them)"
                         if source == "corpus" else "no tokens to count here")
                raise AblationError(f"top N@{source}: {where}")
        return cache[source]

    ablation = Ablation.parse(list(drop), list(force), list(modes), layers=model.routing_layers(), usage=usage)
    ablation.validate(model.routing_layers(), model.ablation_modes())
    return ablation
