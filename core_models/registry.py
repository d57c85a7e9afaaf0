"""Named presets as plain data (litgpt-style): `from_name("papaformer-gumbel-v2", n_parallel_layers=3)`,
and building a family's model from its config. What each family is comes from its spec
(`routescope.families`)."""
from __future__ import annotations

import contextlib
import json
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .base import RouteScopeLM
from .config import BaseConfig, ConfigError, json_kind

def _hf(model_type: str, **fields: Any) -> str:
    """A transformers config as the JSON text an HF preset keeps (plain data, no transformers import)."""
    # the project tokenizer's <|endoftext|> (id 0) ends documents; <|pad|> is id 1; no BOS token
    special = dict(bos_token_id=None, eos_token_id=0, pad_token_id=1)
    return json.dumps({"model_type": model_type, "tie_word_embeddings": True, **special, **fields}, sort_keys=True)


# preset name -> (family, fields). Shipped checkpoints keep the paper ratios at d = 128, d' = 64,
# head dim 32, context 256.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    # pagmlp and its SwiGLU baseline llama-dense train the same way: dropout 0.1 as in PAGMLP §4
    "llama-dense": ("llama", dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, ffn="swiglu", ffn_dropout=0.1)),
    "llama-gqa": ("llama", dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn="swiglu")),
    "llama-geglu": ("llama", dict(d_model=128, n_layers=4, n_heads=4, ffn="geglu")),
    "pagmlp": ("llama", dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, ffn="pagmlp", ffn_dropout=0.1)),
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
    "moep-swiglu": ("moep", dict(expert="swiglu", ffn="swiglu")),  # MoEP Table 2: SwiGLU blocks and experts
    # tau 0.6, not the paper's 0.92: at d = 128 adjacent cosines rarely pass 0.92 (0.03% of pairs), and
    # trained with merges at 0.6 the model saves 6% of attention FLOPs per ATM layer (2% of the whole model)
    # at no loss (experiments/atm-merging.md)
    "wiola-tiny": ("wiola", dict(atm_tau=0.6)),
    # standard MoE models trained with transformers' own classes, at moep's active parameters per token
    # (d = 128, 4 layers, 4 heads, context 256, tied embeddings): a Mixtral-style model (4 experts, top-2)
    # and an OLMoE-style one (fine-grained: 16 small experts, top-4, QK-norm, no top-k renormalisation)
    "mixtral-tiny": ("hf", dict(model_type="mixtral", vocab_size=4096, context=256, hf_config=_hf(
        "mixtral", hidden_size=128, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02))),
    "olmoe-tiny": ("hf", dict(model_type="olmoe", vocab_size=4096, context=256, hf_config=_hf(
        "olmoe", hidden_size=128, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, num_experts=16, num_experts_per_tok=4, norm_topk_prob=False,
        router_aux_loss_coef=0.01))),
}


def _family(name: str) -> tuple[type[BaseConfig], type[RouteScopeLM], Any]:
    """Config class, model class and parameter count of a family, from its spec
    (`routescope.families`: built-in families and `routescope.families` entry points)."""
    from routescope.families import spec  # the spec module imports the family modules

    s = spec(name)
    return s.config, s.model, s.param_count


def register_presets(presets: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Families defined in other modules add their presets here (plain data only)."""
    PRESETS.update(presets)


def _all_presets() -> dict[str, tuple[str, Any]]:
    from routescope.families import presets  # importing the family modules registers their presets

    return {**presets(), **PRESETS}


def preset_names() -> list[str]:
    return sorted(_all_presets())


def from_name(name: str, **overrides: Any) -> BaseConfig:
    known = PRESETS if name in PRESETS else _all_presets()
    if name not in known:
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(sorted(known))}")
    family, fields = known[name]
    cfg_cls, _, _ = _family(family)
    return cfg_cls.from_dict({**fields, **overrides})


def config_from_dict(d: dict[str, Any]) -> BaseConfig:
    if not isinstance(d, dict):
        raise ConfigError(f"expected a JSON object of config fields, got {json_kind(d)}")
    if "family" not in d:
        raise ConfigError("config: missing field 'family'")
    cfg_cls, _, _ = _family(d["family"])
    return cfg_cls.from_dict(d)


class _SkipParameterInit(TorchFunctionMode):
    """Skips the random initialisation of parameters (nn.init.* and in-place fills on an nn.Parameter
    or a meta tensor).

    For a model whose every parameter is overwritten next (from a checkpoint): init is wasted work,
    about half of building a model (and on the meta device it would load torch's Python meta kernels,
    seconds per process). Everything else runs, so buffers computed in __init__ (RoPE/SRPE tables)
    are exact. A torch function mode is thread-local: models built meanwhile in other threads are
    initialised as usual."""

    _FILLS = frozenset({"normal_", "uniform_", "zero_", "fill_", "copy_"})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        if (isinstance(target, nn.Parameter) or (isinstance(target, torch.Tensor) and target.is_meta)) and (
                getattr(func, "__module__", None) == "torch.nn.init" or getattr(func, "__name__", None) in self._FILLS):
            return target
        return func(*args, **kwargs)


def build_model(config: BaseConfig, *, device: str | torch.device | None = None, init: bool = True) -> RouteScopeLM:
    """The model `config` describes. device="meta" builds shapes only (no memory); init=False leaves
    parameters uninitialised (torch.empty) for the caller to fill in."""
    _, model_cls, _ = _family(config.family)
    with contextlib.ExitStack() as stack:
        if device is not None:
            stack.enter_context(torch.device(device))
        if not init:
            stack.enter_context(_SkipParameterInit())
        return model_cls(config)


def param_count(config: BaseConfig) -> int:
    """Closed-form parameter count of the model `config` builds."""
    _, _, count = _family(config.family)
    return count(config)
