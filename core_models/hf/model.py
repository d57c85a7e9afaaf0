"""`HFModel`: a transformers causal LM with RouteScope's call interface (ablation, trace, KV cache)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..ablation import Ablation
from ..base import RouteScopeLM
from ..run_state import KVCache, RunState, current
from ..sites import INDICES, LOGITS, PROBS, WEIGHTS, Site, site_name
from ..specs import AblationError
from ..trace import Trace, active_trace
from .config import HFConfig, build_causal_lm
from .instrument import (_BATCH, _CAPTURE, _NONE, _REUSE_ATTENTION, _REUSE_EXPERTS, _InsideRouter, _site,
                         _unwrap, _wrap)
from .layout import HFRoutingLayer, _decoder_stack, _resolve, moe_layout, router_weights
from .prune import PruneMixin
from .quirks import EXPERTS_CALL, quirk
from .resume import ResumeMixin, recombine

SHARED_OUTPUT = "shared_output"  # the role of a shared expert's output
LOAD_BALANCE = "load_balance"  # the auxiliary loss term transformers computes with output_router_logits


class HFModel(ResumeMixin, PruneMixin, RouteScopeLM):
    """A transformers causal LM with RouteScope's call interface (ablation, trace, KV cache)."""

    def __init__(self, config: HFConfig, hf_model: nn.Module | None = None) -> None:
        super().__init__()
        self.config, self.context, self.vocab_size = config, config.context, config.vocab_size
        self.hf = hf_model if hf_model is not None else build_causal_lm(config.transformers_config())
        layers: dict[str, HFRoutingLayer] = {}
        sites: dict[str, Site] = {}
        self.quirk = quirk(config.model_type)  # what differs for this type from the generic block, and why
        for block in moe_layout(self.hf):
            name, n, k = block.router, block.n_experts, block.top_k
            shapes = {LOGITS: f"[batch, pos, {n}] router logits (dropped experts -inf)",
                      INDICES: f"[batch, pos, {k}] experts the block routed to (the experts module's input)",
                      WEIGHTS: f"[batch, pos, {k}] their weights (the experts module's input)",
                      PROBS: f"[batch, pos, {n}] the router's own probabilities (where it computes them)"}
            if block.shared:
                shapes[SHARED_OUTPUT] = "[batch, pos, hidden] the shared expert's output (before any gate; 0 dropped)"
            roles = {role: site_name(name, role) for role in shapes}
            for role, site in roles.items():
                sites[site] = _site(site, shapes[role])
            layers[name] = HFRoutingLayer(block, roles)
            _wrap(self.hf.get_submodule(name), self, HFModel._router_forward, name)
            if not block.routes_at_router:  # else the router's wrapper reads the routes (`Quirk.routes`)
                _wrap(self.hf.get_submodule(block.experts), self, HFModel._experts_forward, name)
            if block.shared:
                _wrap(self.hf.get_submodule(block.shared), self, HFModel._shared_forward, name)
            if block.shared_gate:
                gate = block.shared_gate
                sites[gate] = _site(gate, "[batch, pos, 1] shared-expert gate logit (the block applies its sigmoid)")
                _wrap(self.hf.get_submodule(gate), self, HFModel._gate_forward, gate)
        self.routing_modules = layers
        self.sites = sites
        self.attn_layers = []
        self._offload: Any = None  # load_hf's offload folder under device_map="auto"
        self._detached = False
        self._stack, self._decoder_of, self._tail = _decoder_stack(self.hf, list(layers), self.quirk.final_norm)
        if self._stack is not None:
            stack = self.hf.get_submodule(self._stack)
            for i, layer in enumerate(stack):
                _wrap(layer, self, HFModel._decoder_forward, i)
            for i in set(self._decoder_of.values()):
                attention = getattr(stack[i], "self_attn", None)
                if isinstance(attention, nn.Module):
                    _wrap(attention, self, HFModel._attention_forward, i)

    def detach(self) -> nn.Module:
        """Give the transformers model its own forwards back (every wrapper this HFModel installed is
        removed; a forward accelerate installed stays) and return it. This HFModel runs nothing after."""
        _unwrap(self.hf, self)
        self._detached = True
        return self.hf

    # --- wrapped forwards (installed once at load; per-call state only in ContextVars) --------------
    # Each is `inner` (the module's own forward) plus what the call in progress asks for. Idle, that is
    # one or two ContextVar reads: no module carries a hook, so torch calls each one on its fast path.
    # Each takes a weak reference to its HFModel (`instrument.Wrapped`): a module never keeps it alive.
    @staticmethod
    def _decoder_forward(ref: Any, i: int, inner: Any, *args: Any, **kwargs: Any) -> Any:
        cap = _CAPTURE.get()
        if cap is not None:
            cap.inputs[i] = (args, dict(kwargs))
        return inner(*args, **kwargs)

    @staticmethod
    def _attention_forward(ref: Any, i: int, inner: Any, *args: Any, **kwargs: Any) -> Any:
        """A routing decoder layer's attention: the output `resume` hands it (`_REUSE_ATTENTION`) instead
        of computing it again; under `capture`, its output kept where the layer's experts have not run
        yet (then no ablation of the layer can change it)."""
        self = ref()
        if self is None:  # the HFModel is gone: the module's own forward
            return inner(*args, **kwargs)
        reuse = _REUSE_ATTENTION.get()
        if reuse is not None and reuse[0] is self and reuse[1] == i:
            return reuse[2]
        out = inner(*args, **kwargs)
        cap = _CAPTURE.get()
        if cap is not None and not any(self._decoder_of[r] == i for r in cap.experts):
            cap.attention[i] = out
        return out

    @staticmethod
    def _router_forward(ref: Any, name: str, inner: Any, *args: Any, **kwargs: Any) -> Any:
        self = ref()
        if self is None:  # the HFModel is gone: the module's own forward
            return inner(*args, **kwargs)
        st, tr = current(), active_trace()
        dropped, row_mask = self._dropped_now(name, st) if st.row_ablations is not None or not st.ablation.is_empty \
            else (_NONE, None)
        layer = self.routing_modules[name]
        block = layer.block
        want_probs = tr is not None and block.probs_index is None and PROBS not in layer.unavailable \
            and tr.wants(layer.roles[PROBS])
        want_logits = tr is not None and block.logits_index is None and LOGITS not in layer.unavailable \
            and tr.wants(layer.roles[LOGITS])
        cap = _CAPTURE.get() if block.routes_at_router else None
        want_choice = block.routes_at_router and (cap is not None or tr is not None and (
            tr.wants(layer.roles[INDICES]) or tr.wants(layer.roles[WEIGHTS])))
        mode = None
        if dropped or want_probs or want_logits or want_choice:
            bias = _resolve(self.hf, block.choice_bias) if dropped and block.choice_bias else None
            mode = _InsideRouter(dropped, want_probs, bias, self.quirk.logit_mask, row_mask, self.quirk.logits_ops,
                                 want_choice, _resolve(self.hf, block.logits_weight) if block.logits_weight else None,
                                 block.choice_width)
            with mode:
                output = inner(*args, **kwargs)
        else:
            output = inner(*args, **kwargs)
        if want_choice:  # the block's routes: the router's top-k, weighted by its scores there
            if mode.chosen is None or block.choice_width is not None and mode.weights is None:
                raise ValueError(f"{self.config.model_type}: {name} made no top-k; its record reads the routes at "
                                 "its router's torch.topk")
            idx = mode.chosen
            w = mode.weights if block.choice_width is not None else router_weights(block, output, idx)
            if cap is not None:
                cap.experts[name] = (args[0] if args else kwargs["hidden_states"], idx, w)
            if tr is not None:
                self._visit(tr, layer.roles[INDICES], idx)
                self._visit(tr, layer.roles[WEIGHTS], w)
        if tr is not None:
            many = isinstance(output, (tuple, list))
            if block.logits_index is not None:
                self._visit(tr, layer.roles[LOGITS], output[block.logits_index] if many else output)
            elif mode is not None:
                self._visit(tr, layer.roles[LOGITS], mode.logits)
            if block.probs_index is not None:
                self._visit(tr, layer.roles[PROBS], output[block.probs_index])
            elif mode is not None and mode.probs is not None:
                self._visit(tr, layer.roles[PROBS], mode.probs)
        return output

    @staticmethod
    def _experts_forward(ref: Any, name: str, inner: Any, *args: Any, **kwargs: Any) -> Any:
        """The experts of routing layer `name`, called as experts(hidden_states, top_k_index,
        top_k_weights) (`quirks.EXPERTS_CALL`; `moe_layout` checked the signature at load), positionally or
        by name. A call without the indices and weights is refused, never passed on unrecorded."""
        self = ref()
        if self is None:  # the HFModel is gone: the module's own forward
            return inner(*args, **kwargs)
        got = [args[j] if j < len(args) else kwargs.get(k) for j, k in enumerate(EXPERTS_CALL)]
        if any(x is None for x in got):
            raise ValueError(f"{self.config.model_type}: {name}'s experts were called without "
                             f"{', '.join(k for k, x in zip(EXPERTS_CALL, got) if x is None)}; its record expects "
                             f"experts({', '.join(EXPERTS_CALL)})")
        cap = _CAPTURE.get()
        if cap is not None:
            cap.experts[name] = tuple(got)
        tr = active_trace()
        if tr is not None:
            roles = self.routing_modules[name].roles
            self._visit(tr, roles[INDICES], got[1])
            self._visit(tr, roles[WEIGHTS], got[2])
        reuse = _REUSE_EXPERTS.get()
        if reuse is not None and reuse[0] is self and reuse[1] == name:
            return recombine(inner, reuse[2], reuse[3], *got)
        return inner(*args, **kwargs)

    def _visit(self, tr: Trace, site: str, x: Any) -> None:
        if isinstance(x, torch.Tensor) and tr.wants(site):
            tr.visit(site, x.reshape(_BATCH.get(), -1, x.shape[-1]), 1, self.sites[site].shape)

    @staticmethod
    def _shared_forward(ref: Any, layer: str, inner: Any, *args: Any, **kwargs: Any) -> Any:
        """A shared expert: its output zeroed where the call drops it (the layer's last option)."""
        self = ref()
        if self is None:  # the HFModel is gone: the module's own forward
            return inner(*args, **kwargs)
        output = inner(*args, **kwargs)
        st = current()
        option = self.routing_modules[layer].n_experts
        if st.row_ablations is not None:
            drop = torch.tensor([option in a.dropped(layer) for a in st.row_ablations], device=output.device)
            if bool(drop.any()):
                output = output.reshape(drop.shape[0], -1).masked_fill(drop[:, None], 0).reshape(output.shape)
        elif not st.ablation.is_empty and option in st.ablation.dropped(layer):
            output = torch.zeros_like(output)
        tr = active_trace()
        if tr is not None:
            self._visit(tr, self.routing_modules[layer].roles[SHARED_OUTPUT], output)
        return output

    @staticmethod
    def _gate_forward(ref: Any, site: str, inner: Any, *args: Any, **kwargs: Any) -> Any:
        self = ref()
        if self is None:  # the HFModel is gone: the module's own forward
            return inner(*args, **kwargs)
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
            if self.quirk.logit_mask != float("-inf") and 0 < left < m.top_k:
                raise AblationError(f"invalid ablation: {layer!r} keeps {left} routed expert(s) but "
                                    f"{self.config.model_type} routes each token to {m.top_k}: with a finite mask "
                                    "its router would still weight a dropped expert; keep at least "
                                    f"{m.top_k}")
            if left <= 0:
                raise AblationError(f"invalid ablation: drop: every routed expert of layer {layer!r} is "
                                    "dropped; at least one must remain")

    def _forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self._detached:
            raise ValueError(f"{self.config.model_type}: this HFModel was detached from its transformers model")
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


    def float32_copy(self) -> "HFModel":
        """A float32 copy, rebuilt by transformers and given the weights (the shared model is not touched)."""
        if all(p.dtype == torch.float32 for p in self.parameters()):
            return self
        hf = build_causal_lm(self.config.transformers_config(), dtype=torch.float32)
        hf.load_state_dict({k: v.float() for k, v in self.hf.state_dict().items()})
        return HFModel(self.config, hf.to(self.device).eval()).eval()


    def aux_weights(self) -> dict[str, float]:
        """Training: transformers' load-balancing loss, weighted by the model's router_aux_loss_coef."""
        coef = getattr(self.hf.config, "router_aux_loss_coef", None)
        return {LOAD_BALANCE: float(coef)} if coef is not None else {}


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


def execution_device(where: Any) -> torch.device:
    """A device-map entry (GPU index, "cpu", "disk", "cuda:1", ...) -> where its inputs are computed:
    accelerate runs disk-offloaded modules on the CPU when no GPU is in the map."""
    if isinstance(where, int):
        return torch.device("cuda", where)
    return torch.device("cpu" if where == "disk" else where)

