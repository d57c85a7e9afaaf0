import torch

from routescope.core_models import build_model, from_name

# tiny variants of every preset family: (preset, overrides)
TINY = {
    "llama": ("llama-dense", dict(vocab_size=97, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, context=48)),
    "llama-gqa": ("llama-gqa", dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, context=48)),
    "pagmlp": ("pagmlp", dict(vocab_size=97, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, context=48)),
    # the unfused Share-Linear (N = 2) keeps every layer's path/combined cosine defined for the analysis
    # tests; "share_linear_paper" is the shipped form (N = 3, last Share k*d' -> d)
    "share_linear": ("papaformer-share-linear", dict(vocab_size=97, d_model=32, d_par=16, n_heads=2, n_par_heads=2,
                                                     n_paths=3, n_parallel_layers=2, fused_grow=False, context=48)),
    "share_linear_paper": ("papaformer-share-linear",
                           dict(vocab_size=97, d_model=32, d_par=16, n_heads=2, n_par_heads=2, context=48)),
    "gumbel_v1": ("papaformer-gumbel-v1", dict(vocab_size=97, d_model=32, d_par=16, n_heads=2, n_par_heads=2,
                                               n_paths=3, n_parallel_layers=3, context=48)),
    "gumbel_v2": ("papaformer-gumbel-v2",
                  dict(vocab_size=97, d_model=32, d_par=16, n_heads=2, n_par_heads=2, n_parallel_layers=2, context=48)),
    "pgpt": ("pgpt", dict(vocab_size=97, d_model=32, n_layers=4, n_paths=2, n_heads=2, context=48)),
    "pgpt3": ("pgpt", dict(vocab_size=97, d_model=32, n_layers=3, n_paths=3, n_heads=2, context=48)),
    "pgpt_sigmoid": ("pgpt-sigmoid", dict(vocab_size=97, d_model=32, n_layers=2, n_heads=2, context=48)),
    "lgpt": ("lgpt", dict(vocab_size=97, d_model=32, n_layers=4, n_heads=2, halve_every=2, context=48)),
    "cgpt": ("cgpt", dict(vocab_size=97, d_model=32, n_layers=4, n_heads=2, halve_every=2, context=48)),
    "moep": ("moep", dict(vocab_size=97, d_model=32, d_par=16, n_heads=2, n_par_heads=1, n_blocks=3, top_k=2,
                          n_experts=3, expert_top_k=2, context=48)),
    "moep_swiglu": ("moep-swiglu", dict(vocab_size=97, d_model=32, d_par=16, n_heads=2, n_par_heads=1, n_blocks=4,
                                        top_k=1, n_experts=4, expert_top_k=1, context=48)),
    "wiola": ("wiola-tiny", dict(vocab_size=97, d_model=32, n_layers=6, n_heads=4, n_kv_heads=2, context=48)),
}


def tiny_model(key: str, seed: int = 0, **extra):
    preset, over = TINY[key]
    torch.manual_seed(seed)
    model = build_model(from_name(preset, **{**over, **extra})).eval()
    with torch.no_grad():  # move learned scalars off their init so blends are not symmetric
        for name, p in model.named_parameters():
            if p.dim() <= 1 and not name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    return model
