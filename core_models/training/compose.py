"""Compose a PaPaformer from pre-trained path models, as the paper does.

Each path model (a `llama` of width d') contributes its blocks: block i of path j becomes path j of
parallel layer i, so N = the paths' depth (3 with the `path` preset, as in the paper's Tables 2 and 6
and the reference train.py, which fills parallel layers 1-3 from 3-layer paths). The token
embeddings (and the tied output projection) are concatenated along the hidden dimension, so
d = sum of the path widths. The configuration is the combiner's preset (e.g. Share-Linear's fused
k*d' -> d grow) with the paths' sizes. Full layers, the shrink/grow connections and the combiner
are new and are trained afterwards on mixed data.

Initial combiners (`combiner_init`): "mean" (default), a pass-through of the paths' sum
(Share-Linear) or mean (Gumbel) in the inner layers; Share-Linear's last Share (k*d' -> d = k*d')
starts as the identity, so the full-width stream receives the concatenation [path 0 | path 1 | ...],
aligned with the concatenated embeddings and head. "normal": the Gumbel combiner keeps the
model's own initialisation, N(0, 0.02) weights and zero bias, as the reference train.py leaves it
(`model.apply(init_weights)` before the paths are loaded). With "mean" the combined candidate
starts as the average of the paths, a hedge that is never worse than a wrong path, and Gumbel
routers learn to pick it for nearly every token (checkpoints/experiments/gumbel-routing.md);
with "normal" it starts near zero and must earn its share, as in the paper.

`shrink_from=j` initialises the shrink connection to read path j's half of the embedding (and,
with no full layer before the parallel layers, path j then sees exactly its own embedding): the
composed model with every other path dropped then reproduces path j's hidden states at the
parallel layers (and, with Share-Linear, path j's slot of the grown output). That is how the tests
check that composition keeps each path's function.
"""
from __future__ import annotations

import torch

from ..llama import Llama
from ..papaformer import Papaformer
from ..registry import from_name

COMBINER_INITS = ("mean", "normal")
PRESETS = {"share_linear": "papaformer-share-linear", "gumbel_v1": "papaformer-gumbel-v1",
           "gumbel_v2": "papaformer-gumbel-v2"}


def compose(paths: list[Llama], combiner: str, *, n_large_pre: int = 1, n_large_post: int = 1,
            n_heads: int | None = None, shrink_from: int | None = None, seed: int = 0,
            combiner_init: str = "mean", **overrides) -> Papaformer:
    first = paths[0].config
    problems = [f"path {j}: {f}={getattr(p.config, f)} differs from path 0 ({getattr(first, f)})"
                for j, p in enumerate(paths[1:], 1)
                for f in ("d_model", "n_layers", "n_heads", "vocab_size", "context", "hidden", "norm_eps", "rope_base")
                if getattr(p.config, f) != getattr(first, f)]
    if first.n_kv_heads != first.n_heads:
        problems.append("paths with grouped-query attention cannot become PaPaformer blocks")
    if first.ffn != "swiglu":
        problems.append(f"path ffn {first.ffn!r}: PaPaformer blocks are SwiGLU")
    if first.hidden % first.d_model:
        problems.append(f"path ffn_hidden {first.hidden} is not a multiple of its width {first.d_model}")
    if combiner not in PRESETS:
        problems.append(f"combiner {combiner!r}: expected one of {', '.join(PRESETS)}")
    if combiner_init not in COMBINER_INITS:
        problems.append(f"combiner_init {combiner_init!r}: expected one of {', '.join(COMBINER_INITS)}")
    if problems:
        raise ValueError("cannot compose: " + "; ".join(problems))
    dp, k = first.d_model, len(paths)
    torch.manual_seed(seed)
    config = from_name(PRESETS[combiner], vocab_size=first.vocab_size, d_model=k * dp, d_par=dp,
                       n_heads=n_heads or k * first.n_heads, n_par_heads=first.n_heads,
                       n_large_pre=n_large_pre, n_parallel_layers=first.n_layers, n_paths=k,
                       n_large_post=n_large_post, ffn_mult=first.hidden // dp, context=first.context,
                       norm_eps=first.norm_eps, tie_embeddings=True, **overrides)
    model = Papaformer(config)
    with torch.no_grad():
        model.embed.weight.copy_(torch.cat([p.embed.weight for p in paths], dim=1))  # (V, k*d')
        for i, layer in enumerate(model.parallel):
            for j, p in enumerate(paths):
                layer.paths[j].block.load_state_dict(p.blocks[i].state_dict())
            eye = torch.eye(dp)
            if not config.has_combined_route and layer.combine.out_features == k * dp:  # Share-Linear, fused grow: identity
                layer.combine.weight.copy_(torch.eye(k * dp))  # (d, k*d'): [path 0 | path 1 | ...]
            elif not config.has_combined_route:  # Share-Linear
                layer.combine.weight.copy_(torch.cat([eye] * k, dim=1))  # sum of the paths
            elif combiner_init == "mean":
                layer.combine.weight.copy_(torch.cat([eye / k] * k, dim=1))  # mean of the paths
                layer.combine.bias.zero_()
            # Gumbel, combiner_init "normal": the model's own N(0, 0.02) init stays
        if shrink_from is not None:
            sel = torch.zeros(dp, k * dp)
            sel[:, shrink_from * dp:(shrink_from + 1) * dp] = torch.eye(dp)
            model.shrink.weight.copy_(sel)
    return model.eval()
