"""Parts of the Wiola family (see `wiola.py`): WiolaRMSNorm, SRPE, adaptive token merging (ATM)
and the dual-stream feed-forward (DSFF). Ordered from parts to whole. Section numbers refer to
the Wiola paper (arXiv:2607.01394)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import MLP, SwiGLU, rms_norm
from .sites import ADJACENT_COS, GATE, MERGE_MAP, PATHS, RoleLayer, RoutingLayer, Site

ROPE_BASE = 10000.0


class WiolaRMSNorm(nn.Module):
    """RMSNorm with a learned per-dimension offset applied before normalising:
    y = w * (x + delta) / sqrt(mean((x + delta)^2) + eps); delta starts at 0, w at 1. Float32."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.delta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.float() + self.delta.float()  # (..., d)
        return rms_norm(z, self.weight, self.eps).type_as(x)


class SRPE(nn.Module):
    """Spiral rotary position encoding (Sec. VI, eqs. 11-18), applied to queries and keys like RoPE.

    Feature pair j (rotate-half pairing: j with j + hd/2, j = 0 .. hd/2 - 1) at absolute position
    p is turned by the winding angle Theta_j(p) and scaled by the radial factor r_j(p):

        omega_j    = 10000^(-2j / hd)
        Theta_j(p) = p * omega_j * (1 + 1 / k_s)
        r_j(p)     = 1 + a_s * sin(p * f_s * omega_j)
        (a, b)    -> r_j(p) * (a cos Theta - b sin Theta,  b cos Theta + a sin Theta)

    so position p sits on a helix: the angle winds at omega_j (1 + 1/k_s) per position, the radius
    oscillates around 1 with amplitude a_s (dimensionless) as the sine of p f_s omega_j (radians).
    No learned parameters. The score of query p and key n turns by the relative angle
    (p - n) omega_j (1 + 1/k_s) (eq. 19) and is scaled by r_j(p) r_j(n), an absolute-position term within [(1 - a_s)^2, (1 + a_s)^2]. a_s = 0 is RoPE
    with every frequency times (1 + 1/k_s). The authors' code computes the tables in float32; we
    compute them in float64 and store float32 (the nearest float32 to the formula). Tables cover
    2 * context positions and are non-persistent buffers (never in checkpoints).
    """

    def __init__(self, head_dim: int, context: int, k_s: int = 8, a_s: float = 0.1, f_s: float = 0.01) -> None:
        super().__init__()
        omega = ROPE_BASE ** (-2.0 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)  # (hd/2,)
        p = torch.arange(2 * context, dtype=torch.float64)[:, None]  # (2C, 1)
        theta = p * omega * (1.0 + 1.0 / k_s)  # (2C, hd/2) winding angle
        radius = 1.0 + a_s * torch.sin(p * f_s * omega)  # (2C, hd/2) radial factor r_j(p)
        self.register_buffer("cos", (radius * theta.cos()).float(), persistent=False)
        self.register_buffer("sin", (radius * theta.sin()).float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: (B, H, T, hd); positions: (B or 1, T) absolute int64 positions
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # (B|1, 1, T, hd/2)
        a, b = x.float().chunk(2, dim=-1)
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).type_as(x)


# --- adaptive token merging --------------------------------------------------------------------

def greedy_merge_map(cos: torch.Tensor, tau: float) -> torch.Tensor:
    """(B, T-1) adjacent cosines -> (B, T) int64 group index per position.

    Left to right, token t merges with t + 1 when cos[t] > tau and t is not already merged with
    t - 1 (pairs never overlap). In a run of consecutive above-threshold edges the greedy scan
    takes the 1st, 3rd, 5th ... edge, which is what this computes without a Python loop.
    """
    B, E = cos.shape
    if E == 0:  # a single token: nothing to merge
        return torch.zeros(B, 1, dtype=torch.long, device=cos.device)
    above = cos > tau  # (B, T-1)
    pos = torch.arange(E, device=cos.device).expand(B, E)
    last_below = torch.where(above, torch.full_like(pos, -1), pos).cummax(dim=1).values
    run = pos - last_below  # 1-based index of edge t within its run of above-threshold edges
    picked = above & (run % 2 == 1)  # (B, T-1) t merges with t + 1
    starts = torch.cat((torch.ones(B, 1, dtype=torch.bool, device=cos.device), ~picked), dim=1)  # (B, T)
    return starts.long().cumsum(dim=1) - 1


def merge_groups(t: torch.Tensor, groups: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Mean of t over each group: (B, T, *rest) -> (B, n_groups, *rest); missing groups are 0."""
    B, T = groups.shape
    idx = groups.view(B, T, *[1] * (t.dim() - 2)).expand_as(t)
    total = t.new_zeros(B, n_groups, *t.shape[2:]).scatter_add(1, idx, t)
    count = t.new_zeros(B, n_groups).scatter_add(1, groups, t.new_ones(B, T)).clamp(min=1)
    return total / count.view(B, n_groups, *[1] * (t.dim() - 2))


def restore_groups(t: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(B, G, *rest) -> (B, T, *rest): every position gets its group's value (eq. 32)."""
    return take_positions(t, groups)


def take_positions(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(B, N, *rest), index (B, M) -> (B, M, *rest): out[b, m] = t[b, index[b, m]]."""
    B, M = index.shape
    return t.gather(1, index.view(B, M, *[1] * (t.dim() - 2)).expand(B, M, *t.shape[2:]))


def first_positions(groups: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(B, T) groups -> (B, G) position of the first token of each group (padding groups: T - 1)."""
    return _group_position(groups, n_groups, "amin")


def last_positions(groups: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(B, T) groups -> (B, G) position of the last token of each group (padding groups: T - 1)."""
    return _group_position(groups, n_groups, "amax")


def _group_position(groups: torch.Tensor, n_groups: int, reduce: str) -> torch.Tensor:
    B, T = groups.shape
    pos = torch.arange(T, device=groups.device).expand(B, T)
    return torch.full((B, n_groups), T - 1, dtype=torch.long, device=groups.device).scatter_reduce(
        1, groups, pos, reduce=reduce, include_self=False)


def causal_merge(n: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal ATM: every merged pair sits at its last token. (B, T, d) input and (B, T) groups ->
    z (B, T, d), z_t the mean of n over t's group up to t (the pair's mean at its second token, n_t
    elsewhere), and keys (B, T, T) bool, query t may read key s: s <= t and s is not the first
    token of a pair, or s = t. A pair's first token attends as if unmerged (its own key is visible
    to it alone), so no position reads a later token, not even whether it merges with one."""
    B, T = groups.shape
    closes = torch.zeros(B, T, dtype=torch.bool, device=groups.device)
    closes[:, 1:] = groups[:, 1:] == groups[:, :-1]  # t is the second token of a pair
    opens = torch.zeros_like(closes)
    opens[:, :-1] = closes[:, 1:]  # t is the first token of a pair
    prev = torch.cat((n[:, :1], n[:, :-1]), dim=1)
    z = torch.where(closes[..., None], (prev + n) / 2, n)  # (B, T, d)
    causal = torch.ones(T, T, dtype=torch.bool, device=groups.device).tril()
    keys = causal & (~opens[:, None, :] | torch.eye(T, dtype=torch.bool, device=groups.device))  # (B, T, T)
    return z, keys


class TokenMerger(RoleLayer):
    """ATM decision for one block (Sec. VIII): adjacent cosines of the attention input (the
    normalised block input, as in the authors' code) and the greedy merge map.

    Sites: `hidden` [batch, pos, d] the hidden states the cosines are computed from,
    `adjacent_cos` [batch, pos-1] cos(h_t, h_{t+1}), `merge_map` [batch, pos] int64 group index of
    every position (equal indices = merged). Recompute merges for any tau from `hidden`.
    Roles: ADJACENT_COS and MERGE_MAP (a layer of its own, `blocks.{i}.atm`, but no routing layer:
    merging chooses no option).
    """

    role_sites = {ADJACENT_COS: "adjacent_cos", MERGE_MAP: "merge_map"}

    def __init__(self) -> None:
        super().__init__()
        self.hidden = Site("[batch, pos, d] normalised block input (the attention input) the ATM cosines are "
                           "computed from")
        self.adjacent_cos = Site("[batch, pos-1] cosine similarity of hidden states t and t+1")
        self.merge_map = Site("[batch, pos] int64 group index of every position (same index = merged)")

    def forward(self, x: torch.Tensor, tau: float) -> torch.Tensor:
        x = self.hidden(x)  # (B, T, d)
        cos = F.cosine_similarity(x[:, :-1].float(), x[:, 1:].float(), dim=-1, eps=1e-8)  # (B, T-1)
        cos = self.adjacent_cos(cos)
        return self.merge_map(greedy_merge_map(cos, tau))  # (B, T)


# --- dual-stream feed-forward ------------------------------------------------------------------

class DualStreamFFN(RoutingLayer):
    """DSFF: stream A, a narrow SwiGLU (d -> d_A -> d); stream B, a wide GELU MLP (d -> d_B -> d);
    fused per dimension: alpha = sigmoid(W_f [a; b]) (W_f: 2d -> d, no bias),
    out = alpha * a + (1 - alpha) * b.

    Routing layer `blocks.{i}.dsff`, options 0 = stream A, 1 = stream B. Dropping a stream skips
    computing it (its module is never called, its site records nothing) and gives the other stream
    weight 1: alpha is all ones (B dropped) or all zeros (A dropped), and the fusion gate is not
    computed. Forcing a stream = dropping the other.

    Sites: `gate` [batch, pos, d] alpha (the weight of stream A), `stream_a` / `stream_b`
    [batch, pos, d] each stream's output.
    """

    n_options = 2
    can_force = True  # the fusion gate decides; forcing a stream is a counterfactual
    role_sites = {GATE: "gate"}
    option_role_sites = {PATHS: ("stream_a", "stream_b")}

    def __init__(self, dim: int, hidden_a: int, hidden_b: int) -> None:
        super().__init__()
        self.ffn_a = SwiGLU(dim, hidden_a)
        self.ffn_b = MLP(dim, hidden_b)  # exact-erf GELU
        self.fuse = nn.Linear(2 * dim, dim, bias=False)
        self.stream_a = Site("[batch, pos, d] output of stream A (narrow SwiGLU)")
        self.stream_b = Site("[batch, pos, d] output of stream B (wide GELU MLP)")
        self.gate = Site("[batch, pos, d] fusion gate alpha, the per-dimension weight of stream A")

    def option_labels(self) -> list[str]:
        return ["stream A (SwiGLU)", "stream B (GELU)"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dropped = self.skipped()
        a = None if 0 in dropped else self.stream_a(self.ffn_a(x))  # (B, T, d)
        b = None if 1 in dropped else self.stream_b(self.ffn_b(x))  # (B, T, d)
        if b is None:
            self.gate(torch.ones_like(a))
            return a
        if a is None:
            self.gate(torch.zeros_like(b))
            return b
        alpha = self.gate(torch.sigmoid(self.fuse(torch.cat((a, b), dim=-1))))  # (B, T, d)
        return alpha * a + (1 - alpha) * b
