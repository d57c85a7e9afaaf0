"""Hugging Face transformers language models as a RouteScope family, on transformers' own classes.

Nothing here re-implements a model: `HFModel` holds the `AutoModelForCausalLM` that transformers
builds from the checkpoint and instruments it with permanent forward hooks, registered once at
load, that read the call in progress (`runtime.current()`: ablation) and the active trace
(`runtime.active_trace()`) from the same ContextVars as our own sites. Idle, a hook costs those two
ContextVar reads; nothing per call ever lives on a module, so one model serves every session.

Routing layers are the routers transformers records for `output_router_logits` (its
`OutputRecorder` for "router_logits": MixtralTopKRouter, Qwen2MoeTopKRouter, ... one per MoE
block), named by module path (`model.layers.3.mlp.gate`; gpt-oss: `model.layers.3.mlp.router`).
Dense layers (`first_k_dense_replace`, `decoder_sparse_step`, `mlp_only_layers`) have no router and
so no routing layer. Each router's sites, relative to its name (shapes as recorded):
- `<router>.logits`  [batch, pos, n_experts] what the router's linear computed (dropped experts -inf)
- `<router>.probs`   [batch, pos, n_experts] the router's own probabilities, taken from the op that
  computes them inside its forward (softmax: Mixtral, Qwen2/3-MoE, OLMoE; sigmoid scores:
  DeepSeek-V3). gpt-oss computes none (it takes a softmax over its top-k logits only): no site.
- `<router>.indices` [batch, pos, k] and `<router>.weights` [batch, pos, k]: exactly what the router
  returned (never recomputed: DeepSeek-V3's group-limited sigmoid routing with its correction bias
  and scaling factor differs from a softmax top-k).
- Qwen2-MoE's shared-expert gate: `model.layers.i.mlp.shared_expert_gate` [batch, pos, 1], the gate
  linear's output (the block multiplies the shared expert by its sigmoid).

Ablations go through the router's own code: a torch function mode, entered by the router's
pre-hook and left by its forward hook (thread-local, like every function mode), sets the logits of
dropped experts to -inf as the router's linear returns them (DeepSeek-V3 also sets their selection
scores, after its correction bias, to -1e9: finite, so its group scores stay ordered), so the
model's own selection and normalisation pick the next choices. Forcing expert e drops every other
routed expert: e then takes all the weight, and slots past the experts left are filled with weight
0 by the router's own top-k. Where a block has a shared expert (Qwen2-MoE, DeepSeek-V3) it is the
layer's last option ("shared expert", index n_experts): dropping it zeroes its output; it always
runs otherwise, so it cannot be forced.
"""
from __future__ import annotations

import json
import os
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from . import runtime
from .base import RouteScopeLM
from .config import BaseConfig
from .runtime import AblationError, KVCache
from .sites import RoutingLayer, Site


@dataclass(frozen=True)
class HFType:
    """What RouteScope needs to know about one transformers MoE model type (plain data)."""

    probs: str | None = "softmax"  # the op inside the router that computes its probabilities, if any
    choice_bias: str | None = None  # a router buffer added to the scores before selection (DeepSeek-V3)
    shared: str | None = None  # the MoE block's shared expert, relative to the block
    shared_gate: str | None = None  # the shared expert's gate linear, relative to the block


HF_TYPES: dict[str, HFType] = {
    "mixtral": HFType(),
    "qwen2_moe": HFType(shared="shared_expert", shared_gate="shared_expert_gate"),
    "qwen3_moe": HFType(),
    "olmoe": HFType(),
    "deepseek_v3": HFType(probs="sigmoid", choice_bias="e_score_correction_bias", shared="shared_experts"),
    "gpt_oss": HFType(probs=None),
}
# config fields that make a model type a mixture of experts (a type not in HF_TYPES with one is refused)
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")
WEIGHT_SUFFIXES = (".safetensors",)
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DROPPED_CHOICE = -1e9  # a dropped expert's selection score where -inf would break group sums
LOAD_BALANCE = "load_balance"  # the auxiliary loss term transformers computes with output_router_logits


def is_hf_config(d: dict) -> bool:
    """A transformers config.json: it names a `model_type` and no RouteScope family."""
    return isinstance(d, dict) and "model_type" in d and "family" not in d


def check_hf_directory(path: str | os.PathLike, d: dict) -> None:
    """ValueError unless `path` holds a loadable HF model: a supported MoE or a dense type, safetensors
    weights (pickled ones are refused without being opened)."""
    path = Path(path)
    model_type = d.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError(f"{path / 'config.json'}: model_type must be a string")
    if model_type not in HF_TYPES and any(d.get(f) for f in EXPERT_FIELDS):
        raise ValueError(f"{path}: model_type {model_type!r} is a mixture of experts RouteScope does not instrument; "
                         f"supported: {', '.join(HF_TYPES)} (dense models of any type open without routing layers)")
    files = [p.name for p in path.iterdir() if p.is_file()]
    if not any(f.endswith(WEIGHT_SUFFIXES) for f in files):
        pickled = [f for f in files if f.endswith(PICKLED_SUFFIXES)]
        if pickled:
            raise ValueError(f"{path}: only pickle-based weights ({', '.join(sorted(pickled)[:3])}); they are refused "
                             "(unpickling runs code): convert them to safetensors")
        raise ValueError(f"{path}: no *.safetensors weights")


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
        d.update(model_type=self.model_type, vocab_size=self.vocab_size, max_position_embeddings=self.context)
        object.__setattr__(self, "hf_config", json.dumps(d, sort_keys=True))

    def transformers_config(self) -> Any:
        from transformers import AutoConfig

        d = json.loads(self.hf_config)
        return AutoConfig.for_model(**d)

    @classmethod
    def from_hf_dict(cls, d: dict) -> "HFConfig":
        ctx = d.get("max_position_embeddings") or d.get("n_positions") or d.get("n_ctx") or 2048
        if "max_position_embeddings" not in d:  # GPT-2 names its context n_positions: keep the dict as written
            d = {**d, "max_position_embeddings": ctx}
        pad = d.get("pad_token_id")
        return cls(model_type=d["model_type"], hf_config=json.dumps(d, sort_keys=True),
                   vocab_size=int(d.get("vocab_size", 1)), context=int(ctx),
                   pad_id=int(pad) if isinstance(pad, int) and not isinstance(pad, bool) else -1)


def hf_param_count(config: HFConfig) -> int:
    """Parameters of the transformers model `config` describes (built on the meta device)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config.transformers_config())
    return sum(p.numel() for p in model.parameters())


class HFRoutingLayer(RoutingLayer):
    """The RouteScope face of one transformers router: its name, options and labels. Held by the
    HFModel in a plain dict (not a submodule: transformers' module tree stays as transformers built it)."""

    option_noun = "expert"
    can_force = True

    def __init__(self, name: str, n_experts: int, top_k: int, shared: bool) -> None:
        super().__init__()
        self.name, self.n_experts, self.top_k, self.shared = name, n_experts, top_k, shared
        self.n_options = n_experts + shared

    def option_labels(self) -> list[str]:
        return [f"expert {j}" for j in range(self.n_experts)] + (["shared expert"] if self.shared else [])


# --- per-call instrumentation (thread-local) -------------------------------------------------------

_BATCH: ContextVar[int] = ContextVar("routescope_hf_batch", default=1)  # rows of the call in progress
_OPEN: ContextVar[tuple] = ContextVar("routescope_hf_open", default=())  # (router, mode) entered, innermost last

_SOFTMAX = {F.softmax, torch.softmax, torch.Tensor.softmax}
_SIGMOID = {F.sigmoid, torch.sigmoid, torch.Tensor.sigmoid}
_ADD = {torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__}


class _InsideRouter(TorchFunctionMode):
    """Watches the ops of one router call: masks the logits (and DeepSeek-V3's selection scores) of
    the experts the call drops, and keeps the router's probabilities as its own op computed them."""

    def __init__(self, router: nn.Module, spec: HFType, dropped: frozenset[int], want_probs: bool) -> None:
        super().__init__()
        self.router, self.spec, self.dropped, self.want_probs = router, spec, sorted(dropped), want_probs
        self.logits: torch.Tensor | None = None
        self.probs: torch.Tensor | None = None
        self.bias = getattr(router, spec.choice_bias) if spec.choice_bias else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.logits is None:
            if func is F.linear:  # the router's one linear: its logits
                if self.dropped:
                    out = out.index_fill(-1, torch.tensor(self.dropped, device=out.device), float("-inf"))
                self.logits = out
        elif self.want_probs and self.probs is None and func in (_SOFTMAX if self.spec.probs == "softmax" else
                                                                 _SIGMOID if self.spec.probs == "sigmoid" else ()):
            self.probs = out
        elif self.bias is not None and self.dropped and func in _ADD and any(a is self.bias for a in args):
            out = out.index_fill(-1, torch.tensor(self.dropped, device=out.device), DROPPED_CHOICE)
        return out


class HFModel(RouteScopeLM):
    """A transformers causal LM with RouteScope's call interface (ablation, trace, KV cache)."""

    def __init__(self, config: HFConfig, hf_model: nn.Module | None = None) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM

        self.config, self.context, self.vocab_size = config, config.context, config.vocab_size
        self.hf = hf_model if hf_model is not None else AutoModelForCausalLM.from_config(config.transformers_config())
        self.spec = HF_TYPES.get(config.model_type)
        routers = _routers(self.hf) if self.spec is not None else {}
        hf_cfg = self.hf.config
        layers: dict[str, HFRoutingLayer] = {}
        sites: dict[str, Site] = {}
        self._router_names: dict[int, str] = {}  # id(router module) -> layer name (fixed at load)
        for name, router in routers.items():
            block = name.rsplit(".", 1)[0]
            shared = self.spec.shared is not None and _has(self.hf, f"{block}.{self.spec.shared}")
            n = int(getattr(router, "num_experts", 0) or router.weight.shape[0])
            k = int(getattr(router, "top_k", getattr(hf_cfg, "num_experts_per_tok", 1)))
            layers[name] = HFRoutingLayer(name, n, k, shared)
            self._router_names[id(router)] = name
            outs = {"logits": f"[batch, pos, {n}] router logits (dropped experts -inf)",
                    "indices": f"[batch, pos, {k}] experts the router selected, as it returned them",
                    "weights": f"[batch, pos, {k}] their weights, as the router returned them"}
            if self.spec.probs:
                outs["probs"] = f"[batch, pos, {n}] the router's {self.spec.probs} probabilities"
            for out, shape in outs.items():
                sites[f"{name}.{out}"] = _site(f"{name}.{out}", shape)
            router.register_forward_pre_hook(self._router_pre)
            router.register_forward_hook(self._router_post, always_call=True)
            if shared:
                expert = self.hf.get_submodule(f"{block}.{self.spec.shared}")
                expert.register_forward_hook(self._shared_hook(name, n))
            if self.spec.shared_gate and _has(self.hf, f"{block}.{self.spec.shared_gate}"):
                gate = f"{block}.{self.spec.shared_gate}"
                sites[gate] = _site(gate, "[batch, pos, 1] shared-expert gate logit (the block applies its sigmoid)")
                self.hf.get_submodule(gate).register_forward_hook(self._gate_hook(gate))
        self.routing_modules = layers
        self.sites = sites
        self.attn_layers = []

    # --- hooks (registered once; per-call state only in ContextVars) -----------------------------
    def _router_pre(self, module: nn.Module, args: tuple) -> None:
        st, tr = runtime.current(), runtime.active_trace()
        name = self._router_names[id(module)]
        dropped = self._dropped_experts(name, st.ablation)
        want_probs = tr is not None and self.spec.probs is not None and tr.wants(f"{name}.probs")
        if not dropped and not want_probs:
            return None
        mode = _InsideRouter(module, self.spec, dropped, want_probs)
        mode.__enter__()
        _OPEN.set(_OPEN.get() + ((module, mode),))
        return None

    def _router_post(self, module: nn.Module, args: tuple, output: Any) -> None:
        opened = _OPEN.get()
        mode = None
        if opened and opened[-1][0] is module:
            mode = opened[-1][1]
            _OPEN.set(opened[:-1])
            mode.__exit__(None, None, None)
        tr = runtime.active_trace()
        if tr is None or not isinstance(output, tuple):
            return None
        name = self._router_names[id(module)]
        logits, weights, indices = output[0], output[1], output[2]
        b = _BATCH.get()
        for out, x in (("logits", logits), ("indices", indices), ("weights", weights),
                       ("probs", mode.probs if mode is not None else None)):
            site = f"{name}.{out}"
            if x is not None and site in self.sites and tr.wants(site):
                tr.visit(site, x.reshape(b, -1, x.shape[-1]), 1, self.sites[site].shape)
        return None

    def _shared_hook(self, layer: str, option: int):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor):
            ab = runtime.current().ablation
            if not ab.is_empty and option in ab.dropped(layer):
                return torch.zeros_like(output)
            return None
        return hook

    def _gate_hook(self, site: str):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor):
            tr = runtime.active_trace()
            if tr is not None and tr.wants(site):
                tr.visit(site, output.reshape(_BATCH.get(), -1, output.shape[-1]), 1, self.sites[site].shape)
            return None
        return hook

    def _dropped_experts(self, layer: str, ab: runtime.Ablation) -> frozenset[int]:
        """The routed experts the call drops at `layer` (forcing one drops the others)."""
        if ab.is_empty:
            return frozenset()
        m = self.routing_modules[layer]
        forced = ab.forced(layer)
        if forced is not None:  # forcing a routed expert: every other routed expert is dropped
            return frozenset(range(m.n_experts)) - {forced}
        return frozenset(o for o in ab.dropped(layer) if o < m.n_experts)

    # --- RouteScopeLM -------------------------------------------------------------------------
    def forward(self, idx: torch.Tensor, **kw: Any):
        ab = kw.get("ablation")
        if ab is not None and not ab.is_empty:
            for layer, m in self.routing_modules.items():
                if m.shared and ab.forced(layer) == m.n_experts:
                    raise AblationError(f"invalid ablation: force {layer}:{m.n_experts}: the shared expert always "
                                        "runs; force a routed expert (0.."
                                        f"{m.n_experts - 1}) or drop the shared one")
                if len(self._dropped_experts(layer, ab)) >= m.n_experts:
                    raise AblationError(f"invalid ablation: drop: every routed expert of layer {layer!r} is "
                                        "dropped; at least one must remain")
        return super().forward(idx, **kw)

    def _forward(self, idx: torch.Tensor) -> torch.Tensor:
        st = runtime.current()
        past = st.cache.extra.get("hf") if st.cache is not None else None
        attention = None if st.pad_mask is None else (~st.pad_mask).long()
        if attention is not None and past is not None:
            raise ValueError("padding and a KV cache together are not supported for HF models")
        balance = st.training and bool(self.routing_modules)  # transformers' own load-balancing loss
        token = _BATCH.set(idx.shape[0])
        try:
            out = self.hf(input_ids=idx, attention_mask=attention, past_key_values=past,
                          use_cache=past is not None, **({"output_router_logits": True} if balance else {}))
        finally:
            _BATCH.reset(token)
        if balance and getattr(out, "aux_loss", None) is not None:
            st.aux[LOAD_BALANCE] = out.aux_loss
        return out.logits.float()

    def aux_weights(self) -> dict[str, float]:
        """Training: transformers' load-balancing loss, weighted by the model's router_aux_loss_coef."""
        coef = getattr(self.hf.config, "router_aux_loss_coef", None)
        return {LOAD_BALANCE: float(coef)} if coef is not None else {}

    @property
    def checkpoint_format(self) -> str:
        """How a saved copy is laid out (the trainer's model card says it)."""
        return (f"a Hugging Face transformers directory (`{type(self.hf).__name__}`, written by `save_pretrained`: "
                "config.json, model.safetensors, generation_config.json), with the project tokenizer; transformers "
                "opens it as it is")

    def write_checkpoint_files(self, path: Path, dtype: torch.dtype) -> None:
        """What `checkpoint.save_checkpoint` writes for this model: transformers' own save_pretrained
        (config.json, safetensors) of a copy in the storage dtype (the shared model is not touched)."""
        import copy

        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its "Writing model shards" bar: the caller reports what it wrote
        try:
            copy.deepcopy(self.hf).to(dtype).save_pretrained(path, safe_serialization=True)
        finally:
            if bars:
                hf_logging.enable_progress_bar()

    def new_cache(self) -> KVCache:
        from transformers import DynamicCache

        cache = KVCache(0)
        cache.extra["hf"] = DynamicCache(config=self.hf.config)
        return cache

    def active_params(self) -> int:
        """Per token: everything but the experts a token does not use (k of n routed experts)."""
        total = self.num_params()
        for name, m in self.routing_modules.items():
            experts = self.hf.get_submodule(name.rsplit(".", 1)[0] + ".experts")
            per_expert = sum(p.numel() for p in experts.parameters()) // m.n_experts
            total -= per_expert * (m.n_experts - m.top_k)
        return total


def _site(name: str, shape: str) -> Site:
    s = Site(shape)
    s.name = name
    return s


def _has(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
        return True
    except AttributeError:
        return False


def _routers(hf_model: nn.Module) -> dict[str, nn.Module]:
    """The routers transformers itself records for `output_router_logits`, by module path."""
    recorders = getattr(type(hf_model), "_can_record_outputs", None) or {}
    if not recorders:
        base = getattr(hf_model, "model", None)
        recorders = getattr(type(base), "_can_record_outputs", None) or {}
    rec = recorders.get("router_logits")
    cls = getattr(rec, "target_class", None)
    if cls is None:
        return {}
    return {name: m for name, m in hf_model.named_modules() if isinstance(m, cls)}


# --- loading ---------------------------------------------------------------------------------------

def load_hf(path: str | os.PathLike, d: dict, *, device: torch.device, dtype: torch.dtype) -> HFModel:
    """The transformers model in directory `path` (config dict `d`), from local files only, safetensors
    only (`check_hf_directory` ran first), wrapped and instrumented."""
    check_hf_directory(path, d)
    try:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ValueError(f"{path}: a Hugging Face transformers model ({d.get('model_type')}) needs the hf extra: "
                         "pip install -c constraints.txt -c constraints-hf.txt -e '.[hf]'") from None

    config = HFConfig.from_hf_dict(d)
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # its load report and progress bar go to stderr; RouteScope reports its own
    hf_logging.disable_progress_bar()
    try:
        if device.type == "meta":
            with torch.device("meta"):
                hf = AutoModelForCausalLM.from_config(config.transformers_config())
        else:
            hf = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, use_safetensors=True,
                                                      dtype=dtype, device_map=None)
            hf = hf.to(device)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ValueError(f"{path}: transformers could not load the model ({str(e).splitlines()[0]})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    return HFModel(config, hf).eval()


__all__ = ["HF_TYPES", "HFConfig", "HFModel", "HFRoutingLayer", "HFType", "check_hf_directory", "hf_param_count",
           "is_hf_config", "load_hf"]
