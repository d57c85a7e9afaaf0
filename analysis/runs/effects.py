"""Effects of an ablation on the next-token distributions and on a generated continuation.

`ablation_effects` runs the model twice (it takes the model, not a trace): unablated and with
the given `Ablation`, same routing mode and seed. `generation_diff` aligns two continuations
(e.g. `generate(...)` with and without the ablation) token by token.
"""
from __future__ import annotations

import difflib
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from routescope.core_models.ablation import Ablation
from routescope.core_models.devices import model_device

from routescope.analysis.export import columns as C


def _ids(input_ids: Any) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    return ids.unsqueeze(0) if ids.dim() == 1 else ids


TIE_ULPS = 8  # two logits within this many ulps of the row's largest magnitude (at least 1) are tied


def tie_tolerance(logits: torch.Tensor) -> torch.Tensor:
    """(..., V) logits -> (...) the margin below which two of a row's logits count as tied: TIE_ULPS
    ulps (of the dtype the model computed them in) of the row's largest |logit|, at least of 1.0. Two
    runs that differ only by rounding (a different summation order, a dropped expert that no token
    picked) move logits by a few such ulps, enough to swap a near-tied top-1 without any real change."""
    scale = logits.abs().amax(-1).clamp_min(1.0)
    return TIE_ULPS * torch.finfo(logits.dtype).eps * scale.double()


@torch.inference_mode()
def ablation_effects(model: Any, input_ids: Any, ablation: Ablation, *, routing: str = "deterministic",
                     seed: int = 0) -> pd.DataFrame:
    """Per batch row and position: KL(base || ablated) of the next-token distributions (nats),
    the top-1 token of each, whether it flipped, and the probability of the base top-1 token
    under both models. `input_ids`: (T,) or (B, T) token ids.

    KL is summed in float64 and clamped at 0: it is never negative, and a sum below zero is rounding
    (how many rows were clamped, and the lowest sum, are in `df.attrs["kl_clamped"]`,
    `df.attrs["kl_lowest"]`). A top-1 "flip" is a change of the argmax token id that is not a tie: the
    base model prefers its top-1 over the ablated model's top-1, and the ablated model the reverse,
    each by more than `tie_tolerance` of its logits."""
    ids = _ids(input_ids)

    def logits(ab: Ablation | None) -> torch.Tensor:  # (B, T, V) on the CPU in the model's dtype
        gen = torch.Generator().manual_seed(seed)
        return model(ids.to(model_device(model)), ablation=ab, routing=routing, generator=gen).logits.cpu()

    base_z, abl_z = logits(None), logits(ablation)
    base, abl = torch.log_softmax(base_z.double(), -1), torch.log_softmax(abl_z.double(), -1)  # (B, T, V)
    raw = (base.exp() * (base - abl)).sum(-1)  # (B, T)
    kl = raw.clamp_min(0.0)
    top_b, top_a = base.argmax(-1), abl.argmax(-1)
    at = lambda lp, top: lp.gather(-1, top[..., None]).squeeze(-1)  # noqa: E731
    flipped = ((top_b != top_a) & (at(base, top_b) - at(base, top_a) > tie_tolerance(base_z))
               & (at(abl, top_a) - at(abl, top_b) > tie_tolerance(abl_z)))
    p_b, p_a = at(base, top_b).exp(), at(abl, top_b).exp()
    B, T = ids.shape
    b, t = (a.ravel() for a in np.meshgrid(np.arange(B), np.arange(T), indexing="ij"))
    df = pd.DataFrame({
        C.BATCH: b, C.POSITION: t, C.TOKEN_ID: ids.numpy().ravel(), C.KL: kl.numpy().ravel(),
        C.BASE_TOP: top_b.numpy().ravel(), C.ABLATED_TOP: top_a.numpy().ravel(),
        C.FLIPPED: flipped.numpy().ravel(), C.BASE_PROB: p_b.numpy().ravel(),
        C.ABLATED_PROB: p_a.numpy().ravel(), C.ABLATION: ablation.describe()})
    df.attrs["kl_clamped"] = int((raw < 0).sum())
    df.attrs["kl_lowest"] = float(raw.min()) if raw.numel() else 0.0
    return df


def _new_ids(g: Any) -> list[int]:
    return list(g.new_ids) if hasattr(g, "new_ids") else [int(x) for x in g]


def _probs(g: Any) -> list[float] | None:
    return [s.prob for s in g.steps] if hasattr(g, "steps") else None


def generation_diff(base_generation: Any, ablated_generation: Any, tokenizer: Any = None) -> pd.DataFrame:
    """Token-level alignment of two continuations (`Generation`s or lists of token ids) by
    difflib's longest-matching-blocks alignment. One row per aligned slot: op (equal, replace,
    insert = only in the ablated continuation, delete = only in the base), the step index and
    token id on each side (NA on the side that has none), the decoded tokens if a tokenizer is
    given, the model probability of each token when `Generation`s are given, and `changed`
    (every op but equal)."""
    a, b = _new_ids(base_generation), _new_ids(ablated_generation)
    pa, pb = _probs(base_generation), _probs(ablated_generation)
    rows = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        n = max(i2 - i1, j2 - j1)
        for k in range(n):
            i = i1 + k if i1 + k < i2 else None
            j = j1 + k if j1 + k < j2 else None
            kind = op if op == "equal" else ("replace" if i is not None and j is not None
                                             else "delete" if j is None else "insert")
            rows.append((kind, i, j))
    df = pd.DataFrame({
        C.OP: [r[0] for r in rows],
        C.BASE_INDEX: pd.array([r[1] for r in rows], dtype="Int64"),
        C.ABLATED_INDEX: pd.array([r[2] for r in rows], dtype="Int64"),
        C.BASE_TOKEN_ID: pd.array([None if r[1] is None else a[r[1]] for r in rows], dtype="Int64"),
        C.ABLATED_TOKEN_ID: pd.array([None if r[2] is None else b[r[2]] for r in rows], dtype="Int64"),
    })
    if tokenizer is not None:
        dec = lambda ids, i: None if i is None else tokenizer.decode([ids[i]])  # noqa: E731
        df[C.BASE_TOKEN] = pd.array([dec(a, r[1]) for r in rows], dtype="string")
        df[C.ABLATED_TOKEN] = pd.array([dec(b, r[2]) for r in rows], dtype="string")
    if pa is not None and pb is not None:
        df[C.BASE_PROB] = [np.nan if r[1] is None else pa[r[1]] for r in rows]
        df[C.ABLATED_PROB] = [np.nan if r[2] is None else pb[r[2]] for r in rows]
    df[C.CHANGED] = df[C.OP] != "equal"
    return df


def first_divergence(diff: pd.DataFrame) -> int | None:
    """Base step index of the first changed slot of a `generation_diff` (None if identical)."""
    changed = np.flatnonzero(diff[C.CHANGED].to_numpy())
    if not len(changed):
        return None
    k = int(changed[0])  # an insertion has no base index: it sits after the base tokens before it
    i = diff[C.BASE_INDEX].iloc[k]
    return int(i) if i is not pd.NA else int(diff[C.BASE_INDEX].iloc[:k].notna().sum())


__all__: Sequence[str] = ("ablation_effects", "generation_diff", "first_divergence")
