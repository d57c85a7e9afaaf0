"""Families and named presets as plain data (litgpt-style): `from_name("papaformer-gumbel-v2", n_parallel_layers=3)`."""
from __future__ import annotations

import importlib
from typing import Any

from .base import RouteScopeLM
from .config import BaseConfig, ConfigError

# family -> (module, config class, model class, parameter-count function)
FAMILIES: dict[str, tuple[str, str, str, str]] = {
    "llama": ("llama", "LlamaConfig", "Llama", "llama_param_count"),
    "papaformer": ("papaformer", "PapaformerConfig", "Papaformer", "papaformer_param_count"),
    "pgpt": ("pgpt", "PGPTConfig", "PGPT", "pgpt_param_count"),
    "lgpt": ("pgpt", "ShrinkGPTConfig", "ShrinkGPT", "shrink_gpt_param_count"),
    "cgpt": ("pgpt", "CGPTConfig", "ShrinkGPT", "shrink_gpt_param_count"),
    "moep": ("moep", "MoEPConfig", "MoEP", "moep_param_count"),
    "wiola": ("wiola", "WiolaConfig", "Wiola", "wiola_param_count"),
}

# preset name -> (family, fields). Shipped checkpoints keep the paper ratios at d = 128, d' = 64,
# head dim 32, context 256.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-dense": ("llama", dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, ffn="swiglu")),
    "llama-gqa": ("llama", dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn="swiglu")),
    "llama-geglu": ("llama", dict(d_model=128, n_layers=4, n_heads=4, ffn="geglu")),
    "pagmlp": ("llama", dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, ffn="pagmlp", pagmlp_dropout=0.1)),
    "path": ("llama", dict(d_model=64, n_layers=3, n_heads=2, n_kv_heads=2, ffn="swiglu", ffn_hidden=256)),
    # N = 3 parallel layers (paper Tables 2 and 6); Share-Linear grows k*d' -> d in its last Share
    "papaformer-share-linear": ("papaformer", dict(combiner="share_linear", n_parallel_layers=3, fused_grow=True)),
    "papaformer-gumbel-v1": ("papaformer", dict(combiner="gumbel_v1", n_parallel_layers=3)),
    "papaformer-gumbel-v2": ("papaformer", dict(combiner="gumbel_v2", n_parallel_layers=3)),
    "pgpt": ("pgpt", dict(d_model=128, n_layers=4, n_paths=2, n_heads=4)),
    "pgpt-sigmoid": ("pgpt", dict(d_model=128, n_layers=4, n_paths=2, n_heads=4, mix="sigmoid")),
    "lgpt": ("lgpt", dict(d_model=128, n_layers=4, n_heads=4, halve_every=2)),
    "cgpt": ("cgpt", dict(d_model=128, n_layers=4, n_heads=4, halve_every=2)),
    "moep": ("moep", dict(expert="linear")),
    "moep-swiglu": ("moep", dict(expert="swiglu")),
    "wiola-tiny": ("wiola", dict()),
}


def _family(name: str) -> tuple[type[BaseConfig], type[RouteScopeLM], Any]:
    if name not in FAMILIES:
        raise ConfigError(f"family = {name!r}: unknown; known families: {', '.join(FAMILIES)}")
    mod, cfg, model, count = FAMILIES[name]
    m = importlib.import_module(f"core_models.{mod}")
    return getattr(m, cfg), getattr(m, model), getattr(m, count)


def register_presets(presets: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Families defined in other modules add their presets here (plain data only)."""
    PRESETS.update(presets)


def preset_names() -> list[str]:
    _load_family_presets()
    return sorted(PRESETS)


def _load_family_presets() -> None:
    for fam in FAMILIES:  # importing a family module registers its extra presets, if any
        _family(fam)


def from_name(name: str, **overrides: Any) -> BaseConfig:
    if name not in PRESETS:
        _load_family_presets()
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    family, fields = PRESETS[name]
    cfg_cls, _, _ = _family(family)
    return cfg_cls.from_dict({**fields, **overrides})


def config_from_dict(d: dict[str, Any]) -> BaseConfig:
    if "family" not in d:
        raise ConfigError("config: missing field 'family'")
    cfg_cls, _, _ = _family(d["family"])
    return cfg_cls.from_dict(d)


def build_model(config: BaseConfig) -> RouteScopeLM:
    _, model_cls, _ = _family(config.family)
    return model_cls(config)


def param_count(config: BaseConfig) -> int:
    """Closed-form parameter count of the model `config` builds."""
    _, _, count = _family(config.family)
    return count(config)
