"""First-order estimates of every expert's effect from one forward and one backward pass per batch
(attribution patching, Nanda 2023; AtP*, Kramar et al. 2024), for transformers MoE blocks.

The loss L is the dataset's mean next-token NLL over every predicted position (token-weighted, as
`delta_nll`). For routing layer l, option e and each token t:

    estimate(l, e) = sum_t  dL/dy_t . (y_t[drop e] - y_t)

y_t is the MoE block's output at t (before the residual add; a shared expert is part of the block),
y_t[drop e] the block's output with its input held fixed and e dropped as the sweep drops it (the
router's own masking through `Ablation`: the next choice takes the slot, weights renormalised as
that router does). Only the routing changes with a routed expert's drop, and the experts call is a
weighted sum, experts(h, idx, w) = sum_s w_s E_{idx_s}(h), so with W_tj the weight token t gives
expert j (0 where not chosen):

    y_t[drop e] - y_t = sum_j (W'_tj - W_tj) E_j(h_t)   and   dL/dy_t . E_j(h_t) = dL/dW_tj

for the experts a token chose (one backward gives all of them: the gradient of L at the experts
call's `top_k_weights`). W' comes from the block rerun on the captured inputs with its experts
replaced by a stand-in that keeps the routes and computes nothing (the router alone, per dropped
expert); E_j is computed only for the (token, expert) pairs a drop brings in (the next choice: one
expert per token in top-k routing). A shared expert's drop: the block rerun with and without it,
routed experts stood in. The decomposition is checked on the first batch against the block itself
rerun under each of two drops (`LINEAR_RTOL`), on the tokens that chose either and the first
`CHECK_TOKENS` (the block routes each token alone); a layer that fails has no estimate and says why.

Nothing is registered on the shared model: the forward runs on a private shallow replica whose MoE
blocks, experts and input embedding are private stand-ins around the shared modules (as
`runs.attribution` does), and no gradient reaches a parameter (`torch.autograd.grad` to the
activations only).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from routescope.core_models.ablation import Ablation
from routescope.core_models.hf.instrument import Wrapped
from routescope.core_models.hf.quirks import EXPERTS_CALL, ONE_SLOT
from routescope.core_models.run_state import RunState, running

from routescope.analysis.corpus.run import Stopped
from routescope.analysis.reports.importance.plan import Scope, Tokens, batches

LINEAR_RTOL = 1e-3  # composed change vs the block's rerun, relative to sum_t |dL/dy_t| |dy_t| (float32: ~1e-6)
CHECK_TOKENS = 64  # besides the tokens that chose a checked option, the decomposition is checked on these
CHUNK_VALUES = 2**25  # floats of block input repeated per dropped expert in one router pass (128 MiB)


class Unavailable(ValueError):
    """Why a model or a layer has no first-order estimate (one line)."""


@dataclass
class Estimates:
    """Per (layer, option): per-row sums of the estimated NLL change (divide by the dataset's
    predicted positions for the mean); `reasons`: layer -> why it has none (its rows NaN)."""

    keys: list[tuple[str, int]]
    d_nll: np.ndarray  # [options, rows]
    reasons: dict[str, str] = field(default_factory=dict)

    def mean(self, positions: float) -> dict[tuple[str, int], float]:
        return {k: float(self.d_nll[i].sum() / positions) for i, k in enumerate(self.keys)}


def support(model: Any, layers: list[str]) -> dict[str, str | None]:
    """Layer -> None where its estimate can be made, else why not (one line): the estimate needs a
    transformers MoE block whose experts are called as experts(hidden_states, top_k_index,
    top_k_weights), in one stack of decoder layers on one device."""
    out: dict[str, str | None] = {}
    label = getattr(model.config, "label", type(model).__name__)
    for l in layers:
        block = getattr(model.routing_modules[l], "block", None)
        if block is None:
            out[l] = (f"{label}: a RouteScope family: the estimate needs a transformers MoE block "
                      f"(experts({', '.join(EXPERTS_CALL)}))")
        elif not model.can_resume:
            out[l] = f"{label}: its routers are not in one stack of decoder layers"
        elif model.hf.__dict__.get("hf_device_map"):
            out[l] = f"{label}: placed by a device map (its modules carry accelerate's forwards)"
        elif block.routes_at_router or block.experts is None:
            out[l] = (f"{model.config.model_type}: its experts are not called as experts({', '.join(EXPERTS_CALL)})"
                      f" ({block.quirk.why})")
        elif model.quirk.reason(ONE_SLOT):
            out[l] = f"{model.config.model_type}: {model.quirk.reason(ONE_SLOT)}"
        else:
            out[l] = None
    return out


# --- a private replica of the model with stand-ins ------------------------------------------------

def _copy(m: nn.Module) -> nn.Module:
    """Shallow copy sharing parameters, buffers and hooks, with its own child table; an HFModel
    wrapper on its forward (bound to the shared module) is left out, so the class's forward runs on
    the copy's children."""
    r = m.__new__(type(m))
    r.__dict__ = m.__dict__.copy()
    r._modules = m._modules.copy()
    f = r.__dict__.get("forward")
    if f is not None:
        if not (isinstance(f, Wrapped) and f.restore is None):
            raise Unavailable(f"{type(m).__name__} carries a forward of its own (a device map's dispatch?)")
        del r.__dict__["forward"]
    return r


def _replicate(root: nn.Module, replace: dict[str, nn.Module]) -> nn.Module:
    """A shallow replica of `root` with the module at each path replaced (the shared tree untouched)."""
    memo = {"": _copy(root)}
    for path, new in replace.items():
        parts = path.split(".")
        parent = memo[""]
        for i, name in enumerate(parts[:-1]):
            p = ".".join(parts[:i + 1])
            if p not in memo:
                memo[p] = _copy(parent._modules[name])
                parent._modules[name] = memo[p]
            parent = memo[p]
        parent._modules[parts[-1]] = new
    return memo[""]


class _Experts(nn.Module):
    """Stand-in for an experts module: keeps each call's (hidden_states, top_k_index, top_k_weights)
    and runs the shared module (`run`) or returns zeros (a router-only pass)."""

    def __init__(self, inner: nn.Module, run: bool) -> None:
        super().__init__()
        object.__setattr__(self, "inner", inner)  # not a child: the stand-in owns nothing
        self.run, self.calls = run, []

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        got = tuple(args[j] if j < len(args) else kwargs[k] for j, k in enumerate(EXPERTS_CALL))
        self.calls.append(got)
        return self.inner(*args, **kwargs) if self.run else torch.zeros_like(got[0])


class _Zero(nn.Module):
    def forward(self, hidden_states: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        return torch.zeros_like(hidden_states)


class _Keep(nn.Module):
    """Stand-in for an MoE block: the block's copy run as is, its input and output kept."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "inner", inner)
        self.input = self.output = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        self.input = args[0] if args else kwargs["hidden_states"]
        self.output = out[0] if isinstance(out, (tuple, list)) else out
        return out


class _Leaf(nn.Module):
    """Stand-in for the input embedding whose output requires grad (a model with frozen parameters
    still builds the graph the backward needs)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "inner", inner)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.inner(ids)
        return e if e.requires_grad else e.detach().requires_grad_()


def _child(block: str, path: str) -> str:
    return path[len(block) + 1:]


def _block_copy(model: Any, layer: str, run_experts: bool, shared: bool) -> tuple[nn.Module, _Experts]:
    """A copy of `layer`'s MoE block with its experts stood in (`run_experts`: run them) and, unless
    `shared`, its shared expert replaced by zeros."""
    b = model.routing_modules[layer].block
    path = b.router.rsplit(".", 1)[0]
    blk = _copy(model.hf.get_submodule(path))
    experts = _Experts(model.hf.get_submodule(b.experts), run_experts)
    blk._modules[_child(path, b.experts)] = experts
    if b.shared and not shared:
        blk._modules[_child(path, b.shared)] = _Zero()
    return blk, experts


# --- one batch ----------------------------------------------------------------------------------------

@dataclass
class Gradients:
    """One batch's forward and backward at one layer, on its predicted positions (N of them):
    `x` the block's input [N, d], `h` the experts' input [N, d], `g` dL/dy [N, d] (L: the batch's
    summed NLL), `W` [N, n] the weights the forward gave each routed expert, `chosen` [N, n] which it
    ran, `A` [N, n] dL/dW where chosen (filled in for other experts by `along`)."""

    x: torch.Tensor
    h: torch.Tensor
    g: torch.Tensor
    W: torch.Tensor
    chosen: torch.Tensor
    A: torch.Tensor
    experts: nn.Module
    known: torch.Tensor  # [N, n] where A holds dL/dW

    def along(self, W_new: torch.Tensor) -> torch.Tensor:
        """[m, N] dL/dy_t . (y_t under W_new - y_t) for routed weights W_new [m, N, n]: the change of the
        experts' output, exact, by the weighted-sum identity (module doc); E_j(h_t) computed for the
        pairs W_new brings in that the forward did not run."""
        diff = W_new - self.W[None]
        need = ((diff != 0).any(0) & ~self.known).nonzero()
        for s in range(0, len(need), 4096):
            t, j = need[s:s + 4096].unbind(-1)
            one = torch.ones(len(t), 1, dtype=self.h.dtype, device=self.h.device)
            e = self.experts(self.h[t], j[:, None], one)  # [P, d]: E_j(h_t), the shared experts module
            self.A[t, j] = (e.float() * self.g[t]).sum(-1)
            self.known[t, j] = True
        return (diff * self.A[None]).sum(-1)


def dense(idx: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    """[..., n] the weight each expert gets from top-k `idx`, `w` [..., k] (slots outside 0..n-1 left out)."""
    ok = (idx >= 0) & (idx < n)
    out = torch.zeros(*idx.shape[:-1], n + 1, dtype=torch.float32, device=idx.device)
    out.scatter_add_(-1, torch.where(ok, idx, n).long(), torch.where(ok, w.float(), 0))
    return out[..., :n]


def gradients(model: Any, x: torch.Tensor, lengths: torch.Tensor, layers: list[str]) -> tuple[dict, torch.Tensor]:
    """({layer: Gradients}, predicted positions' row index [N]) of one batch `x` [R, T] (right-padded)."""
    R, T = x.shape
    keeps, experts = {}, {}
    emb = model.token_embedding().removeprefix("hf.")
    replace: dict[str, nn.Module] = {emb: _Leaf(model.hf.get_submodule(emb))}
    for l in layers:
        blk, experts[l] = _block_copy(model, l, True, True)
        keeps[l] = replace[model.routing_modules[l].block.router.rsplit(".", 1)[0]] = _Keep(blk)
    replica = _replicate(model.hf, replace)
    valid = (torch.arange(T)[None, :] < (lengths[:, None] - 1)).reshape(-1).to(x.device)
    flat = valid.nonzero()[:, 0]
    with torch.inference_mode(False), torch.enable_grad(), running(RunState()):
        x = x.clone()  # an inference tensor cannot be saved for the backward
        logits = replica(input_ids=x).logits
        z = logits.reshape(R * T, -1)[flat].float()
        nll = F.cross_entropy(z, x.reshape(-1)[flat + 1], reduction="sum")
        ws = [experts[l].calls[0][2] for l in layers]
        if not all(w.requires_grad for w in ws):
            raise Unavailable(f"{model.config.model_type}: its experts' weights carry no gradient")
        grads = torch.autograd.grad(nll, [keeps[l].output for l in layers] + ws, allow_unused=True)
    out = {}
    with torch.no_grad():
        for i, l in enumerate(layers):
            n = model.routing_modules[l].n_experts
            h, idx, w = experts[l].calls[0]
            d = h.shape[-1]
            if h.numel() != R * T * d or keeps[l].output.numel() != R * T * d:
                raise Unavailable(f"{l}: its experts see {h.numel() // d} tokens of the batch's {R * T}")
            gy, gw = grads[i], grads[len(layers) + i]
            if gy is None or gw is None:
                raise Unavailable(f"{l}: the loss does not depend on its block's output through its experts")
            idx = idx.reshape(R * T, -1)[flat]
            A = dense(idx, gw.reshape(R * T, -1)[flat], n)
            chosen = dense(idx, torch.ones_like(idx, dtype=torch.float32), n) > 0
            out[l] = Gradients(keeps[l].input.detach().reshape(R * T, d)[flat], h.detach().reshape(R * T, d)[flat],
                               gy.reshape(R * T, d)[flat].float(), dense(idx, w.detach().reshape(R * T, -1)[flat], n),
                               chosen, A, experts[l].inner, chosen.clone())
    return out, flat // T


def _routes(blk: nn.Module, stand_in: _Experts, x: torch.Tensor, drops: list[Ablation], n: int) -> torch.Tensor:
    """[len(drops) or 1, N, n] the routed weights the block gives each token of `x` [N, d] under each
    ablation (none: unablated), its experts stood in."""
    stand_in.calls.clear()
    m = max(1, len(drops))
    rep = x[None].expand(m, *x.shape).contiguous()
    with running(RunState(row_ablations=tuple(drops)) if drops else RunState()):
        blk(rep)
    _, idx, w = stand_in.calls[-1]
    return dense(idx.reshape(m, x.shape[0], -1), w.reshape(m, x.shape[0], -1), n)


def _block_output(blk: nn.Module, x: torch.Tensor, ab: Ablation) -> torch.Tensor:
    with running(RunState(ablation=ab)):
        out = blk(x[None])
    return (out[0] if isinstance(out, (tuple, list)) else out).reshape(x.shape).float()


def layer_estimates(model: Any, layer: str, gr: Gradients, options: tuple[int, ...], check: bool
                    ) -> dict[int, torch.Tensor]:
    """Option -> [N] per-token dL/dy . (change of y when it is dropped) at `layer`; options whose drop
    the model refuses are left out. `check`: the composition compared with the block rerun under the
    first two routed drops (Unavailable where they differ)."""
    m = model.routing_modules[layer]
    n = m.n_experts
    valid = []
    for o in options:
        try:
            model._check_ablation(Ablation(drop=((layer, o),)))
            valid.append(o)
        except ValueError:
            continue
    routed = [o for o in valid if o < n]
    out: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        blk, stand_in = _block_copy(model, layer, False, False)
        W0 = _routes(blk, stand_in, gr.x, [], n)[0]
        gr.W = W0  # the block rerun's own unablated weights: the drop changes only what it changes
        per = max(1, CHUNK_VALUES // max(1, gr.x.numel()))
        for s in range(0, len(routed), per):
            part = routed[s:s + per]
            W1 = _routes(blk, stand_in, gr.x, [Ablation(drop=((layer, o),)) for o in part], n)
            for o, v in zip(part, gr.along(W1)):
                out[o] = v
        if m.shared and n in valid:
            sblk, _ = _block_copy(model, layer, False, True)
            dy = _block_output(sblk, gr.x, Ablation(drop=((layer, n),))) - _block_output(sblk, gr.x, Ablation())
            out[n] = (gr.g * dy).sum(-1)
        if check:
            real = model.hf.get_submodule(m.block.router.rsplit(".", 1)[0])
            two = routed[:2]
            # the tokens that chose either checked option, and the first CHECK_TOKENS: rerunning the whole
            # batch's block three times cost 16 of the 44 s estimate at OLMoE's real shape (one batch)
            sub = (gr.chosen[:, two].any(-1) | (torch.arange(len(gr.x), device=gr.x.device) < CHECK_TOKENS)) \
                if two else torch.zeros(len(gr.x), dtype=torch.bool)
            x, g = gr.x[sub], gr.g[sub]
            base = _block_output(real, x, Ablation())
            for o in two:
                dy = _block_output(real, x, Ablation(drop=((layer, o),))) - base
                exact = float((g * dy).sum())
                scale = float((g.norm(dim=-1) * dy.norm(dim=-1)).sum())
                if abs(float(out[o][sub].sum()) - exact) > LINEAR_RTOL * scale + 1e-30:
                    raise Unavailable(f"{layer}: its block's output is not the experts call's weighted sum (dropping "
                                      f"{o}: {float(out[o].sum()):.4g} composed, {exact:.4g} rerun)")
    return out


def estimate(model: Any, tokens: Tokens, scope: Scope, batch_size: int, *,
             progress: Callable[[int], None] | None = None, stop: Callable[[], bool] | None = None) -> Estimates:
    """Per (layer, option) of `scope`, per row: the summed first-order NLL change (module doc). Layers
    without an estimate (`support`, or a failed check) keep NaN rows and a reason."""
    keys = [(l, o) for l in scope.layers for o in scope.options[l]]
    est = Estimates(keys, np.zeros((len(keys), len(tokens.ids))))
    at = {k: i for i, k in enumerate(keys)}
    reasons = {l: r for l, r in support(model, list(scope.layers)).items() if r is not None}
    pad = max(0, int(getattr(model.config, "pad_id", 0)))
    checked: set[str] = set()
    done = 0
    for rows, x, lengths in batches(tokens, batch_size, pad):
        if stop is not None and stop():
            raise Stopped()
        live = [l for l in scope.layers if l not in reasons]
        if live:
            try:
                grads, row_of = gradients(model, x.to(model.device), lengths, live)
            except Unavailable as e:
                reasons.update({l: str(e) for l in live})
                grads, live = {}, []
        for l in live:
            try:
                vals = layer_estimates(model, l, grads[l], scope.options[l], l not in checked)
            except Unavailable as e:
                reasons[l] = str(e)
                continue
            checked.add(l)
            for o, v in vals.items():
                per_row = torch.zeros(len(rows), dtype=torch.float64).index_add_(0, row_of.cpu(), v.double().cpu())
                est.d_nll[at[(l, o)], rows] = per_row.numpy()
            for o in scope.options[l]:
                if o not in vals:
                    est.d_nll[at[(l, o)], rows] = np.nan
        done += len(rows)
        if progress is not None:
            progress(done)
    for l, why in reasons.items():
        for o in scope.options[l]:
            est.d_nll[at[(l, o)]] = np.nan
    est.reasons = reasons
    return est
