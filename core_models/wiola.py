"""Wiola (Chowdhury, Shaik, Bhargavi & Kumar 2026, arXiv:2607.01394): a small LM built from SRPE,
GCLA, ATM, DSFF and WiolaRMSNorm (parts in `wiola_parts.py`).

embed -> n blocks -> WiolaRMSNorm -> head (tied to the embedding)
block i:  h   = x + GCLA_i(norm_1(x), summaries of the outputs of blocks i-Lambda .. i-1)
          out = h + DSFF_i(norm_2(h))

GCLA (gated cross-layer attention, Sec. VII, eqs. 20-29), per head h before the output projection:
  O_self = causal GQA self-attention, SRPE on Q and K, KV cache (eqs. 22-23)
  O_ctx  = softmax_l(q_t . K_ctx[t, l] / sqrt(hd)) V_ctx[t, l], with q_t the same SRPE-rotated
           query, K_ctx = S W_Kctx and V_ctx = S W_Vctx (d -> n_kv_heads * hd each) over the
           Lambda = 2 summaries S[t] of the previous blocks' outputs (eqs. 21, 24-26)
  O      = (1 - beta) O_self + beta O_ctx,  beta = sigmoid(phi), phi a learned scalar (init -3; eq. 27)
  A      = (sigmoid(W_G x) * concat_h O) W_O,  x the normalised block input (eqs. 28-29)
summary_j[t] = mean(out_j[0..t]), a causal running mean (block 1 sees one summary; block 0 none and
has no cross-attention parameters). With a KV cache the running sums live in
`cache.extra["blocks.{j}.summary.running_sum"]` ((B, d), float32), so decoding equals recomputation.
Two choices where the text and the authors' code (PyPI `wiola` 0.1.1) differ; we follow the code
and each is a row of the README's deviations table:
- eq. 20 pools the summary over all T positions, which would let every position read later tokens
  through the context; the running mean keeps the decoder causal (and a cache exact).
- eq. 22 pairs query head h with K/V head h mod H_kv; like the code's `repeat_kv` we pair it with
  h // (H / H_kv) (consecutive query heads share a K/V head). The two are the same model up to a
  permutation of the query heads (tests/models/test_wiola.py shows it).

ATM (adaptive token merging, Sec. VIII), blocks n//3 .. 2n//3 - 1, merges tokens for attention
only: the normalised block input n = norm_1(x) is scanned left to right and adjacent tokens with
cos(n_t, n_{t+1}) > tau merge greedily into non-overlapping pairs (mean of the pair); GCLA runs on
the shorter sequence, each group at the position of its first token (SRPE angle and causal order)
and reading the layer summaries at its last token (as in the authors' code); the group's attention
output is copied back to every position of the group (eq. 32) and added to each token's own
residual, h_t = x_t + A_t (eq. 3); DSFF then runs per token. Rows of a batch merge differently:
merged rows are right-padded to the longest, and the padding groups (placed after every real
group) cannot affect real ones under the causal mask. On in training, off at inference unless
`atm_inference`; per call `forward(atm=..., atm_tau=...)` (None = these defaults). This ATM leaks
token t+1 into position t wherever they merge (the copy-back of eq. 32), so with it the model is
not causal. Causal ATM (config `atm_causal`, per call `atm_causal=True`; not in the paper, a row of
the README's deviations table): a merged pair sits at its last token, where its mean is the query
and the key; its first token attends as if unmerged over the earlier keys and its own, which no
other position reads (`wiola_parts.causal_merge`). The sequence keeps its length (the attention
sites record every position), each position reads the summaries at its own token, and the attention
scores shrink with the keys only: a saving of about mu, not eq. 33's mu (2 - mu). ATM and a KV cache exclude each
other: `atm=True` with a cache raises ValueError (with atm=None the cache turns ATM off). Inside an
ATM block the attention sites record merged groups ([batch, groups, ...], rows padded to the most
groups; `blocks.{i}.atm.merge_map` maps back); every other site is full length.

Ablations: routing layers `blocks.{i}.dsff`, options 0 = stream A, 1 = stream B (semantics in
`DualStreamFFN`).

Sites (per block i; in an ATM block the attn.* sites record merged groups, see above):
  attn.self_out [batch, pos, heads, head_dim]   O_self per head (before the blend)
  attn.cross_out [batch, pos, heads, head_dim]  O_ctx per head (blocks with cross-attention)
  attn.cross.weights [batch, pos, heads, n_prev] softmax over the previous layers' summaries
  attn.gcla_beta []                             beta = sigmoid(phi)
  attn.out_gate [batch, pos, d]                 sigmoid(W_G x)
  attn_out [batch, pos, d]                      A, added to the residual; equals
      ((1 - beta) out_gate * self_out) W_O + (beta out_gate * cross_out) W_O, so each term's
      contribution can be read off
  dsff.gate / dsff.stream_a / dsff.stream_b [batch, pos, d]
  atm.hidden [batch, pos, d], atm.adjacent_cos [batch, pos-1], atm.merge_map [batch, pos]
      (ATM blocks, when merging is on)
  out [batch, pos, d]                           block output
  summary [batch, pos, d]                       running mean of out over 0..pos (the layer summary
      later blocks read; blocks 0 .. n-2 when gcla_lambda > 0)

Where we differ from the authors' code (the paper's text does not settle these either): block 0 has no
context K/V or phi (their code builds them in every layer, unused in layer 0: 524,289 parameters at
wiola-360m); a merged group sits at its first token's position (their code renumbers the merged
sequence 0 .. T'-1); SRPE tables are computed in float64 (theirs in float32).

Presets (Table III; Table I and Table IV's caption give wiola-360m's d = 1024, L = 16, V = 32000):
d / L / H / H_kv = 768 / 12 / 12 / 4 (wiola-120m), 1024 / 16 / 16 / 4 (wiola-360m),
1536 / 24 / 16 / 8 (wiola-700m), 2048 / 28 / 16 / 8 (wiola-1.5b); d_A = d, d_B = 4d (Table I),
vocabulary 32000, context 2048. The built models count far from the size names (and wiola-360m
from Table IV's stated 361M): `wiola_component_counts` gives what they have. Table IV's rows are
equal to ours (paper_configs.py) except "ctx K/V projections (per layer) 262,144", which is one of
the two d x H_kv d_h matrices eqs. 24-25 define (524,288 for both).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from .base import RouteScopeLM, RunOption
from .config import BaseConfig
from .layers import Attention, BlockSpec, attend, init_weights
from .run_state import KVCache, current
from .sites import BLEND, RoleLayer, Site
from .wiola_parts import (SRPE, DualStreamFFN, TokenMerger, WiolaRMSNorm, causal_merge, first_positions,
                          last_positions, merge_groups, restore_groups, take_positions)


# per-call options (forward(atm=..., atm_tau=..., atm_causal=...), model.run_options())
ATM = "atm"
ATM_TAU = "atm_tau"
ATM_CAUSAL = "atm_causal"


@dataclass(frozen=True)
class WiolaConfig(BaseConfig):
    family = "wiola"
    vocab_size: int = 4096
    d_model: int = 128
    n_layers: int = 6
    n_heads: int = 4
    n_kv_heads: int = 2
    d_a: int = 0  # DSFF stream A (SwiGLU) hidden width; 0: d_model
    d_b: int = 0  # DSFF stream B (GELU MLP) hidden width; 0: 4 * d_model
    context: int = 256
    srpe_k: int = 8  # spiral divisor k_s: second winding angle p * omega_j / k_s (eq. 12)
    srpe_a: float = 0.1  # radial amplitude a_s, dimensionless: r_j = 1 + a_s sin(p f_s omega_j) (eq. 14)
    srpe_f: float = 0.01  # radial frequency f_s: the sine's argument per position, in units of omega_j (eq. 14)
    gcla_lambda: int = 2  # previous layers each block cross-attends to (0: no cross-attention)
    gcla_phi_init: float = -3.0  # beta = sigmoid(phi) starts at sigmoid(-3) ~ 0.047
    atm_tau: float = 0.92  # merge adjacent tokens when cos > tau
    atm_inference: bool = False  # merge at inference by default (training always merges)
    # False: the paper's ATM (a merged pair's attention output copied back to both tokens, eq. 32, so
    # the first token reads the second); True: causal ATM, a pair sits at its last token (causal_merge)
    atm_causal: bool = False
    norm_eps: float = 1e-6
    tie_embeddings: bool = True

    def validate(self) -> None:
        self.positive("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "context", "srpe_k")
        self.require(self.d_model % self.n_heads == 0, "n_heads", f"must divide d_model ({self.d_model})")
        self.require(self.n_heads % self.n_kv_heads == 0, "n_kv_heads", f"must divide n_heads ({self.n_heads})")
        self.require((self.d_model // self.n_heads) % 2 == 0, "n_heads", "head dim must be even for SRPE")
        self.require(self.d_a >= 0, "d_a", "must be >= 0 (0: d_model)")
        self.require(self.d_b >= 0, "d_b", "must be >= 0 (0: 4 * d_model)")
        self.require(math.isfinite(self.srpe_a) and self.srpe_a >= 0, "srpe_a", "must be finite and >= 0")
        self.require(math.isfinite(self.srpe_f) and self.srpe_f >= 0, "srpe_f", "must be finite and >= 0")
        self.require(self.gcla_lambda >= 0, "gcla_lambda", "must be >= 0")
        self.require(math.isfinite(self.gcla_phi_init), "gcla_phi_init", "must be finite")
        self.require(math.isfinite(self.atm_tau) and -1.0 <= self.atm_tau <= 1.0, "atm_tau",
                     "must be a cosine threshold in [-1, 1]")
        self.require(self.norm_eps > 0, "norm_eps", "must be > 0")

    @property
    def hidden_a(self) -> int:
        return self.d_a or self.d_model

    @property
    def hidden_b(self) -> int:
        return self.d_b or 4 * self.d_model

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def atm_layers(self) -> range:
        return range(self.n_layers // 3, 2 * self.n_layers // 3)

    def spec(self) -> BlockSpec:
        return BlockSpec(dim=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, rope="none",
                         norm_eps=self.norm_eps, context=self.context)


class WiolaAttention(Attention):
    """GCLA's self-attention (eqs. 22-23): causal GQA with SRPE on Q and K at explicit positions
    (ATM moves them), KV cache. No output projection here: GCLA blends and gates the per-head
    outputs before W_O. Returns the per-head outputs and the SRPE-rotated queries, which the
    cross-layer attention reuses."""

    def __init__(self, c: WiolaConfig) -> None:
        super().__init__(replace(c.spec(), attn_out_proj=False))
        self.srpe = SRPE(c.head_dim, c.context, c.srpe_k, c.srpe_a, c.srpe_f)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, pad_mask: torch.Tensor | None,
                keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # x: (B, T, d); positions: (B or 1, T) absolute positions; keys: (B, T, T) bool, which keys
        # each query may read (causal ATM; no cache), instead of the causal mask
        B, T, _ = x.shape
        cache = current().cache
        start = cache.pos if cache is not None else 0
        q, k, v = self.qkv(x).split([self.n_heads * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], dim=-1)
        q = self.srpe(q.view(B, T, self.n_heads, self.hd).transpose(1, 2), positions)  # (B, H, T, hd)
        k = self.srpe(k.view(B, T, self.n_kv, self.hd).transpose(1, 2), positions)  # (B, Hkv, T, hd)
        v = v.view(B, T, self.n_kv, self.hd).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(self.layer_id, k, v, self.context)
        if keys is None:
            o = attend(q, k, v, start, pad_mask)
        else:
            allowed = keys if pad_mask is None else keys & ~pad_mask[:, None, :]  # padding masked as keys only
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None],
                                               enable_gqa=self.n_kv != self.n_heads)
        return o.transpose(1, 2), q.transpose(1, 2)  # (B, T, H, hd) each


class CrossLayerAttention(nn.Module):
    """GCLA's cross-layer context sub-attention (eqs. 24-26): at position t the SRPE-rotated query
    of the self-attention attends over the Lambda summary vectors at t, K_ctx = S W_Kctx and
    V_ctx = S W_Vctx (d -> n_kv_heads * head_dim each, GQA head layout, no position on the keys)."""

    def __init__(self, c: WiolaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = c.n_heads, c.n_kv_heads, c.head_dim
        self.k = nn.Linear(c.d_model, self.n_kv * self.hd, bias=False)  # W_Kctx
        self.v = nn.Linear(c.d_model, self.n_kv * self.hd, bias=False)  # W_Vctx
        self.weights = Site("[batch, pos, heads, n_prev] attention weights over the previous layers' summaries")

    def forward(self, q: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
        # q: (B, T, H, hd) rotated queries; summaries: (B, T, L, d), oldest layer first
        B, T, L, _ = summaries.shape
        rep = self.n_heads // self.n_kv  # query head h reads kv head h // rep, as in the self-attention
        k = self.k(summaries).view(B, T, L, self.n_kv, self.hd).repeat_interleave(rep, dim=3)  # (B, T, L, H, hd)
        v = self.v(summaries).view(B, T, L, self.n_kv, self.hd).repeat_interleave(rep, dim=3)
        scores = torch.einsum("bthe,btlhe->bthl", q.float(), k.float()) / math.sqrt(self.hd)  # (B, T, H, L)
        w = self.weights(scores.softmax(dim=-1))
        return torch.einsum("bthl,btlhe->bthe", w, v.float()).type_as(q)  # (B, T, H, hd)


class GatedCrossLayerAttention(RoleLayer):
    """GCLA (Sec. VII, eqs. 22-29), per head before the output projection:
    O = (1 - beta) O_self + beta O_ctx, beta = sigmoid(phi); A = (sigmoid(W_G x) * O) W_O.
    Role BLEND: beta (eq. 27), in blocks with cross-layer attention (block 0 has none)."""

    def __init__(self, c: WiolaConfig, has_cross: bool) -> None:
        super().__init__()
        d, inner = c.d_model, c.n_heads * c.head_dim
        self.self_attn = WiolaAttention(c)
        self.cross = CrossLayerAttention(c) if has_cross else None
        self.phi = nn.Parameter(torch.tensor(float(c.gcla_phi_init))) if has_cross else None
        self.gate = nn.Linear(d, inner, bias=False)  # W_G
        self.proj = nn.Linear(inner, d, bias=False)  # W_O
        # block 0 has no earlier layer to attend to, hence no beta site
        self.gcla_beta = Site("[] beta = sigmoid(phi), weight of the cross-layer attention",
                              pos_axis=None) if has_cross else None
        self.out_gate = Site("[batch, pos, d] output gate sigmoid(W_G x), applied before W_O")
        self.self_out = Site("[batch, pos, heads, head_dim] self-attention output O_self per head")
        self.cross_out = Site("[batch, pos, heads, head_dim] cross-layer attention output O_ctx per head"
                              ) if has_cross else None

    @property
    def roles(self) -> dict[str, str]:
        return {} if self.gcla_beta is None else {BLEND: self.gcla_beta.name}

    def forward(self, x: torch.Tensor, positions: torch.Tensor, summaries: torch.Tensor | None,
                pad_mask: torch.Tensor | None, keys: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        o, q = self.self_attn(x, positions, pad_mask, keys)  # (B, T, H, hd) each
        o = self.self_out(o)
        if self.cross is not None and summaries is not None:
            beta = self.gcla_beta(torch.sigmoid(self.phi))  # ()
            o = (1 - beta) * o + beta * self.cross_out(self.cross(q, summaries))
        g = self.out_gate(torch.sigmoid(self.gate(x)))  # (B, T, H * hd)
        return self.proj(g * o.reshape(B, T, -1))  # (B, T, d)


class WiolaBlock(nn.Module):
    def __init__(self, c: WiolaConfig, i: int) -> None:
        super().__init__()
        self.norm_1 = WiolaRMSNorm(c.d_model, c.norm_eps)
        self.attn = GatedCrossLayerAttention(c, has_cross=i > 0 and c.gcla_lambda > 0)
        self.norm_2 = WiolaRMSNorm(c.d_model, c.norm_eps)
        self.dsff = DualStreamFFN(c.d_model, c.hidden_a, c.hidden_b)
        self.atm = TokenMerger() if i in c.atm_layers else None
        self.attn_out = Site("[batch, pos, d] GCLA output added to each token's residual (full length: in an "
                             "ATM block each group's output restored to every position of the group)")
        self.out = Site("[batch, pos, d] block output")
        # later blocks cross-attend to this block's summaries (none after the last block)
        self.summary = Site("[batch, pos, d] layer summary: running mean of the block output over "
                            "positions 0..pos") if c.gcla_lambda > 0 and i < c.n_layers - 1 else None

    def forward(self, x: torch.Tensor, positions: torch.Tensor, summaries: torch.Tensor | None,
                pad_mask: torch.Tensor | None, atm_tau: float | None, atm_causal: bool = False) -> torch.Tensor:
        h = x + self.attn_out(self._attend(self.norm_1(x), positions, summaries, pad_mask, atm_tau,
                                           atm_causal))  # (B, T, d)
        return self.out(h + self.dsff(self.norm_2(h)))  # FFN per token, also in ATM blocks

    def _attend(self, n: torch.Tensor, positions: torch.Tensor, summaries: torch.Tensor | None,
                pad_mask: torch.Tensor | None, atm_tau: float | None, atm_causal: bool) -> torch.Tensor:
        """GCLA of the normalised block input n (B, T, d). In an ATM block it runs on the merged
        sequence (eq. 31: a pair's mean) and each group's output is restored to all its positions
        (eq. 32); the caller adds it to every token's own residual (eq. 3), so merging never
        overwrites a residual. Causal ATM instead keeps the full length: a pair's mean is the query
        and key at its last token, its first token attends as if unmerged (`causal_merge`)."""
        if self.atm is None or atm_tau is None:
            return self.attn(n, positions, summaries, pad_mask)
        groups = self.atm(n, atm_tau)  # (B, T) group of each position
        if atm_causal:
            z, keys = causal_merge(n, groups)
            return self.attn(z, positions, summaries, pad_mask, keys)  # summaries at each token's own t
        G = int(groups.max()) + 1  # longest merged row
        pad = None if pad_mask is None else merge_groups(pad_mask.to(n.dtype), groups, G) == 1  # all of it padding
        # a group reads the summaries at its last token, as in the authors' code
        ctx = None if summaries is None else take_positions(summaries, last_positions(groups, G))  # (B, G, L, d)
        y = self.attn(merge_groups(n, groups, G), first_positions(groups, G), ctx, pad)  # (B, G, d)
        return restore_groups(y, groups)  # (B, T, d)

    def summarise(self, out: torch.Tensor, cache: KVCache | None, start: int) -> torch.Tensor:
        """Causal running mean over positions, s[t] = mean(out[0..t]) (B, T, d), continued across
        cached calls: the running sum lives in cache.extra under this site's name."""
        s = out.float().cumsum(dim=1)  # (B, T, d)
        if cache is not None:
            key = f"{self.summary.name}.running_sum"
            if key in cache.extra:
                s = s + cache.extra[key][:, None]
            cache.extra[key] = s[:, -1]  # (B, d)
        n = torch.arange(start + 1, start + out.shape[1] + 1, device=out.device, dtype=torch.float32)
        return self.summary((s / n[:, None]).type_as(out))


class Wiola(RouteScopeLM):
    def __init__(self, config: WiolaConfig) -> None:
        super().__init__()
        c = self.config = config
        self.context, self.vocab_size = c.context, c.vocab_size
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = nn.ModuleList(WiolaBlock(c, i) for i in range(c.n_layers))
        self.norm = WiolaRMSNorm(c.d_model, c.norm_eps)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        init_weights(self)
        residual_out = ("attn.proj.weight", "ffn_a.down.weight", "ffn_b.proj.weight")
        for name, p in self.named_parameters():
            if name.endswith(residual_out):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.n_layers))
        if c.tie_embeddings:
            self.head.weight = self.embed.weight
        self._finalize()

    run_option_list = (
        RunOption(ATM, "merge similar adjacent tokens for attention (adaptive token merging); default: while training, "
                       "or at inference when the config's atm_inference is set", bool, whole_sequence=True),
        RunOption(ATM_TAU, "cosine threshold above which adjacent tokens merge; default: the config's atm_tau", float,
                  -1.0, 1.0, 0.01, label="ATM threshold tau", heading="Token merging (ATM)"),  # a cosine: -1 merges all
        RunOption(ATM_CAUSAL, "causal token merging: a merged pair sits at its last token, so no position reads a "
                              "later token (the paper's ATM copies the pair's output back to its first token, which "
                              "then reads the next one); default: the config's atm_causal", bool),
    )

    def atm_is_causal(self) -> bool:
        """Whether the call in progress merges causally (read only when ATM is on)."""
        causal = current().options.get(ATM_CAUSAL)
        return self.config.atm_causal if causal is None else bool(causal)

    def atm_threshold(self) -> float | None:
        """Merge threshold of the call in progress, or None when ATM is off for it."""
        st, c = current(), self.config
        atm, atm_tau = st.options.get(ATM), st.options.get(ATM_TAU)
        if atm and st.cache is not None:
            raise ValueError("ATM (adaptive token merging) cannot run with a KV cache: merging changes "
                             "earlier positions; call with atm=False (or None) when decoding with a cache")
        on = atm if atm is not None else (st.training or c.atm_inference)
        if not on or st.cache is not None:
            return None
        tau = c.atm_tau if atm_tau is None else float(atm_tau)
        if not math.isfinite(tau):
            raise ValueError(f"atm_tau = {atm_tau!r}: must be a finite cosine threshold")
        return tau

    def _forward(self, idx: torch.Tensor) -> torch.Tensor:
        st, c = current(), self.config
        tau = self.atm_threshold()
        causal = tau is not None and self.atm_is_causal()
        B, T = idx.shape
        start = st.cache.pos if st.cache is not None else 0
        positions = torch.arange(start, start + T, device=idx.device)[None]  # (1, T)
        x = self.embed(idx)  # (B, T, d)
        prev: list[torch.Tensor] = []  # summaries of the last Lambda block outputs, (B, T, d) each
        for block in self.blocks:
            summaries = torch.stack(prev, dim=2) if prev and block.attn.cross is not None else None  # (B, T, L, d)
            x = block(x, positions, summaries, st.pad_mask, tau, causal)
            if block.summary is not None:
                prev = (prev + [block.summarise(x, st.cache, start)])[-c.gcla_lambda:]
        return self.head(self.norm(x)).float()  # (B, T, V)


def wiola_component_counts(c: WiolaConfig) -> dict[str, int]:
    """Parameter counts per component: `layer.<part>` for one block that has cross-attention
    (block 0 has no gcla_ctx_k / gcla_ctx_v / gcla_phi, nor does any block if gcla_lambda = 0),
    `total.<part>` summed over blocks, the embedding, head (0 if tied), final norm, and `total`
    (tied weights once; equals sum(p.numel()) of the built model)."""
    d, V, inner, kv = c.d_model, c.vocab_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    layer = {
        "attn_q": d * inner, "attn_k": d * kv, "attn_v": d * kv, "attn_o": inner * d,
        "gcla_ctx_k": d * kv, "gcla_ctx_v": d * kv, "gcla_phi": 1, "gcla_gate": d * inner,
        "dsff_stream_a": 3 * d * c.hidden_a, "dsff_stream_b": 2 * d * c.hidden_b, "dsff_fusion_gate": 2 * d * d,
        "norms": 4 * d,
    }
    n_cross = c.n_layers - 1 if c.gcla_lambda > 0 else 0
    out = {f"layer.{k}": v for k, v in layer.items()}
    for k, v in layer.items():
        out[f"total.{k}"] = v * (n_cross if k in CROSS_ONLY else c.n_layers)
    out.update(embedding=V * d, head=0 if c.tie_embeddings else V * d, final_norm=2 * d)
    out["total"] = sum(out[f"total.{k}"] for k in layer) + out["embedding"] + out["head"] + out["final_norm"]
    return out


CROSS_ONLY = ("gcla_ctx_k", "gcla_ctx_v", "gcla_phi")  # components only blocks with cross-attention have


def wiola_param_count(c: WiolaConfig) -> int:
    """Closed form of sum(p.numel()) for a Wiola built from `c`."""
    return wiola_component_counts(c)["total"]


# Table III (the model family); Table IV's caption gives wiola-360m
# d = 1024, L = 16, V = 32000. d_A = d and d_B = 4d in every size, context 2048.
_PAPER = dict(vocab_size=32000, context=2048)
PAPER_PRESETS = {  # the family's presets (core_models.registry) include these
    "wiola-120m": dict(_PAPER, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4),
    "wiola-360m": dict(_PAPER, d_model=1024, n_layers=16, n_heads=16, n_kv_heads=4),
    "wiola-700m": dict(_PAPER, d_model=1536, n_layers=24, n_heads=16, n_kv_heads=8),
    "wiola-1.5b": dict(_PAPER, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8),
}

__all__ = ["Wiola", "WiolaConfig", "wiola_component_counts", "wiola_param_count"]
