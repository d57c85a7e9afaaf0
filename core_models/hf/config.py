"""A transformers model's config as RouteScope holds it (`HFConfig`), and recognising one."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import torch

from ..config import BaseConfig

def is_hf_config(d: dict) -> bool:
    """A transformers config.json: it names a `model_type` and no RouteScope family."""
    return isinstance(d, dict) and "model_type" in d and "family" not in d


@dataclass(frozen=True)
class HFConfig(BaseConfig):
    """A transformers model as RouteScope sees it: its model_type (the label everywhere: app,
    catalog, the export's family column) and its own config, kept as the JSON transformers wrote."""

    family = "hf"
    model_type: str = ""
    hf_config: str = "{}"  # transformers' config.json text
    vocab_size: int = 1
    context: int = 1
    pad_id: int = -1

    @property
    def label(self) -> str:
        return self.model_type

    def validate(self) -> None:
        self.positive("vocab_size", "context")
        try:
            d = json.loads(self.hf_config)
        except json.JSONDecodeError as e:
            self.fail("hf_config", f"not JSON ({e})")
        self.require(isinstance(d, dict) and d.get("model_type", self.model_type) == self.model_type, "hf_config",
                     "must be a transformers config object of the same model_type")
        # vocab_size and context given to the preset (the tokenizer's size) win over the stored config's
        d.update(model_type=self.model_type)
        _text(d).update(vocab_size=self.vocab_size, max_position_embeddings=self.context)
        object.__setattr__(self, "hf_config", json.dumps(d, sort_keys=True))

    def transformers_config(self) -> Any:
        # transformers is optional (the hf extra): imported when an HF model is used
        from transformers import AutoConfig

        d = _decode_floats(json.loads(self.hf_config))
        return AutoConfig.for_model(**d)

    @classmethod
    def from_hf_dict(cls, d: dict) -> "HFConfig":
        d = json.loads(json.dumps(d))  # a copy: nested configs are updated in place below
        t = _text(d)
        ctx = t.get("max_position_embeddings") or t.get("n_positions") or t.get("n_ctx") or 2048
        if "max_position_embeddings" not in t:  # GPT-2 names its context n_positions: keep the dict as written
            t["max_position_embeddings"] = ctx
        pad = t.get("pad_token_id", d.get("pad_token_id"))
        return cls(model_type=d["model_type"], hf_config=json.dumps(d, sort_keys=True),
                   vocab_size=int(t.get("vocab_size", 1)), context=int(ctx),
                   pad_id=int(pad) if isinstance(pad, int) and not isinstance(pad, bool) else -1)


def _transformers_version() -> str:
    # transformers is optional (the hf extra): imported when an HF model is used
    import transformers

    return transformers.__version__


def _decode_floats(x: Any) -> Any:
    """transformers writes inf and nan in config.json as {"__float__": "Infinity"}: read them back."""
    if isinstance(x, dict):
        if set(x) == {"__float__"}:
            return float(x["__float__"])
        return {k: _decode_floats(v) for k, v in x.items()}
    return [_decode_floats(v) for v in x] if isinstance(x, list) else x


def _text(d: dict) -> dict:
    """The part of a config.json that describes the language model: an umbrella config's (Llama-4,
    Qwen3.5-MoE, Gemma-4, ...) nested `text_config`, else the config itself."""
    t = d.get("text_config")
    return t if isinstance(t, dict) and "vocab_size" in t else d


def hf_param_count(config: HFConfig) -> int:
    """Parameters of the transformers model `config` describes (built on the meta device)."""
    with torch.device("meta"):
        model = build_causal_lm(config.transformers_config())
    return sum(p.numel() for p in model.parameters())


def causal_lm_class(model_type: Any, architectures: Any = None) -> Any:
    """transformers' class that builds `model_type` as a causal LM: `AutoModelForCausalLM` where the
    auto mapping files the type there; else a `*ForCausalLM` class of transformers' own, taking this
    type's config, that `architectures` (config.json) names or another auto mapping files for the type
    (transformers registers Mistral4ForCausalLM under image-text-to-text). None: there is none."""
    # transformers is optional (the hf extra): imported when an HF model is used
    import transformers
    from transformers.models.auto import modeling_auto  # optional too (the hf extra)

    if model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return transformers.AutoModelForCausalLM
    names = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    names += [m[model_type] for k, m in vars(modeling_auto).items() if k.endswith("_MAPPING_NAMES")
              and isinstance(m, dict) and isinstance(m.get(model_type), str)]
    for name in dict.fromkeys(n for n in names if n.endswith("ForCausalLM")):
        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) and \
                getattr(cls.config_class, "model_type", None) == model_type:
            return cls
    return None


# transformers builds a model under `local_torch_dtype(config.dtype)`: torch's default dtype, set for the
# whole process, so two threads building at once (the app's background jobs beside a session's load) can
# leave it float16 for good; every build and from_pretrained takes this lock
DEFAULT_DTYPE_LOCK = threading.RLock()


def build_causal_lm(config: Any, **kwargs: Any) -> Any:
    """The causal LM transformers builds from its `config` (random weights; `kwargs`: dtype), by
    `causal_lm_class`; never a directory's own code."""
    cls = causal_lm_class(config.model_type, getattr(config, "architectures", None))
    if cls is None:
        raise ValueError(f"model_type {config.model_type!r} is not a causal language model this transformers "
                         f"({_transformers_version()}) knows")
    with DEFAULT_DTYPE_LOCK:
        if hasattr(cls, "_model_mapping"):  # the auto class
            return cls.from_config(config, trust_remote_code=False, **kwargs)
        return cls._from_config(config, **kwargs)

