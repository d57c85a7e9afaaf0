"""What an expert-importance sweep runs: its settings, the dataset's token rows and their batches, the
layers and options measured (`Scope`), the random-expert control draws and the pruning orders.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from routescope.core_models.ablation import Ablation

from routescope.analysis.inputs.datasets import CorpusData
from routescope.analysis.corpus.run import encode_head


METHODS = ("estimate", "exact", "both")  # how each option's effect is had (`estimate` module; the sweep)
SWEEPS = ("fast", "naive")  # how the exact sweep runs (the same numbers)
COLUMNS = ["layer", "option", "label", "delta_nll", "delta_nll_low", "delta_nll_high", "kl", "flip_rate", "usage",
           "delta_nll_estimate", "method"]


@dataclass(frozen=True)
class ImportanceSettings:
    """What the tables depend on besides the model and the dataset (hashable: a cache key).
    `max_tokens`: tokens taken from the dataset in row order (None: all; each row at most the
    model's context). `method`: "exact" (every option dropped over the dataset), "estimate" (the
    first-order estimate of every option from one forward and backward per batch, `estimate`
    module; no exact row), or "both" (every option estimated, then the `confirm` largest by
    |estimate| of each layer and the control's draws measured exactly). `sweep`: "fast" (prefix
    reuse and batched ablations where the model has them) or "naive" (one full forward per
    ablation): the same numbers. `prune_max`: largest N of the pruning curve
    (None: half the routed experts; 0: no curve). `holdout`: the share of rows that judge pruning and
    merging (seeded split; the others rank the experts; `holdout` module); `in_sample_curve`: the
    curve on the ranking rows too, labelled in-sample; `merge_max`: largest N of the merge curve
    (0: none)."""

    layers: tuple[str, ...] | None = None
    options: tuple[int, ...] | None = None
    max_tokens: int | None = None
    batch_size: int = 8
    ablations_per_forward: int | None = None  # None: 1 on a CPU, 16 on an accelerator (see below)
    control_draws: int = 8
    prune_draws: int = 8
    prune_max: int | None = None
    bootstrap: int = 1000
    seed: int = 0
    method: str = "exact"  # the CLI's default is "both"; here the tables of earlier releases
    sweep: str = "fast"
    confirm: int = 8
    float32: bool = True
    holdout: float = 0.5
    in_sample_curve: bool = False
    merge_max: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r}: use {', '.join(METHODS)}")
        if self.sweep not in SWEEPS:
            raise ValueError(f"sweep {self.sweep!r}: use {', '.join(SWEEPS)}")
        for f in ("batch_size", "ablations_per_forward", "bootstrap", "confirm"):
            if getattr(self, f) is not None and getattr(self, f) < 1:
                raise ValueError(f"{f} = {getattr(self, f)}: must be >= 1")
        for f in ("control_draws", "prune_draws"):
            if getattr(self, f) < 0:
                raise ValueError(f"{f} = {getattr(self, f)}: must be >= 0")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError(f"max_tokens = {self.max_tokens}: must be >= 2 (one predicted position)")
        if self.prune_max is not None and self.prune_max < 0:
            raise ValueError(f"prune_max = {self.prune_max}: must be >= 0")
        if not 0 < self.holdout < 1:
            raise ValueError(f"holdout = {self.holdout}: the held-out share of rows lies between 0 and 1")
        if self.merge_max < 0:
            raise ValueError(f"merge_max = {self.merge_max}: must be >= 0")


@dataclass
class ImportanceResult:
    """The tables of one sweep (name -> frame) and how they were made."""

    tables: dict[str, pd.DataFrame]
    provenance: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]


# --- the dataset ------------------------------------------------------------------------------------

@dataclass
class Tokens:
    """The dataset's token rows (row ids, ids), in dataset order."""

    row_ids: list[str]
    ids: list[list[int]]

    @property
    def positions(self) -> np.ndarray:  # predicted positions per row
        return np.array([max(0, len(x) - 1) for x in self.ids], dtype=np.float64)


def tokens_of(data: CorpusData, tokenizer: Any, context: int, max_tokens: int | None) -> Tokens:
    """The dataset's rows encoded, each cut to `context`, until `max_tokens` tokens in all; ValueError
    for a dataset without one predicted position."""
    out = Tokens([], [])
    total = 0
    rows = iter(data)
    while max_tokens is None or total < max_tokens:
        chunk = [r for _, r in zip(range(256), rows)]
        if not chunk:
            break
        for r in chunk:  # each row tokenized only as far as it is used (a row may be 1 MiB)
            x = encode_head(tokenizer, r.text, context if max_tokens is None else min(context, max_tokens - total))
            if x:
                out.row_ids.append(r.row_id)
                out.ids.append(x)
                total += len(x)
            if max_tokens is not None and total >= max_tokens:
                break
    if not out.ids or out.positions.sum() == 0:
        raise ValueError(f"{data.name}: no row has two tokens: nothing to predict")
    return out


def batches(tokens: Tokens, size: int, pad: int) -> list[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """(row indices, right-padded ids [R, T], lengths [R]) by length, `size` rows each."""
    order = sorted(range(len(tokens.ids)), key=lambda k: len(tokens.ids[k]))
    out = []
    for s in range(0, len(order), size):
        part = order[s:s + size]
        T = max(len(tokens.ids[k]) for k in part)
        x = torch.tensor([tokens.ids[k] + [pad] * (T - len(tokens.ids[k])) for k in part])
        out.append((np.array(part), x, torch.tensor([len(tokens.ids[k]) for k in part])))
    return out


# --- what a sweep runs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scope:
    layers: tuple[str, ...]  # in model order
    options: dict[str, tuple[int, ...]]  # layer -> options measured
    routed: dict[str, int]  # layer -> routed options (the first ones; a shared expert after them)
    labels: dict[str, list[str]]


def scope_of(model: Any, layers: Sequence[str] | None, options: Sequence[int] | None) -> Scope:
    """The layers and options to measure; ValueError (one line) for an unknown one or a model without
    routing layers."""
    known = model.routing_layers()
    if not known:
        raise ValueError(f"{model.config.label} has no routing layers: no expert to measure")
    chosen = list(known) if not layers else list(dict.fromkeys(layers))
    bad = [l for l in chosen if l not in known]
    if bad:
        raise ValueError(f"no routing layer {', '.join(map(repr, bad))} (layers: {', '.join(known)})")
    chosen = [l for l in known if l in chosen]
    opts = {}
    for l in chosen:
        want = range(known[l]) if options is None else list(dict.fromkeys(int(o) for o in options))
        out = [o for o in want if not 0 <= o < known[l]]
        if out:
            raise ValueError(f"option {out[0]} out of range 0..{known[l] - 1} of layer {l!r}")
        opts[l] = tuple(want)
    routed = {l: int(getattr(model.routing_modules[l], "n_routed", known[l])) for l in chosen}
    return Scope(tuple(chosen), opts, routed, {l: model.option_labels()[l] for l in chosen})


def drop(*pairs: tuple[str, int]) -> Ablation:
    """The ablation that drops these (layer, option) pairs together."""
    return Ablation(drop=tuple(pairs))


def control_draws(scope: Scope, draws: int, seed: int) -> list[tuple[str, int, int]]:
    """(layer, draw, routed option) of the random-expert control, seeded."""
    rng = np.random.default_rng(seed)
    return [(l, d, int(rng.integers(scope.routed[l]))) for l in scope.layers for d in range(draws)]


def prune_range(scope: Scope, settings: ImportanceSettings) -> list[int]:
    """N of the pruning curve: 0 .. `prune_max` (default half the routed experts of the smallest layer);
    none unless every routed option of each layer is measured."""
    if settings.prune_max == 0 or any(set(range(scope.routed[l])) - set(scope.options[l]) for l in scope.layers):
        return []
    half = min(scope.routed[l] // 2 for l in scope.layers)
    top = half if settings.prune_max is None else min(settings.prune_max, half)
    return list(range(0, top + 1))


def ranked(table: pd.DataFrame, scope: Scope, by: str) -> dict[str, list[int]]:
    """Routed options of each layer, least important first by column `by` (ties by option)."""
    out = {}
    for l in scope.layers:
        g = table[(table["layer"] == l) & (table["option"] < scope.routed[l])].sort_values([by, "option"])
        out[l] = [int(o) for o in g["option"]]
    return out


def pruning_ablation(order: dict[str, list[int]], n: int) -> Ablation:
    """The first `n` options of each layer's `order` dropped at once."""
    return drop(*[(l, o) for l, os_ in order.items() for o in os_[:n]])
