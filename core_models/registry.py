"""The model half of every family as plain data (litgpt-style): config class, model class, closed-form
parameter count and named presets (`from_name("papaformer-gumbel-v2", n_parallel_layers=3)`), and
building a family's model from its config. Families from outside the repository come from
`core_models.plugins`; what each family offers above this layer (views, drawers, pages) is registered
by those layers, and `routescope.families` joins them."""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from . import hf, llama, moep, papaformer, pgpt, plugins, wiola
from .base import RouteScopeLM
from .config import BaseConfig, ConfigError, json_kind, short_repr


@dataclass(frozen=True)
class ModelFamily:
    """What a family is: `config` and `model` classes, `param_count(config)` in closed form, and its
    presets (preset name -> config fields)."""

    name: str
    config: type[BaseConfig]
    model: type[RouteScopeLM]
    param_count: Callable[[Any], int]
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    description: str = ""


def _hf(model_type: str, **fields: Any) -> str:
    """A transformers config as the JSON text an HF preset keeps (plain data, no transformers import)."""
    # the project tokenizer's <|endoftext|> (id 0) ends documents; <|pad|> is id 1; no BOS token
    special = dict(bos_token_id=None, eos_token_id=0, pad_token_id=1)
    return json.dumps({"model_type": model_type, "tie_word_embeddings": True, **special, **fields}, sort_keys=True)


# Shipped checkpoints keep the paper ratios at d = 128, d' = 64, head dim 32, context 256.
MODEL_FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("llama", llama.LlamaConfig, llama.Llama, llama.llama_param_count, {
        # pagmlp and its SwiGLU baseline llama-dense train the same way: dropout 0.1 as in PAGMLP §4
        "llama-dense": dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, ffn="swiglu", ffn_dropout=0.1),
        "llama-gqa": dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn="swiglu"),
        "llama-geglu": dict(d_model=128, n_layers=4, n_heads=4, ffn="geglu"),
        "pagmlp": dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, ffn="pagmlp", ffn_dropout=0.1),
        "path": dict(d_model=64, n_layers=3, n_heads=2, n_kv_heads=2, ffn="swiglu", ffn_hidden=256),
    }, "Llama-style decoder; PAGMLP's parallel SwiGLU/GEGLU pathways with ffn='pagmlp'"),
    ModelFamily("papaformer", papaformer.PapaformerConfig, papaformer.Papaformer, papaformer.papaformer_param_count, {
        # N = 3 parallel layers (paper Tables 2 and 6); Share-Linear grows k*d' -> d in its last Share
        "papaformer-share-linear": dict(combiner="share_linear", n_parallel_layers=3, fused_grow=True),
        "papaformer-gumbel-v1": dict(combiner="gumbel_v1", n_parallel_layers=3),
        "papaformer-gumbel-v2": dict(combiner="gumbel_v2", n_parallel_layers=3),
    }, "PaPaformer: parallel paths between full layers, Share-Linear or Gumbel combiners"),
    ModelFamily("pgpt", pgpt.PGPTConfig, pgpt.PGPT, pgpt.pgpt_param_count, {
        "pgpt": dict(d_model=128, n_layers=4, n_paths=2, n_heads=4),
        "pgpt-sigmoid": dict(d_model=128, n_layers=4, n_paths=2, n_heads=4, mix="sigmoid"),
    }, "ParallelGPT: P paths mixed by learned weights"),
    ModelFamily("lgpt", pgpt.ShrinkGPTConfig, pgpt.ShrinkGPT, pgpt.shrink_gpt_param_count, {
        "lgpt": dict(d_model=128, n_layers=4, n_heads=4, halve_every=2),
    }, "ParallelGPT's LinearGPT: width halved every few layers"),
    ModelFamily("cgpt", pgpt.CGPTConfig, pgpt.ShrinkGPT, pgpt.shrink_gpt_param_count, {
        "cgpt": dict(d_model=128, n_layers=4, n_heads=4, halve_every=2),
    }, "ParallelGPT's ConvGPT: width halved by convolutions"),
    ModelFamily("moep", moep.MoEPConfig, moep.MoEP, moep.moep_param_count, {
        "moep": dict(expert="linear"),
        "moep-swiglu": dict(expert="swiglu", ffn="swiglu"),  # MoEP Table 2: SwiGLU blocks and experts
    }, "MoEP: top-k routing across parallel blocks, MoE shrink/grow"),
    ModelFamily("wiola", wiola.WiolaConfig, wiola.Wiola, wiola.wiola_param_count, {
        # tau 0.6, not the paper's 0.92: at d = 128 adjacent cosines rarely pass 0.92 (0.03% of pairs), and
        # trained with merges at 0.6 the model saves 6% of attention FLOPs per ATM layer (2% of the whole
        # model) at no loss (experiments/atm-merging.md)
        "wiola-tiny": dict(atm_tau=0.6),
        **wiola.PAPER_PRESETS,
    }, "Wiola: SRPE, GCLA, ATM, DSFF, WiolaRMSNorm"),
    # Hugging Face transformers models (config.label = their model_type), instrumented, not re-implemented;
    # standard MoE models trained with transformers' own classes, at moep's active parameters per token
    # (d = 128, 4 layers, 4 heads, context 256, tied embeddings): a Mixtral-style model (4 experts, top-2)
    # and an OLMoE-style one (fine-grained: 16 small experts, top-4, QK-norm, no top-k renormalisation)
    ModelFamily("hf", hf.HFConfig, hf.HFModel, hf.hf_param_count, {
        "mixtral-tiny": dict(model_type="mixtral", vocab_size=4096, context=256, hf_config=_hf(
            "mixtral", hidden_size=128, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02)),
        "olmoe-tiny": dict(model_type="olmoe", vocab_size=4096, context=256, hf_config=_hf(
            "olmoe", hidden_size=128, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, num_experts=16, num_experts_per_tok=4, norm_topk_prob=False,
            router_aux_loss_coef=0.01)),
    }, "transformers MoE models, routed as transformers routes them"),
)
_BUILTIN = {f.name: f for f in MODEL_FAMILIES}
assert tuple(_BUILTIN) == plugins.BUILTIN_NAMES, "plugins.BUILTIN_NAMES lists the built-in families"

# preset name -> (family, fields), the built-in families' (plugins add theirs: `presets()`)
PRESETS: dict[str, tuple[str, Mapping[str, Any]]] = {
    name: (f.name, fields) for f in MODEL_FAMILIES for name, fields in f.presets.items()}


def family_names() -> list[str]:
    """Every family: built-in ones, then plugins."""
    return [*_BUILTIN, *plugins.plugins()]


def model_family(name: Any) -> ModelFamily:
    """The model half of family `name` (built in or a plugin's); ConfigError in one line naming the
    known families (and why a plugin of that name did not load)."""
    if isinstance(name, str) and name in _BUILTIN:
        return _BUILTIN[name]
    spec = plugins.plugin(name) if isinstance(name, str) else None
    if spec is not None:
        return ModelFamily(spec.name, spec.config, spec.model, spec.param_count,
                           getattr(spec, "presets", {}), getattr(spec, "description", ""))
    what = "unknown" if isinstance(name, str) else f"expected a string, got {json_kind(name)}"
    raise ConfigError(f"family = {short_repr(name)}: {what}; known families: {', '.join(family_names())}")


def _family(name: str) -> tuple[type[BaseConfig], type[RouteScopeLM], Any]:
    f = model_family(name)
    return f.config, f.model, f.param_count


def presets() -> dict[str, tuple[str, Mapping[str, Any]]]:
    """Every preset: plugins' first, the built-in ones win a clash."""
    extra = {name: (s.name, fields) for s in plugins.plugins().values()
             for name, fields in getattr(s, "presets", {}).items()}
    return {**extra, **PRESETS}


def preset_names() -> list[str]:
    return sorted(presets())


def from_name(name: str, **overrides: Any) -> BaseConfig:
    known = PRESETS if name in PRESETS else presets()
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
