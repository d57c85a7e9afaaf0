"""Hugging Face transformers language models as a RouteScope family, on transformers' own classes.

Nothing here re-implements a model: `HFModel` holds the `AutoModelForCausalLM` that transformers
builds from the checkpoint and instruments it by wrapping, once at load, the `forward` of each router,
experts module, shared expert, decoder layer and routing layer's attention (`_wrap`: an instance
attribute that calls the module's own forward). A wrapper reads the call in progress
(`current()`: ablation) and the active trace (`active_trace()`) from the same
ContextVars as our own sites. Idle, it costs those ContextVar reads and one Python call; no
RouteScope hook sits on a module (a hook sends every call of its module down torch's slow path,
which cost about 2.5% of a tiny Mixtral's forward), and nothing per call ever lives on a module, so
one model serves every session. A wrapper can also skip a computation: a routing decoder layer's
attention returns a captured output when a ContextVar names it (`resume`, prefix reuse).

Which modules route is read from transformers itself, for every MoE model type it ships, at module
boundaries (`moe_layout`):
- the **router** of each MoE block is a module of the class transformers records for
  `output_router_logits` (`_can_record_outputs["router_logits"]`, an `OutputRecorder`); its module
  path is the routing layer's name (`model.layers.3.mlp.gate`, `...block_sparse_moe.router`);
- the **experts** are the router's sibling `experts`, which every MoE block calls as
  `experts(hidden, top_k_index, top_k_weights)`: a block that calls them otherwise (Llama-4 scales
  the tokens first) or has none (Doge, JetMoE) is refused in one line saying so;
- a **shared expert** is a sibling named `shared*` (its gate, `shared*gate`, is a site).

Each routing layer's roles and their sites (`HFRoutingLayer.roles`; shapes as recorded):
- `logits`  `<router>.logits`  [batch, pos, n] the router's output at the recorder's `index`
  (dropped experts -inf);
- `indices` `<router>.indices` [batch, pos, k] and `weights` `<router>.weights` [batch, pos, k]: the
  experts module's inputs, exactly what the block routed with;
- `probs`   `<router>.probs`   [batch, pos, n] the router's own probabilities, by one rule: the first
  softmax or sigmoid the router applies to a tensor of its logits' shape (gpt-oss applies its softmax
  to the top-k logits only: no site).

Ablations go through the router's own code: a torch function mode, entered around the router's
forward by its wrapper (thread-local, like every function mode), sets the logits of dropped
experts to -inf as the router's linear returns them, and where the router adds a selection bias
(any router tensor named `*bias` with one entry per expert that the router *adds*:
DeepSeek-V3's `e_score_correction_bias`, ...) sets the dropped experts' biased scores to -1e9
(finite, so group sums stay ordered). The model's own selection and normalisation then pick the
next choices. Forcing expert e drops every other routed expert. A shared expert is the layer's last
option ("shared expert"): dropping it zeroes its output; it always runs otherwise, so it cannot be
forced.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import types
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from safetensors import SafetensorError
from torch.overrides import TorchFunctionMode

from .ablation import Ablation
from .base import RouteScopeLM
from .config import BaseConfig
from .devices import DTYPES, TooLarge, require_fits, run_dtype
from .run_state import KVCache, RunState, current, running
from .sites import INDICES, LOGITS, PROBS, WEIGHTS, RoutingLayer, Site, site_name
from .specs import ALL_LAYERS, AblationError
from .trace import Trace, active_trace


# Model types transformers ships whose routing RouteScope cannot follow yet, each with the reason
# (plain data: the refusal names it). Every other type is opened by `moe_layout` or refused by it.
REFUSED: dict[str, str] = {
    "zaya": "its router is an MLP whose last layer gives the logits (RouteScope masks a dropped expert at the "
            "router's first linear); not supported yet",
}
# The value a dropped expert's logit takes, where -inf does not serve (plain data, one row a type).
LOGIT_MASK: dict[str, float] = {
    "phimoe": -1e9,  # its sparsemixer subtracts logits from their maximum: -inf - -inf would be NaN
}
WEIGHT_SUFFIXES = (".safetensors",)
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DROPPED_CHOICE = -1e9  # a dropped expert's selection score where -inf would break group sums
LOAD_BALANCE = "load_balance"  # the auxiliary loss term transformers computes with output_router_logits
ROUTER_LOGITS = "router_logits"  # transformers' recorder key for its routers


class UnsupportedMoE(ValueError):
    """A transformers MoE model whose routing RouteScope cannot follow; the message says why."""


def is_hf_config(d: dict) -> bool:
    """A transformers config.json: it names a `model_type` and no RouteScope family."""
    return isinstance(d, dict) and "model_type" in d and "family" not in d


def check_hf_directory(path: str | os.PathLike, d: dict) -> None:
    """ValueError unless `path` holds a loadable HF model directory: a model_type not refused, safetensors
    weights (pickled ones are refused without being opened). Whether its routing can be followed is
    decided at load, from the model transformers builds (`moe_layout`)."""
    path = Path(path)
    model_type = d.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError(f"{path / 'config.json'}: model_type must be a string")
    if model_type in REFUSED:
        raise ValueError(f"{path}: model_type {model_type!r} is refused: {REFUSED[model_type]}")
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
        d.update(model_type=self.model_type)
        _text(d).update(vocab_size=self.vocab_size, max_position_embeddings=self.context)
        object.__setattr__(self, "hf_config", json.dumps(d, sort_keys=True))

    def transformers_config(self) -> Any:
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
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config.transformers_config(), trust_remote_code=False)
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class MoEBlock:
    """One MoE block of a transformers model, as `moe_layout` found it (module paths)."""

    router: str  # the recorded router: the routing layer's name
    experts: str  # its sibling, called as experts(hidden, top_k_index, top_k_weights)
    logits_index: int  # where the router's output holds its logits (the recorder's index)
    n_experts: int  # routed experts: the width of the router's logits
    top_k: int
    shared: str | None = None  # a shared expert that runs for every token
    shared_gate: str | None = None  # its gate linear


def _recorders(hf_model: nn.Module) -> list[tuple[type, int]]:
    """(router class, index of its logits in its output) that transformers records for
    `output_router_logits`, from every model class in the module tree (umbrella models nest theirs)."""
    found: dict[type, int] = {}
    for mod in hf_model.modules():
        rec = (getattr(type(mod), "_can_record_outputs", None) or {}).get(ROUTER_LOGITS)
        for r in rec if isinstance(rec, (list, tuple)) else [rec] if rec is not None else []:
            cls = getattr(r, "target_class", r)
            if isinstance(cls, type):
                found.setdefault(cls, int(getattr(r, "index", 0) or 0))
    return list(found.items())


def _first_linear(router: nn.Module) -> nn.Linear | None:
    return router if isinstance(router, nn.Linear) else next(
        (m for m in router.modules() if isinstance(m, nn.Linear)), None)


def _n_experts(router: nn.Module, index: int) -> int:
    """The width of the router's logits at `index` of its output, from one call on one zero token
    (on a meta model, shapes only); where that call needs more than the hidden state, the rows of its
    linear (its own weight, or its first Linear child)."""
    lin = _first_linear(router)
    w = lin.weight if lin is not None else getattr(router, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise UnsupportedMoE(f"its router {type(router).__name__} has no linear to read the experts' count from")
    try:
        with torch.no_grad():
            out = router(torch.zeros(1, w.shape[1], dtype=w.dtype, device=w.device))
        return int((out[index] if isinstance(out, (tuple, list)) else out).shape[-1])
    except Exception:  # a router that takes more than the hidden state: its linear's rows
        return int(w.shape[0])


TOP_K_FIELDS = ("top_k", "num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_top_k", "moe_k",
                "top_k_experts")


def _top_k(router: nn.Module, config: Any) -> int:
    """Experts per token: the router's `top_k`, else the (text) config's field for it."""
    for source in (router, getattr(config, "text_config", None), config):
        for f in TOP_K_FIELDS:
            v = getattr(source, f, None) if source is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return 1


def moe_layout(hf_model: nn.Module) -> list[MoEBlock]:
    """Every MoE block of `hf_model` in module order ([] for a dense model), or UnsupportedMoE saying
    why its routing cannot be followed. Read from the built model (meta tensors will do), never from
    config field names: a model is a mixture of experts when transformers built a router or an
    `experts` module into it."""
    recorders = _recorders(hf_model)
    classes = tuple(cls for cls, _ in recorders)
    index = dict(recorders)
    named = dict(hf_model.named_modules())
    routers = [(n, m) for n, m in named.items() if classes and isinstance(m, classes)]
    if not routers:
        experts = [n for n in named if n.rsplit(".", 1)[-1] == "experts"]
        if experts:
            raise UnsupportedMoE(f"its experts ({experts[0]}, ...) have no router that transformers records "
                                 f"for {ROUTER_LOGITS}")
        return []
    routed_blocks = {n.rsplit(".", 1)[0] if "." in n else "" for n, _ in routers}
    orphans = [n for n in named if n.rsplit(".", 1)[-1] == "experts" and (n.rsplit(".", 1)[0] if "." in n else "")
               not in routed_blocks and not isinstance(named[n], classes)]
    if orphans:
        parent = named[orphans[0].rsplit(".", 1)[0]] if "." in orphans[0] else hf_model
        raise UnsupportedMoE(f"its MoE block {type(parent).__name__} ({orphans[0]}) routes without a router that "
                             f"transformers records for {ROUTER_LOGITS}")
    blocks = []
    for name, router in routers:
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        block = named[parent]
        experts = getattr(block, "experts", None)
        if not isinstance(experts, nn.Module):
            raise UnsupportedMoE(f"its MoE block {type(block).__name__} has no `experts` module beside the router "
                                 f"{type(router).__name__} (RouteScope reads routes where a block calls "
                                 "experts(hidden, top_k_index, top_k_weights))")
        params = [p for p in inspect.signature(type(experts).forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]  # the class's: not a wrapper's
        if len(params) < 3:
            raise UnsupportedMoE(f"its MoE block {type(block).__name__} calls {type(experts).__name__}"
                                 f"({', '.join(p.name for p in params)}) without the top-k indices and weights "
                                 "(RouteScope reads routes at experts(hidden, top_k_index, top_k_weights))")
        kids = dict(block.named_children())
        shared = [k for k, m in kids.items() if k.startswith("shared") and "gate" not in k
                  and any(True for _ in m.parameters())]
        gates = [k for k in kids if k.startswith("shared") and "gate" in k]
        at = index[next(c for c in classes if isinstance(router, c))]
        blocks.append(MoEBlock(router=name, experts=f"{parent}.experts", logits_index=at,
                               n_experts=_n_experts(router, at), top_k=_top_k(router, hf_model.config),
                               shared=f"{parent}.{shared[0]}" if shared else None,
                               shared_gate=f"{parent}.{gates[0]}" if gates else None))
    return blocks


class HFRoutingLayer(RoutingLayer):
    """The RouteScope face of one transformers router: its name, options, labels and role sites. Held
    by the HFModel in a plain dict (not a submodule: transformers' module tree stays as transformers
    built it)."""

    option_noun = "expert"
    can_force = True

    def __init__(self, block: MoEBlock, roles: dict[str, str]) -> None:
        super().__init__()
        self.block, self.name, self.n_experts, self.top_k = block, block.router, block.n_experts, block.top_k
        self.shared = bool(block.shared)
        self.n_options = self.n_experts + self.shared
        self._roles = roles

    @property
    def roles(self) -> dict[str, str]:
        return self._roles

    @property
    def n_routed(self) -> int:
        return self.n_experts  # the shared expert runs for every token

    def option_labels(self) -> list[str]:
        return [f"expert {j}" for j in range(self.n_experts)] + (["shared expert"] if self.shared else [])


# --- per-call instrumentation (thread-local) -------------------------------------------------------

_BATCH: ContextVar[int] = ContextVar("routescope_hf_batch", default=1)  # rows of the call in progress
_NONE: frozenset[int] = frozenset()

_NORMALISERS = {F.softmax, torch.softmax, torch.Tensor.softmax, F.sigmoid, torch.sigmoid, torch.Tensor.sigmoid}
_ADD = {torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__}


def _choice_biases(router: nn.Module, n: int) -> list[torch.Tensor]:
    """Router tensors that may be added to its scores before selection: named `*bias`, one entry per expert."""
    return [t for name, t in [*router.named_parameters(), *router.named_buffers()]
            if name.endswith("bias") and t.numel() == n]


def _same_storage(x: Any, biases: list[torch.Tensor]) -> bool:
    if not isinstance(x, torch.Tensor):
        return False
    ptr = x.untyped_storage().data_ptr()
    return any(ptr == b.untyped_storage().data_ptr() and x.numel() == b.numel() for b in biases)


class _InsideRouter(TorchFunctionMode):
    """Watches the ops of one router call: masks the logits (and biased selection scores) of the
    experts the call drops, and keeps the router's probabilities as its own op computed them."""

    def __init__(self, dropped: frozenset[int], want_probs: bool, biases: list[torch.Tensor], mask: float,
                 row_mask: torch.Tensor | None = None) -> None:
        super().__init__()
        self.dropped, self.want_probs, self.biases, self.mask = sorted(dropped), want_probs, biases, mask
        self.row_mask = row_mask  # [batch, n] True where that row drops the expert (rows differ), else None
        self.logits: torch.Tensor | None = None
        self.probs: torch.Tensor | None = None

    def _mask(self, out: torch.Tensor, value: float) -> torch.Tensor:
        if self.row_mask is None:
            return out.index_fill(-1, torch.tensor(self.dropped, device=out.device), value)
        rows = self.row_mask.to(out.device)  # the router sees [batch * pos, n]: rows are contiguous
        return out.reshape(rows.shape[0], -1, out.shape[-1]).masked_fill(rows[:, None, :], value).reshape(out.shape)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.logits is None:
            if func is F.linear:  # the router's linear: its logits
                if self.dropped:
                    out = self._mask(out, self.mask)
                self.logits = out
        elif (self.want_probs and self.probs is None and func in _NORMALISERS and isinstance(out, torch.Tensor)
              and out.shape == self.logits.shape):
            self.probs = out
        elif self.dropped and self.biases and func in _ADD and any(_same_storage(a, self.biases) for a in args):
            out = self._mask(out, DROPPED_CHOICE)
        return out


class HFModel(RouteScopeLM):
    """A transformers causal LM with RouteScope's call interface (ablation, trace, KV cache)."""

    def __init__(self, config: HFConfig, hf_model: nn.Module | None = None) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM

        self.config, self.context, self.vocab_size = config, config.context, config.vocab_size
        self.hf = hf_model if hf_model is not None else AutoModelForCausalLM.from_config(
            config.transformers_config(), trust_remote_code=False)
        layers: dict[str, HFRoutingLayer] = {}
        sites: dict[str, Site] = {}
        self._biases: dict[str, list[torch.Tensor]] = {}
        for block in moe_layout(self.hf):
            name, n, k = block.router, block.n_experts, block.top_k
            router = self.hf.get_submodule(name)
            shapes = {LOGITS: f"[batch, pos, {n}] router logits (dropped experts -inf)",
                      INDICES: f"[batch, pos, {k}] experts the block routed to (the experts module's input)",
                      WEIGHTS: f"[batch, pos, {k}] their weights (the experts module's input)",
                      PROBS: f"[batch, pos, {n}] the router's own probabilities (where it computes them)"}
            roles = {role: site_name(name, role) for role in shapes}
            for role, site in roles.items():
                sites[site] = _site(site, shapes[role])
            layers[name] = HFRoutingLayer(block, roles)
            self._biases[name] = _choice_biases(router, n)
            _wrap(router, self._router_forward, name)
            _wrap(self.hf.get_submodule(block.experts), self._experts_forward, name)
            if block.shared:
                _wrap(self.hf.get_submodule(block.shared), self._shared_forward, name)
            if block.shared_gate:
                gate = block.shared_gate
                sites[gate] = _site(gate, "[batch, pos, 1] shared-expert gate logit (the block applies its sigmoid)")
                _wrap(self.hf.get_submodule(gate), self._gate_forward, gate)
        self.routing_modules = layers
        self.sites = sites
        self.attn_layers = []
        self._offload: Any = None  # load_hf's offload folder under device_map="auto"
        self._stack, self._decoder_of, self._tail = _decoder_stack(self.hf, list(layers))
        if self._stack is not None:
            stack = self.hf.get_submodule(self._stack)
            for i, layer in enumerate(stack):
                _wrap(layer, self._decoder_forward, i)
            for i in set(self._decoder_of.values()):
                attention = getattr(stack[i], "self_attn", None)
                if isinstance(attention, nn.Module):
                    _wrap(attention, self._attention_forward, i)

    # --- wrapped forwards (installed once at load; per-call state only in ContextVars) --------------
    # Each is `inner` (the module's own forward) plus what the call in progress asks for. Idle, that is
    # one or two ContextVar reads: no module carries a hook, so torch calls each one on its fast path.
    def _decoder_forward(self, i: int, inner: Any, *args: Any, **kwargs: Any) -> Any:
        cap = _CAPTURE.get()
        if cap is not None:
            cap.inputs[i] = (args, dict(kwargs))
        return inner(*args, **kwargs)

    def _attention_forward(self, i: int, inner: Any, *args: Any, **kwargs: Any) -> Any:
        """A routing decoder layer's attention: the output `resume` hands it (`_REUSE_ATTENTION`) instead
        of computing it again; under `capture`, its output kept where the layer's experts have not run
        yet (then no ablation of the layer can change it)."""
        reuse = _REUSE_ATTENTION.get()
        if reuse is not None and reuse[0] is self and reuse[1] == i:
            return reuse[2]
        out = inner(*args, **kwargs)
        cap = _CAPTURE.get()
        if cap is not None and not any(self._decoder_of[r] == i for r in cap.experts):
            cap.attention[i] = out
        return out

    def _router_forward(self, name: str, inner: Any, *args: Any, **kwargs: Any) -> Any:
        st, tr = current(), active_trace()
        dropped, row_mask = self._dropped_now(name, st) if st.row_ablations is not None or not st.ablation.is_empty \
            else (_NONE, None)
        layer = self.routing_modules[name]
        want_probs = tr is not None and tr.wants(layer.roles[PROBS])
        mode = None
        if dropped or want_probs:
            mode = _InsideRouter(dropped, want_probs, self._biases[name],
                                 LOGIT_MASK.get(self.config.model_type, float("-inf")), row_mask)
            with mode:
                output = inner(*args, **kwargs)
        else:
            output = inner(*args, **kwargs)
        if tr is not None:
            logits = output[layer.block.logits_index] if isinstance(output, (tuple, list)) else output
            self._visit(tr, layer.roles[LOGITS], logits)
            if mode is not None and mode.probs is not None:
                self._visit(tr, layer.roles[PROBS], mode.probs)
        return output

    def _experts_forward(self, name: str, inner: Any, *args: Any, **kwargs: Any) -> Any:
        """Every MoE block transformers ships calls experts(hidden, top_k_index, top_k_weights) positionally
        (tests/analysis/test_hf_coverage.py checks each type)."""
        if len(args) >= 3:
            cap = _CAPTURE.get()
            if cap is not None:
                cap.experts[name] = tuple(args[:3])
            tr = active_trace()
            if tr is not None:
                roles = self.routing_modules[name].roles
                self._visit(tr, roles[INDICES], args[1])
                self._visit(tr, roles[WEIGHTS], args[2])
        return inner(*args, **kwargs)

    def _visit(self, tr: Trace, site: str, x: Any) -> None:
        if isinstance(x, torch.Tensor) and tr.wants(site):
            tr.visit(site, x.reshape(_BATCH.get(), -1, x.shape[-1]), 1, self.sites[site].shape)

    def _shared_forward(self, layer: str, inner: Any, *args: Any, **kwargs: Any) -> Any:
        """A shared expert: its output zeroed where the call drops it (the layer's last option)."""
        output = inner(*args, **kwargs)
        st = current()
        option = self.routing_modules[layer].n_experts
        if st.row_ablations is not None:
            drop = torch.tensor([option in a.dropped(layer) for a in st.row_ablations], device=output.device)
            if bool(drop.any()):
                return output.reshape(drop.shape[0], -1).masked_fill(drop[:, None], 0).reshape(output.shape)
            return output
        ab = st.ablation
        if not ab.is_empty and option in ab.dropped(layer):
            return torch.zeros_like(output)
        return output

    def _gate_forward(self, site: str, inner: Any, *args: Any, **kwargs: Any) -> Any:
        output = inner(*args, **kwargs)
        tr = active_trace()
        if tr is not None and tr.wants(site):
            self._visit(tr, site, output)
        return output

    def _dropped_now(self, layer: str, st: RunState) -> tuple[frozenset[int], torch.Tensor | None]:
        """The routed experts the call in progress drops at `layer` (all rows together), and where rows
        carry different ablations a [rows, n] mask of each row's (else None)."""
        if st.row_ablations is None:
            return self._dropped_experts(layer, st.ablation), None
        per = [self._dropped_experts(layer, a) for a in st.row_ablations]
        union = frozenset().union(*per)
        if all(p == per[0] for p in per):
            return union, None
        mask = torch.zeros(len(per), self.routing_modules[layer].n_experts, dtype=torch.bool)
        for r, p in enumerate(per):
            mask[r, list(p)] = True
        return union, mask

    def _dropped_experts(self, layer: str, ab: Ablation) -> frozenset[int]:
        """The routed experts the call drops at `layer` (forcing one drops the others)."""
        if ab.is_empty:
            return frozenset()
        m = self.routing_modules[layer]
        forced = ab.forced(layer)
        if forced is not None:  # forcing a routed expert: every other routed expert is dropped
            return frozenset(range(m.n_experts)) - {forced}
        return frozenset(o for o in ab.dropped(layer) if o < m.n_experts)

    # --- RouteScopeLM -------------------------------------------------------------------------
    row_ablations_supported = True

    def forward(self, idx: torch.Tensor, **kw: Any):
        for ab in {kw.get("ablation"), *(kw.get("row_ablations") or ())}:
            if ab is not None and not ab.is_empty:
                self._check_ablation(ab)
        return super().forward(idx, **kw)

    def _check_ablation(self, ab: Ablation) -> None:
        """Refusals beyond `Ablation.validate` that follow from how transformers routes."""
        for layer, m in self.routing_modules.items():
            if m.shared and ab.forced(layer) == m.n_experts:
                raise AblationError(f"invalid ablation: force {layer}:{m.n_experts}: the shared expert always "
                                    "runs; force a routed expert (0.."
                                    f"{m.n_experts - 1}) or drop the shared one")
            left = m.n_experts - len(self._dropped_experts(layer, ab))
            if self.config.model_type in LOGIT_MASK and 0 < left < m.top_k:
                raise AblationError(f"invalid ablation: {layer!r} keeps {left} routed expert(s) but "
                                    f"{self.config.model_type} routes each token to {m.top_k}: with a finite mask "
                                    "its router would still weight a dropped expert; keep at least "
                                    f"{m.top_k}")
            if left <= 0:
                raise AblationError(f"invalid ablation: drop: every routed expert of layer {layer!r} is "
                                    "dropped; at least one must remain")

    def _forward(self, idx: torch.Tensor) -> torch.Tensor:
        st = current()
        past = st.cache.extra.get("hf") if st.cache is not None else None
        attention = None if st.pad_mask is None else (~st.pad_mask).long()
        if attention is not None and past is not None:
            raise ValueError("padding and a KV cache together are not supported for HF models")
        balance = st.training and bool(self.routing_modules)  # transformers' own load-balancing loss
        cached = st.cache is not None
        token = _BATCH.set(idx.shape[0])
        try:
            out = self.hf(input_ids=idx, attention_mask=attention, past_key_values=past,
                          use_cache=cached, **({"output_router_logits": True} if balance else {}))
        finally:
            _BATCH.reset(token)
        if cached:  # the cache the model made on the first call (its own kind: hybrid and linear-attention
            st.cache.extra["hf"] = out.past_key_values  # models bring theirs), carried to the next

        if balance and getattr(out, "aux_loss", None) is not None:
            st.aux[LOAD_BALANCE] = out.aux_loss
        return out.logits.float() if st.float_logits else out.logits

    # --- prefix reuse: a forward restarted at a routing layer's decoder layer ----------------------
    @property
    def can_resume(self) -> bool:
        """Whether `capture` / `resume` work for this model: its routers sit in one stack of decoder
        layers, followed by a final norm and the output embedding."""
        return self._stack is not None

    def capture(self, idx: torch.Tensor) -> Prefix:
        """One plain forward of `idx` that keeps each decoder layer's input (its hidden states and the
        other arguments transformers gave it) and each experts module's input."""
        if self._stack is None:
            raise ValueError(f"{self.config.model_type}: its forward cannot be restarted at a routing layer "
                             "(no single stack of decoder layers with a final norm)")
        cap = Prefix(rows=int(idx.shape[0]))
        token = _CAPTURE.set(cap)
        try:
            cap.logits = self(idx).logits
        finally:
            _CAPTURE.reset(token)
        return cap

    def resume(self, prefix: Prefix, layer: str, row_ablations: list[Ablation] | tuple, *,
               head: bool = True) -> torch.Tensor:
        """Logits [len(row_ablations), pos, vocab] (float32) of the captured batch repeated
        len(row_ablations) / prefix.rows times, block j of rows under ablations j * rows ..., run from
        the decoder layer of routing layer `layer` on with transformers' own decoder layers, final norm
        and output embedding. Every ablation must leave the layers before `layer` alone. That decoder
        layer's attention, computed before its experts (`Prefix.attention`), is not computed again:
        its captured output is returned by the attention's wrapped forward (`_attention_forward`). `head=False`:
        the final norm's output [len(row_ablations), pos, hidden] instead (`output_embedding`'s input),
        for a caller that needs the logits of some positions only, or a chunk at a time."""
        start, R = self._decoder_of[layer], prefix.rows
        if len(row_ablations) % R or not row_ablations:
            raise ValueError(f"resume: {len(row_ablations)} row ablations for {R} captured rows")
        order = list(self.routing_modules)
        before = set(order[:order.index(layer)])
        for ab in set(row_ablations):
            ab.validate(self.routing_layers())
            if any(l in before or l == ALL_LAYERS for l, _ in ab.drop) or ab.force or ab.modes:
                raise ValueError(f"resume from {layer}: ablation {ab.describe()} touches an earlier layer or forces")
            self._check_ablation(ab)
        m, stack = len(row_ablations) // R, self.hf.get_submodule(self._stack)
        copies: dict[int, Any] = {}
        h = None
        state = RunState(row_ablations=tuple(row_ablations))
        reuse = (self, start, _repeat_rows(prefix.attention[start], R, m, copies)) \
            if start in prefix.attention else None
        with running(state):
            token = _BATCH.set(len(row_ablations))
            try:
                for i in range(start, len(stack)):
                    args, kwargs = _repeat_rows(prefix.inputs[i], R, m, copies)
                    if h is not None:
                        args, kwargs = _with_hidden(args, kwargs, h)
                    reusing = _REUSE_ATTENTION.set(reuse if i == start else None)
                    try:
                        out = stack[i](*args, **kwargs)
                    finally:
                        _REUSE_ATTENTION.reset(reusing)
                    h = out[0] if isinstance(out, (tuple, list)) else out
                hidden = self.hf.get_submodule(self._tail[0])(h)
            finally:
                _BATCH.reset(token)
        return self.output_embedding(hidden).float() if head else hidden

    @property
    def output_embedding(self) -> nn.Module:
        """transformers' output embedding (`get_output_embeddings`): final hidden states -> logits."""
        return self.hf.get_submodule(self._tail[1])

    def expert_output_norms(self, prefix: Prefix, layer: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indices [N, k], weights [N, k], ||expert output|| [N, k]) at `layer` for the N tokens of the
        captured batch (rows x pos): each selected expert's own output, from transformers' experts module
        called on the captured input with that slot's weight 1 and the others 0."""
        hidden, idx, w = prefix.experts[layer]
        experts = self.hf.get_submodule(self.routing_modules[layer].block.experts)
        norms = []
        for slot in range(idx.shape[-1]):
            one = torch.zeros_like(w)
            one[..., slot] = 1
            norms.append(experts(hidden, idx, one).float().norm(dim=-1))
        return idx.reshape(-1, idx.shape[-1]), w.reshape(-1, w.shape[-1]).float(), \
            torch.stack(norms, -1).reshape(-1, idx.shape[-1])

    def float32_copy(self) -> "HFModel":
        """A float32 copy, rebuilt by transformers and given the weights (the shared model is not touched)."""
        from transformers import AutoModelForCausalLM

        if all(p.dtype == torch.float32 for p in self.parameters()):
            return self
        hf = AutoModelForCausalLM.from_config(self.config.transformers_config(), trust_remote_code=False,
                                              dtype=torch.float32)
        hf.load_state_dict({k: v.float() for k, v in self.hf.state_dict().items()})
        return HFModel(self.config, hf.to(self.device).eval()).eval()

    # --- pruning: a transformers model without some experts -------------------------------------------
    def prune_problem(self, n: int) -> str | None:
        """Why `n` experts cannot be removed from every MoE layer (None: they can)."""
        if len({m.n_experts for m in self.routing_modules.values()}) != 1:
            return "the MoE layers have different expert counts; one config field cannot say both"
        for name, m in self.routing_modules.items():
            if not 1 <= n <= m.n_experts - m.top_k:
                return (f"layer {name} has {m.n_experts} experts and routes each token to {m.top_k}; "
                        f"prune 1..{m.n_experts - m.top_k}")
        if _expert_count_field(self.hf.config) is None:
            return f"{self.config.model_type}'s config has none of {', '.join(EXPERT_COUNT_FIELDS)}"
        return None

    def pruned_copy(self, drop: dict[str, list[int]]) -> nn.Module:
        """A new transformers model without the experts `drop` names (layer -> options, the same count in
        every MoE layer): transformers builds it from the config with the expert count lowered, and it
        gets the kept weights (router rows and expert tensors sliced on their expert axis)."""
        import copy

        from transformers import AutoModelForCausalLM

        counts = {len(v) for v in drop.values()}
        if set(drop) != set(self.routing_modules) or len(counts) != 1:
            raise ValueError("pruning removes the same number of experts from every MoE layer")
        cfg = copy.deepcopy(self.hf.config)
        text, field_ = _expert_count_field(cfg)
        setattr(text, field_, getattr(text, field_) - counts.pop())
        new = AutoModelForCausalLM.from_config(cfg, dtype=next(self.hf.parameters()).dtype)
        state = self.hf.state_dict()
        for layer, options in drop.items():
            m = self.routing_modules[layer]
            keep = torch.tensor(sorted(set(range(m.n_experts)) - set(options)))
            for prefix in (layer + ".", m.block.experts + "."):
                for k in [k for k in state if k.startswith(prefix)]:
                    if state[k].dim() and state[k].shape[0] == m.n_experts:
                        state[k] = state[k].index_select(0, keep.to(state[k].device))
        new.load_state_dict(state, strict=True)
        return new.to(self.device).eval()

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

    def token_embedding(self) -> str:
        emb = self.hf.get_input_embeddings()  # transformers says which module it is
        return next(f"hf.{n}" for n, m in self.hf.named_modules() if m is emb)

    def new_cache(self) -> KVCache:
        cache = KVCache(0)
        cache.extra["hf"] = None  # transformers makes the model's own kind of cache on the first call
        return cache

    @property
    def device(self) -> torch.device:
        """Where inputs go: the parameters' device, or under a device map (accelerate) the device the
        input embedding runs on (offloaded parameters sit on the meta device meanwhile)."""
        placement = self.hf.__dict__.get("hf_device_map")  # set by transformers only when a map was used
        if not placement:
            return super().device
        emb = next(n for n, m in self.hf.named_modules() if m is self.hf.get_input_embeddings())
        where = max((k for k in placement if emb == k or emb.startswith(k + ".") or k == ""), key=len)
        return execution_device(placement[where])

    @property
    def placement(self) -> dict[str, str]:
        """Module -> device under a device map ({} when the whole model sits on one device)."""
        return {k: str(execution_device(v)) if v != "disk" else "disk"
                for k, v in (self.hf.__dict__.get("hf_device_map") or {}).items()}

    def active_params(self) -> int:
        """Per token: everything but the experts a token does not use (k of n routed experts)."""
        total = self.num_params()
        for name, m in self.routing_modules.items():
            experts = self.hf.get_submodule(m.block.experts)
            per_expert = sum(p.numel() for p in experts.parameters()) // m.n_experts
            total -= per_expert * (m.n_experts - m.top_k)
        return total


@dataclass
class Prefix:
    """What one unablated forward of a batch left at each decoder layer's input and each experts
    module's input (`HFModel.capture`): a forward restarts from there."""

    rows: int
    logits: torch.Tensor | None = None
    inputs: dict[int, tuple[tuple, dict]] = field(default_factory=dict)  # decoder index -> (args, kwargs)
    experts: dict[str, tuple] = field(default_factory=dict)  # routing layer -> (hidden, top-k index, weights)
    attention: dict[int, Any] = field(default_factory=dict)  # decoder index -> its attention's output, where
    # the attention ran before the layer's experts (an ablation of the layer cannot change it)


_CAPTURE: ContextVar[Prefix | None] = ContextVar("routescope_hf_capture", default=None)
# (model, decoder index, output): that decoder layer's attention returns the output instead of computing it
_REUSE_ATTENTION: ContextVar[tuple | None] = ContextVar("routescope_hf_reuse_attention", default=None)


def _wrap(module: nn.Module, wrapper: Any, key: Any) -> None:
    """module.forward := wrapper(key, inner, *args, **kwargs), inner being the forward it had (the
    class's, or one that accelerate's dispatch installed). A partial of bound methods: a deep copy of
    the model calls its own modules. Wrapping a module a second time (a second HFModel over the same
    transformers model) replaces the first wrapper, never nests it."""
    inner = module.__dict__.get("forward")
    if isinstance(inner, functools.partial) and getattr(inner, "routescope", False):
        inner = inner.args[1]
    if inner is None:
        inner = types.MethodType(type(module).forward, module)
    wrapped = functools.partial(wrapper, key, inner)
    wrapped.routescope = True
    module.forward = wrapped


# config fields that count a layer's routed experts, by model type (the first present is lowered when pruning)
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _expert_count_field(config: Any) -> tuple[Any, str] | None:
    text = getattr(config, "text_config", None) or config
    f = next((f for f in EXPERT_COUNT_FIELDS if isinstance(getattr(text, f, None), int)), None)
    return None if f is None else (text, f)
FINAL_NORMS = ("norm", "final_layernorm", "ln_f", "final_norm", "norm_f")


def _decoder_stack(hf: nn.Module, routers: list[str]) -> tuple[str | None, dict[str, int], tuple[str, str]]:
    """(path of the ModuleList of decoder layers holding every router, router -> its decoder layer's
    index, (final norm path, output embedding path)); (None, {}, ("", "")) where there is no such stack."""
    named = dict(hf.named_modules())
    found: dict[str, tuple[str, int]] = {}
    for r in routers:
        parts = r.split(".")
        for cut in range(1, len(parts)):
            if isinstance(named.get(".".join(parts[:cut])), nn.ModuleList) and parts[cut].isdigit():
                found[r] = (".".join(parts[:cut]), int(parts[cut]))
                break
    stacks = {s for s, _ in found.values()}
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    head_path = next((n for n, m in named.items() if m is head), None) if head is not None else None
    if len(found) != len(routers) or len(stacks) != 1 or head_path is None:
        return None, {}, ("", "")
    stack = stacks.pop()
    parent = stack.rsplit(".", 1)[0] if "." in stack else ""
    norm = next((f"{parent}.{n}" if parent else n for n in FINAL_NORMS
                 if isinstance(named.get(f"{parent}.{n}" if parent else n), nn.Module)), None)
    if norm is None:
        return None, {}, ("", "")
    return stack, {r: i for r, (_, i) in found.items()}, (norm, head_path)


def _repeat_rows(x: Any, rows: int, times: int, copies: dict[int, Any]) -> Any:
    """`x` (tensors nested in tuples, lists and dicts) with every tensor whose first axis is the batch
    (`rows` long) repeated `times` times along it; the same tensor is repeated once (`copies`)."""
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 or x.shape[0] != rows or times == 1:
            return x
        if id(x) not in copies:
            copies[id(x)] = x.repeat(times, *[1] * (x.dim() - 1))
        return copies[id(x)]
    if isinstance(x, tuple):
        return tuple(_repeat_rows(v, rows, times, copies) for v in x)
    if isinstance(x, list):
        return [_repeat_rows(v, rows, times, copies) for v in x]
    if isinstance(x, dict):
        return {k: _repeat_rows(v, rows, times, copies) for k, v in x.items()}
    return x


def _with_hidden(args: tuple, kwargs: dict, h: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (h, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": h}


def _site(name: str, shape: str) -> Site:
    s = Site(shape)
    s.name = name
    return s


# --- loading ---------------------------------------------------------------------------------------

def _stored_dtype(path: Path, d: dict) -> torch.dtype | None:
    """The dtype a transformers directory stores: its config's `dtype` (`torch_dtype` before
    transformers 5), else the first safetensors file's tensors."""
    from .checkpoint import read_header, stored_dtype

    named = d.get("dtype", d.get("torch_dtype"))
    if isinstance(named, str) and DTYPES.get(named.removeprefix("torch.")) is not None:
        return DTYPES[named.removeprefix("torch.")]
    files = sorted(Path(path).glob("*.safetensors"))
    return stored_dtype(read_header(files[0])) if files else None


def _load_report_problem(info: dict) -> str | None:
    """transformers' load report (missing, unexpected, mismatched tensors, errors) as one line, or None."""
    parts = []
    for key, what in (("missing_keys", "missing"), ("unexpected_keys", "unexpected"), ("mismatched_keys", "mismatched"),
                      ("error_msgs", "error"), ("conversion_errors", "conversion error")):
        found = sorted(str(k[0] if isinstance(k, tuple) else k) for k in (info.get(key) or ()))
        if found:
            parts.append(f"{len(found)} {what} ({', '.join(found[:3])}{', ...' if len(found) > 3 else ''})")
    return "; ".join(parts) or None


def load_hf(path: str | os.PathLike, d: dict, *, device: torch.device, dtype: torch.dtype | None,
            device_map: str | None = None, max_memory: dict | None = None) -> HFModel:
    """The transformers model in directory `path` (config dict `d`), from local files only, safetensors
    only (`check_hf_directory` ran first), wrapped and instrumented. `dtype` None: as stored
    (`devices.run_dtype`). Refused before any weight is read when it does not fit (`require_fits`).

    `device_map="auto"`: accelerate spreads the model over the GPUs, then the CPU, then disk (a
    temporary offload folder, removed with the model), within `max_memory` ({"cpu": "20GiB", 0:
    "70GiB"}: accelerate's own argument) where given; no memory refusal then, since what does not fit
    goes to disk. Inputs go to the embedding's device (`HFModel.device`)."""
    check_hf_directory(path, d)
    if device_map not in (None, "auto"):
        raise ValueError(f"device_map {device_map!r}: expected 'auto' (or none)")
    if device_map is not None and device.type == "meta":
        raise ValueError("device_map 'auto' places weights; it does not apply to the meta device")
    try:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ValueError(f"{path}: a Hugging Face transformers model ({d.get('model_type')}) needs the hf extra: "
                         "pip install -c constraints.txt -c constraints-hf.txt -e '.[hf]'") from None

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if d.get("model_type") not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:  # before transformers lists its ~900 names
        if "auto_map" in d:
            raise ValueError(f"{path}: model_type {d.get('model_type')!r} needs the directory's own code (auto_map in "
                             "config.json); RouteScope never runs a model directory's code")
        raise ValueError(f"{path}: model_type {d.get('model_type')!r} is not a causal language model this "
                         f"transformers ({_transformers_version()}) knows")
    from .checkpoint import read_header

    for weights in sorted(Path(path).glob("*.safetensors")):  # a truncated or oversized file, named in one line
        read_header(weights)
    config = HFConfig.from_hf_dict(d)
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # its load report and progress bar go to stderr; RouteScope reports its own
    hf_logging.disable_progress_bar()
    try:
        with torch.device("meta"):  # shapes only: refuse a routing RouteScope cannot follow before reading weights
            hf = AutoModelForCausalLM.from_config(config.transformers_config(), trust_remote_code=False)
        moe_layout(hf)
        dtype = run_dtype(dtype, _stored_dtype(Path(path), d), device)
        if device_map is None:
            require_fits(sum(p.numel() for p in hf.parameters()), dtype, device, str(path))
        offload = _offload_folder() if device_map is not None else None
        if device.type != "meta":
            hf, info = AutoModelForCausalLM.from_pretrained(
                str(path), local_files_only=True, use_safetensors=True,
                trust_remote_code=False,  # never run the directory's code
                dtype=dtype, output_loading_info=True,
                # straight onto the device (no float copy through the CPU first), or spread by accelerate
                **({"device_map": None if device.type == "cpu" else device} if device_map is None else
                   {"device_map": device_map, "max_memory": max_memory, "offload_folder": offload.name}),
                ignore_mismatched_sizes=True)  # refused below, by name
            problem = _load_report_problem(info)  # transformers fills a missing tensor with random values
            if problem is not None:
                hf = None
    except TooLarge:
        raise
    except UnsupportedMoE as e:
        raise ValueError(f"{path}: model_type {config.model_type!r} is a mixture of experts RouteScope cannot "
                         f"follow: {e}") from None
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, AttributeError, SafetensorError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        first = first if len(first) <= 300 else first[:300] + "…"
        raise ValueError(f"{path}: transformers could not load the model ({first})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    if hf is None:
        raise ValueError(f"{path}: the weights do not match the model: {problem}")
    model = HFModel(config, hf).eval()
    if offload is not None:
        model._offload = offload  # the offloaded weights' folder lives (and is removed) with the model
    return model


def execution_device(where: Any) -> torch.device:
    """A device-map entry (GPU index, "cpu", "disk", "cuda:1", ...) -> where its inputs are computed:
    accelerate runs disk-offloaded modules on the CPU when no GPU is in the map."""
    if isinstance(where, int):
        return torch.device("cuda", where)
    return torch.device("cpu" if where == "disk" else where)


def _offload_folder() -> Any:
    """A temporary folder for the weights accelerate offloads to disk, removed when it is collected
    or at exit (an interrupted run leaves at most this folder, under the system's temp dir)."""
    import tempfile

    return tempfile.TemporaryDirectory(prefix="routescope-offload-")


__all__ = ["LOGIT_MASK", "REFUSED", "HFConfig", "HFModel", "HFRoutingLayer", "MoEBlock", "Prefix", "UnsupportedMoE",
           "check_hf_directory", "hf_param_count", "is_hf_config", "load_hf", "moe_layout"]
