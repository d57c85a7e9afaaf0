"""Prefix reuse: one forward captured (`HFModel.capture`), then restarted at a routing layer's decoder
layer under other ablations (`HFModel.resume`), on transformers' own decoder layers."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..ablation import Ablation
from ..run_state import RunState, running
from ..specs import ALL_LAYERS
from .instrument import _BATCH, _CAPTURE, _REUSE_ATTENTION, _REUSE_EXPERTS, Prefix
from .quirks import ONE_SLOT

SLOT_CHUNK = 2**24  # values of repeated experts input per call of `slot_outputs` (64 MiB in float32)


class ResumeMixin:
    """HFModel's capture / resume (needs its routing_modules, _stack, _decoder_of and _tail)."""

    # --- prefix reuse: a forward restarted at a routing layer's decoder layer ----------------------
    @property
    def can_resume(self) -> bool:
        """Whether `capture` / `resume` work for this model: its routers sit in one stack of decoder
        layers, followed by a final norm and the output embedding."""
        return self._stack is not None

    def capture(self, idx: torch.Tensor, ablation: Ablation | None = None) -> Prefix:
        """One forward of `idx` (unablated unless `ablation` is given; `resume` needs an unablated one)
        that keeps each decoder layer's input (its hidden states and the other arguments transformers
        gave it) and each experts module's input."""
        if self._stack is None:
            why = self.quirk.reason("resume") or "no single stack of decoder layers with a final norm"
            raise ValueError(f"{self.config.model_type}: its forward cannot be restarted at a routing layer ({why})")
        cap = Prefix(rows=int(idx.shape[0]))
        token = _CAPTURE.set(cap)
        try:
            cap.logits = self(idx, ablation=ablation).logits
        finally:
            _CAPTURE.reset(token)
        return cap

    def resume(self, prefix: Prefix, layer: str, row_ablations: list[Ablation] | tuple, *,
               head: bool = True, expert_outputs: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [len(row_ablations), pos, vocab] (float32) of the captured batch repeated
        len(row_ablations) / prefix.rows times, block j of rows under ablations j * rows ..., run from
        the decoder layer of routing layer `layer` on with transformers' own decoder layers, final norm
        and output embedding. Every ablation must leave the layers before `layer` alone. That decoder
        layer's attention, computed before its experts (`Prefix.attention`), is not computed again:
        its captured output is returned by the attention's wrapped forward (`_attention_forward`). `head=False`:
        the final norm's output [len(row_ablations), pos, hidden] instead (`output_embedding`'s input),
        for a caller that needs the logits of some positions only, or a chunk at a time. `expert_outputs`:
        `layer`'s per-slot expert outputs of the captured batch (`expert_outputs(prefix, layer)`, [rows,
        pos, k, hidden]): its experts call is then answered from them (`recombine`), running only the
        experts an ablation brings in: a dropped expert's tokens (1/8 of them at 64 experts, top-8) take
        their next choice, and only that (token, expert) pair is new."""
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
        experts = None
        if expert_outputs is not None:
            _, idx0, _ = prefix.experts[layer]
            k = idx0.shape[-1]
            experts = (self, layer, idx0.reshape(-1, k), expert_outputs.reshape(-1, k, expert_outputs.shape[-1]))
        with running(state):
            token = _BATCH.set(len(row_ablations))
            try:
                for i in range(start, len(stack)):
                    args, kwargs = _repeat_rows(prefix.inputs[i], R, m, copies)
                    if h is not None:
                        args, kwargs = _with_hidden(args, kwargs, h)
                    reusing = _REUSE_ATTENTION.set(reuse if i == start else None)
                    recombining = _REUSE_EXPERTS.set(experts if i == start else None)
                    try:
                        out = stack[i](*args, **kwargs)
                    finally:
                        _REUSE_EXPERTS.reset(recombining)
                        _REUSE_ATTENTION.reset(reusing)
                    h = out[0] if isinstance(out, (tuple, list)) else out
                hidden = self.hf.get_submodule(self._tail[0])(h)
            finally:
                _BATCH.reset(token)
        return self.output_embedding(hidden).float() if head else hidden

    def can_recombine(self, layer: str) -> bool:
        """Whether `resume` can answer `layer`'s experts call from its captured per-slot outputs: its
        experts are one module called as experts(hidden_states, top_k_index, top_k_weights)."""
        block = self.routing_modules[layer].block
        return self._stack is not None and block.experts is not None and not block.routes_at_router \
            and self.quirk.reason(ONE_SLOT) is None

    @property
    def output_embedding(self) -> nn.Module:
        """transformers' output embedding (`get_output_embeddings`): final hidden states -> logits."""
        return self.hf.get_submodule(self._tail[1])

    def expert_outputs(self, prefix: Prefix, layer: str) -> torch.Tensor:
        """[rows, pos, k, hidden]: at `layer`, each selected expert's own output (unweighted) for every
        token of the captured batch, from transformers' experts module called on the captured input
        (`slot_outputs`)."""
        hidden, idx, w = prefix.experts[layer]
        block = self.routing_modules[layer].block
        if block.experts is None:
            raise ValueError(f"{self.config.model_type}: {layer} has no per-expert outputs: "
                             f"{block.quirk.reason('expert_outputs') or 'its experts are not one module'}")
        experts = self.hf.get_submodule(block.experts)
        if block.routes_at_router:  # experts that take every expert's copy of the tokens, pre-scaled
            n, flat = block.n_experts, hidden.reshape(-1, hidden.shape[-1])  # (Llama-4): scaled by 1 here
            every = experts(flat.repeat(n, 1)).reshape(n, flat.shape[0], -1)  # [n, tokens, hidden]
            tokens = torch.arange(flat.shape[0], device=idx.device)[:, None]
            out = every[idx.reshape(flat.shape[0], -1), tokens]  # [tokens, k, hidden]
            return out.reshape(prefix.rows, -1, idx.shape[-1], out.shape[-1])
        if self.quirk.reason(ONE_SLOT) is None:
            out = slot_outputs(experts, hidden, idx, w.dtype)
            return out.reshape(prefix.rows, -1, *out.shape[1:])
        outs = []  # one call per slot, the others weighted 0: every expert a token chose runs k times
        for slot in range(idx.shape[-1]):
            one = torch.zeros_like(w)
            one[..., slot] = 1
            outs.append(experts(hidden, idx, one))
        return torch.stack(outs, -2).reshape(prefix.rows, -1, idx.shape[-1], outs[0].shape[-1])

    def expert_output_norms(self, prefix: Prefix, layer: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indices [N, k], weights [N, k], ||expert output|| [N, k]) at `layer` for the N tokens of the
        captured batch (rows x pos), the norms of `expert_outputs`; NaN norms where the layer's record
        has no per-expert outputs (`Quirk.reason("expert_outputs")`: JetMoE, Doge), so REAP is NaN there."""
        _, idx, w = prefix.experts[layer]
        if self.routing_modules[layer].block.experts is None:
            norms = torch.full(idx.shape, float("nan"))
        else:
            norms = self.expert_outputs(prefix, layer).float().norm(dim=-1)
        return idx.reshape(-1, idx.shape[-1]), w.reshape(-1, w.shape[-1]).float(), norms.reshape(-1, idx.shape[-1])


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



def slot_outputs(experts: nn.Module, hidden: torch.Tensor, idx: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, k, hidden]: each of N tokens' k selected experts' own outputs (weight 1), from transformers'
    experts module called with every token repeated once per slot, one expert each: the work of one
    MoE forward (each expert runs on the tokens that chose it), not k of them (one call per slot, the
    others weighted 0, ran every expert a token chose k times). `SLOT_CHUNK` values of input at a time."""
    d = hidden.shape[-1]
    h, i = hidden.reshape(-1, d), idx.reshape(-1, idx.shape[-1])
    k = i.shape[-1]
    per, outs = max(1, SLOT_CHUNK // (k * d)), []
    for s in range(0, h.shape[0], per):
        js = i[s:s + per].reshape(-1, 1)
        one = torch.ones(js.shape, dtype=dtype, device=js.device)
        outs.append(experts(h[s:s + per].repeat_interleave(k, 0), js, one).reshape(-1, k, d))
    return torch.cat(outs) if outs else h.new_zeros(0, k, d)


def recombine(inner: Any, idx0: torch.Tensor, out0: torch.Tensor, hidden: torch.Tensor, idx: torch.Tensor,
              w: torch.Tensor) -> torch.Tensor:
    """experts(hidden, idx, w) (`inner`: the module's own forward) as the weighted sum it is,
    sum_s w_s E_{idx_s}(h), from the captured batch's per-slot outputs `out0` [N, k, d] of its routes
    `idx0` [N, k]: token t of `hidden` [m * N, d] (the captured batch repeated m times) is captured
    token t mod N. Only pairs the captured routes lack run (one experts call, one slot each). Equal to
    the experts call to float rounding (another summation order, other matmul shapes): a model whose
    experts call is not that sum fails the sweep's check (`importance.measure.reuse_reproduces`).
    `SLOT_CHUNK` values of gathered outputs at a time."""
    d = hidden.shape[-1]
    h = hidden.reshape(-1, d)
    M, n0 = h.shape[0], idx0.shape[0]
    i, wt = idx.reshape(M, -1), w.reshape(M, -1)
    out = torch.empty_like(h)
    per = max(1, SLOT_CHUNK // (i.shape[-1] * d))
    for a in range(0, M, per):
        b = min(M, a + per)
        t0 = torch.arange(a, b, device=h.device) % n0
        same = i[a:b, :, None] == idx0[t0][:, None, :]  # [c, k', k]: slot s' of t is slot s of its captured token
        vals = out0[t0[:, None], same.to(torch.uint8).argmax(-1)]  # [c, k', d]
        new = (~same.any(-1)).nonzero()
        if len(new):
            t, s = new.unbind(-1)
            one = torch.ones(len(t), 1, dtype=wt.dtype, device=h.device)
            vals[t, s] = inner(h[a + t], i[a + t, s][:, None], one).reshape(len(t), d).to(vals.dtype)
        out[a:b] = (vals * wt[a:b, :, None].to(vals.dtype)).sum(1).to(out.dtype)
    return out.reshape(hidden.shape)
