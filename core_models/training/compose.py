"""Compose a PaPaformer from pre-trained path models, as the paper does.

Each path model (a `llama` of width d') contributes its blocks: block i of path j becomes path j of
parallel layer i. The token embeddings (and the tied output projection) are concatenated along the
hidden dimension, so d = sum of the path widths. Full layers, the shrink/grow connections and the
combiner are new and are trained afterwards on mixed data.

`shrink_from=j` initialises the shrink connection to read path j's half of the embedding (and,
with no full layer before the parallel layers, path j then sees exactly its own embedding), and the
combiners start as pass-throughs of the paths' sum: the composed model with every other path
dropped then reproduces path j's hidden states at the parallel layers. That is how the tests
check that composition keeps each path's function.
"""
from __future__ import annotations

import torch

from ..llama import Llama
from ..papaformer import Papaformer, PapaformerConfig


def compose(paths: list[Llama], combiner: str, *, n_large_pre: int = 1, n_large_post: int = 1,
            n_heads: int | None = None, shrink_from: int | None = None, seed: int = 0, **overrides) -> Papaformer:
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
    if problems:
        raise ValueError("cannot compose: " + "; ".join(problems))
    dp, k = first.d_model, len(paths)
    torch.manual_seed(seed)
    config = PapaformerConfig(vocab_size=first.vocab_size, d_model=k * dp, d_par=dp,
                              n_heads=n_heads or k * first.n_heads, n_par_heads=first.n_heads,
                              n_large_pre=n_large_pre, n_parallel_layers=first.n_layers, n_paths=k,
                              n_large_post=n_large_post, combiner=combiner, ffn_mult=first.hidden // dp,
                              context=first.context, norm_eps=first.norm_eps, tie_embeddings=True, **overrides)
    model = Papaformer(config)
    with torch.no_grad():
        model.embed.weight.copy_(torch.cat([p.embed.weight for p in paths], dim=1))  # (V, k*d')
        for i, layer in enumerate(model.parallel):
            for j, p in enumerate(paths):
                layer.paths[j].block.load_state_dict(p.blocks[i].state_dict())
            eye = torch.eye(dp)
            if combiner == "share_linear":
                layer.combine.weight.copy_(torch.cat([eye] * k, dim=1))  # sum of the paths
            else:
                layer.combine.weight.copy_(torch.cat([eye / k] * k, dim=1))  # mean of the paths
                layer.combine.bias.zero_()
        if shrink_from is not None:
            sel = torch.zeros(dp, k * dp)
            sel[:, shrink_from * dp:(shrink_from + 1) * dp] = torch.eye(dp)
            model.shrink.weight.copy_(sel)
    return model.eval()
