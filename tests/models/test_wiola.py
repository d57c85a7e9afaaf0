"""Wiola family: shapes, parameter counts, presets, causality, cached decoding, ATM, DSFF, GCLA."""
from __future__ import annotations

import math
from fnmatch import fnmatchcase

import pytest
import torch
import torch.nn.functional as F

from routescope.core_models import Ablation, ConfigError, tracing
from routescope.core_models.registry import PRESETS, build_model, from_name
from routescope.core_models.wiola import Wiola, WiolaConfig, wiola_component_counts, wiola_param_count
from routescope.core_models.wiola_parts import SRPE, WiolaRMSNorm, greedy_merge_map
from tolerances import FORWARD_EPS, assert_close_to_scale

TINY = dict(vocab_size=97, d_model=32, n_layers=6, n_heads=4, n_kv_heads=2, context=48)
PAPER_PRESETS = ("wiola-120m", "wiola-360m", "wiola-700m", "wiola-1.5b")


@pytest.fixture(scope="module")
def model() -> Wiola:
    torch.manual_seed(0)
    return Wiola(WiolaConfig(**TINY)).eval()


def ids(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def test_output_and_site_shapes(model):
    B, T = 2, 20
    with torch.no_grad(), tracing() as tr:
        out = model(ids(B, T))
    assert out.logits.shape == (B, T, TINY["vocab_size"])
    d, H, hd, n = TINY["d_model"], TINY["n_heads"], TINY["d_model"] // TINY["n_heads"], TINY["n_layers"]
    for i in range(n):
        for s in ("dsff.gate", "dsff.stream_a", "dsff.stream_b", "out", "attn_out", "attn.out_gate"):
            assert tr[f"blocks.{i}.{s}"].shape == (B, T, d), s
        assert tr[f"blocks.{i}.attn.self_out"].shape == (B, T, H, hd)
        assert (f"blocks.{i}.summary" in tr) == (i < n - 1)  # the last block's summary is never read
        if i < n - 1:
            assert tr[f"blocks.{i}.summary"].shape == (B, T, d)
        assert (f"blocks.{i}.attn.cross_out" in tr) == (i > 0)  # block 0 has no earlier layer
        if i > 0:
            assert tr[f"blocks.{i}.attn.cross_out"].shape == (B, T, H, hd)
            assert tr[f"blocks.{i}.attn.gcla_beta"].shape == ()
            assert tr[f"blocks.{i}.attn.cross.weights"].shape == (B, T, H, min(i, 2))
    assert not any(".atm." in n for n in tr.names())  # ATM off at inference by default
    with torch.no_grad(), tracing() as tr:
        model(ids(B, T, seed=9), atm=True, atm_tau=0.0)
    G = int(tr["blocks.2.atm.merge_map"].max()) + 1  # attention sites of an ATM block: merged groups
    assert G < T and tr["blocks.2.attn.self_out"].shape == (B, G, H, hd)
    assert tr["blocks.2.attn.cross_out"].shape == (B, G, H, hd)
    assert tr["blocks.2.attn_out"].shape == tr["blocks.2.summary"].shape == (B, T, d)


def test_summaries_and_attention_contributions_by_independent_recomputation(model):
    B, T = 2, 12
    with torch.no_grad(), tracing() as tr:
        model(ids(B, T, seed=10))
    for i in range(TINY["n_layers"] - 1):
        for b in range(B):
            close_to_scale(tr[f"blocks.{i}.summary"][b], loop_running_mean(tr[f"blocks.{i}.out"][b]), "summary")
    for i in range(1, TINY["n_layers"]):
        attn = model.blocks[i].attn
        beta, gate = float(tr[f"blocks.{i}.attn.gcla_beta"]), tr[f"blocks.{i}.attn.out_gate"]
        flat = lambda o: o.reshape(B, T, -1)  # noqa: E731
        w_o = attn.proj.weight.detach()
        self_part = ((1 - beta) * gate * flat(tr[f"blocks.{i}.attn.self_out"])) @ w_o.T
        cross_part = (beta * gate * flat(tr[f"blocks.{i}.attn.cross_out"])) @ w_o.T
        close_to_scale(tr[f"blocks.{i}.attn_out"], self_part + cross_part, "attention terms")
        x, out = tr[f"blocks.{i - 1}.out"], tr[f"blocks.{i}.out"]
        with torch.no_grad():
            h = x + tr[f"blocks.{i}.attn_out"]
            close_to_scale(out, h + model.blocks[i].dsff(model.blocks[i].norm_2(h)), "block output")


def test_param_count_formula():
    variants = [dict(), dict(tie_embeddings=False), dict(d_a=48, d_b=80), dict(gcla_lambda=0), dict(n_kv_heads=4)]
    for v in variants:
        c = WiolaConfig(**{**TINY, **v})
        assert Wiola(c).num_params() == wiola_param_count(c), v


def _component_numels(m: Wiola) -> dict[str, int]:
    """The same components, counted from the modules of a built model."""
    n = lambda mod: sum(p.numel() for p in mod.parameters()) if mod is not None else 0  # noqa: E731
    tot: dict[str, int] = {}
    add = lambda k, v: tot.__setitem__(k, tot.get(k, 0) + v)  # noqa: E731
    for b in m.blocks:
        sa, hd = b.attn.self_attn, b.attn.self_attn.hd
        assert sa.proj is None  # W_O belongs to GCLA (applied after the blend and the gate)
        add("attn_q", sa.n_heads * hd * sa.qkv.in_features)
        add("attn_k", sa.n_kv * hd * sa.qkv.in_features)
        add("attn_v", sa.n_kv * hd * sa.qkv.in_features)
        add("attn_o", n(b.attn.proj))
        cross = b.attn.cross
        add("gcla_ctx_k", n(cross.k) if cross is not None else 0)
        add("gcla_ctx_v", n(cross.v) if cross is not None else 0)
        assert cross is None or n(cross) == n(cross.k) + n(cross.v)  # no query or output of its own
        add("gcla_phi", b.attn.phi.numel() if b.attn.phi is not None else 0)
        add("gcla_gate", n(b.attn.gate))
        add("dsff_stream_a", n(b.dsff.ffn_a))
        add("dsff_stream_b", n(b.dsff.ffn_b))
        add("dsff_fusion_gate", n(b.dsff.fuse))
        add("norms", n(b.norm_1) + n(b.norm_2))
    return tot


@pytest.mark.parametrize("cfg", [WiolaConfig(**TINY), WiolaConfig(**{**TINY, "gcla_lambda": 0})])
def test_component_counts_match_modules(cfg):
    m = Wiola(cfg)
    counts, numels = wiola_component_counts(cfg), _component_numels(m)
    for k, v in numels.items():
        assert counts[f"total.{k}"] == v, k
    assert counts["total"] == m.num_params()


def _numel(model, *patterns: str) -> int:
    """Parameters whose name matches a pattern, counted from the built model (tied weights once)."""
    return sum(p.numel() for n, p in model.named_parameters() if any(fnmatchcase(n, pat) for pat in patterns))


# wiola-360m (Table IV caption: d = 1024, L = 16, V = 32000; Table I: H = 16, H_kv = 4, d_h = 64,
# d_A = d, d_B = 4d): one row per component, (name, parameter-name patterns in block 1, the
# component's size from the equations' dimensions, the number Table IV states, None where Table IV
# has no such row). Table IV's "GCLA: gate + output proj" row is the sum of our W_G and W_O rows.
D, V, H, HKV, HD, DA, DB = 1024, 32000, 16, 4, 64, 1024, 4096
TABLE_IV_360M = [
    ("token embedding (tied head)", ("embed.*",), V * D, 32_768_000),
    ("self-attention W_Q, W_K, W_V", ("blocks.1.attn.self_attn.qkv.*",), D * (H + 2 * HKV) * HD, 1_572_864),
    ("attention output W_O", ("blocks.1.attn.proj.*",), H * HD * D, None),
    ("GCLA context K/V", ("blocks.1.attn.cross.*",), 2 * D * HKV * HD, None),  # Table IV: 262,144, one of the two
    ("GCLA output gate W_G", ("blocks.1.attn.gate.*",), D * H * HD, None),
    ("DSFF stream A (SwiGLU)", ("blocks.1.dsff.ffn_a.*",), 3 * D * DA, 3_145_728),
    ("DSFF stream B (GELU)", ("blocks.1.dsff.ffn_b.*",), 2 * D * DB, 8_388_608),
    ("DSFF fusion gate W_f", ("blocks.1.dsff.fuse.*",), 2 * D * D, 2_097_152),
    ("WiolaRMSNorm x2 (w, delta)", ("blocks.1.norm_1.*", "blocks.1.norm_2.*"), 2 * 2 * D, 4_096),
]
TABLE_IV_GATE_PLUS_OUTPUT, TABLE_IV_CTX_KV = 2_097_152, 262_144


def test_360m_table_iv_rows_on_the_meta_device():
    cfg = from_name("wiola-360m")
    assert (cfg.d_model, cfg.n_layers, cfg.vocab_size, cfg.n_heads, cfg.n_kv_heads) == (D, 16, V, H, HKV)
    with torch.device("meta"):
        m = Wiola(cfg)
    assert all(p.is_meta for p in m.parameters())
    per_layer = 0
    for name, patterns, size, stated in TABLE_IV_360M:
        got = _numel(m, *patterns)
        assert got == size, name
        if stated is not None:
            assert math.isclose(got, stated, rel_tol=0.5 / stated), (name, got, stated)  # stated exactly
        per_layer += 0 if patterns == ("embed.*",) else got
    assert _numel(m, "blocks.1.attn.gate.*", "blocks.1.attn.proj.*") == TABLE_IV_GATE_PLUS_OUTPUT
    assert _numel(m, "blocks.1.attn.cross.k.*") == _numel(m, "blocks.1.attn.cross.v.*") == TABLE_IV_CTX_KV
    phi = _numel(m, "blocks.1.attn.phi")
    assert phi == 1
    for i in range(2, 16):  # every layer with cross-attention has the same components
        assert _numel(m, f"blocks.{i}.*") == per_layer + phi
    assert _numel(m, "blocks.0.*") == per_layer - 2 * D * HKV * HD  # block 0: no context K/V, no phi
    total = V * D + 16 * (per_layer + phi) - (2 * D * HKV * HD + 1) + 2 * D  # + final norm
    assert m.num_params() == total == wiola_param_count(cfg)
    counts = wiola_component_counts(cfg)
    assert counts["layer.dsff_stream_b"] == 8_388_608 and counts["layer.dsff_fusion_gate"] == 2_097_152
    for k, v in _component_numels(m).items():
        assert counts[f"total.{k}"] == v, k


# Table III: (d, L, H, H_kv); Table I: d_A = d, d_B = 4d, V 32000, context 2048
TABLE_III = {"wiola-120m": (768, 12, 12, 4), "wiola-360m": (1024, 16, 16, 4),
             "wiola-700m": (1536, 24, 16, 8), "wiola-1.5b": (2048, 28, 16, 8)}


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_presets_follow_table_iii(name):
    c = from_name(name)
    assert (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads) == TABLE_III[name]
    assert (c.hidden_a, c.hidden_b, c.vocab_size, c.context) == (c.d_model, 4 * c.d_model, 32000, 2048)


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_paper_presets_instantiate_on_meta(name):
    assert name in PRESETS
    cfg = from_name(name)
    with torch.device("meta"):
        m = build_model(cfg)
    assert isinstance(m, Wiola)
    assert m.num_params() == wiola_param_count(cfg)


def test_causal_with_atm_off(model):
    x = ids(1, 24)
    y = x.clone()
    y[0, 12] = (y[0, 12] + 1) % TINY["vocab_size"]
    with torch.no_grad():
        a, b = model(x, atm=False).logits, model(y, atm=False).logits
    assert_close_to_scale(a[:, :12], b[:, :12], FORWARD_EPS, msg="the past changed with the future")
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-4


def test_cached_decoding_equals_full_recompute(model):
    x = ids(2, 8 + 16, seed=1)
    with torch.no_grad():
        full = model(x).logits
        cache = model.new_cache()
        steps = [model(x[:, :8], cache=cache).logits]
        for t in range(8, 24):
            steps.append(model(x[:, t:t + 1], cache=cache).logits)
    assert cache.pos == 24
    assert "blocks.0.summary.running_sum" in cache.extra
    assert_close_to_scale(torch.cat(steps, dim=1), full, FORWARD_EPS, msg="cached steps vs full recompute")


def test_generate_with_cache_matches_recompute(model):
    from routescope.core_models.generate import generate

    prompt = ids(1, 5, seed=2)[0].tolist()
    gen = generate(model, prompt, max_new_tokens=10, trace_sites=["blocks.1.dsff.gate"])
    x = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(10):  # greedy without a cache, full recompute each step
            x = torch.cat((x, model(x).logits[:, -1:].argmax(-1)), dim=1)
    assert gen.ids == x[0].tolist()
    assert gen.trace["blocks.1.dsff.gate"].shape[1] == 15


def loop_merge_map(hidden: torch.Tensor, tau: float) -> list[int]:
    """Greedy left-to-right merge of one row, by a plain loop."""
    h = hidden.double()
    T = h.shape[0]
    groups, g, t = [0] * T, 0, 0
    while t < T:
        groups[t] = g
        if t + 1 < T:
            cos = float(h[t] @ h[t + 1] / (h[t].norm() * h[t + 1].norm()))
            if cos > tau:
                groups[t + 1] = g
                t += 1
        t += 1
        g += 1
    return groups


def loop_running_mean(h: torch.Tensor) -> torch.Tensor:
    """(T, d) -> (T, d): row t is the mean of rows 0..t, by a plain loop in float64."""
    out, total = [], torch.zeros(h.shape[-1], dtype=torch.float64)
    for t in range(h.shape[0]):
        total = total + h[t].double()
        out.append(total / (t + 1))
    return torch.stack(out).float()


def manual_atm_block(block, x: torch.Tensor, prev_outs: list[torch.Tensor], groups: list[int]) -> torch.Tensor:
    """One ATM block for one row x (T, d), written out with plain loops: merge the normalised
    input by group (mean), GCLA on the merged sequence at each group's first position reading the
    summaries at its last token, the output copied back to every member, added to each token's
    own residual, then the FFN per token."""
    T = x.shape[0]
    n = block.norm_1(x)
    members = [[t for t in range(T) if groups[t] == g] for g in range(max(groups) + 1)]
    merged = torch.stack([sum(n[t] for t in m) / len(m) for m in members])[None]  # (1, G, d)
    first = torch.tensor([[m[0] for m in members]])
    summaries = torch.stack([loop_running_mean(o) for o in prev_outs], dim=1) if prev_outs else None  # (T, L, d)
    ctx = None if summaries is None else torch.stack([summaries[m[-1]] for m in members])[None]  # (1, G, L, d)
    y = block.attn(merged, first, ctx, None)[0]  # (G, d)
    h = torch.stack([x[t] + y[groups[t]] for t in range(T)])
    return h + block.dsff(block.norm_2(h))


def close_to_scale(got: torch.Tensor, want: torch.Tensor, msg: str) -> None:
    """The same maths in another order (merged by a loop, one row at a time): FORWARD_EPS."""
    assert_close_to_scale(got, want, FORWARD_EPS, msg=msg)


def test_atm_merges_for_attention_only_and_keeps_every_residual(model):
    B, T, tau = 2, 16, 0.0
    with torch.no_grad(), tracing() as tr:
        model(ids(B, T, seed=3), atm=True, atm_tau=tau)
    layers = list(model.config.atm_layers)
    assert layers == [2, 3]
    lam = model.config.gcla_lambda
    n_merged = n_single = 0
    for i in layers:
        block = model.blocks[i]
        hidden, mm = tr[f"blocks.{i}.atm.hidden"], tr[f"blocks.{i}.atm.merge_map"]
        assert hidden.shape == (B, T, TINY["d_model"]) and mm.shape == (B, T) and mm.dtype == torch.int64
        assert tr[f"blocks.{i}.atm.adjacent_cos"].shape == (B, T - 1)
        x, out, attn = tr[f"blocks.{i - 1}.out"], tr[f"blocks.{i}.out"], tr[f"blocks.{i}.attn_out"]
        for b in range(B):
            groups = loop_merge_map(hidden[b], tau)
            assert mm[b].tolist() == groups
            with torch.no_grad():
                close_to_scale(hidden[b], block.norm_1(x[b]), "ATM hidden")  # cosines are taken on the attention input
                prev = [tr[f"blocks.{j}.out"][b] for j in range(max(0, i - lam), i)]
                close_to_scale(out[b], manual_atm_block(block, x[b], prev, groups), "ATM block")
            for t in range(T):
                partners = [u for u in range(T) if u != t and groups[u] == groups[t]]
                # every token keeps its own residual: out - attn_out - ffn is x_t, never its partner's
                if not partners:
                    n_single += 1
                    continue
                u = partners[0]
                n_merged += 1
                torch.testing.assert_close(attn[b, t], attn[b, u], rtol=0, atol=0)  # one attention output per group
                assert not torch.allclose(out[b, t], out[b, u], rtol=1e-3, atol=0)  # but its own residual
    assert n_merged > 0 and n_single > 0
    assert not any(f"blocks.{i}.atm" in n for n in tr.names() for i in (0, 1, 4, 5))


def test_atm_leaves_unmerged_tokens_untouched_by_merging(model):
    """Merging a pair changes only what the pair's members and later tokens attend to: the
    residual of an unmerged token before the first merge is exactly its ATM-off value."""
    x = ids(1, 16, seed=7)
    with torch.no_grad(), tracing(["blocks.2.atm.adjacent_cos", "blocks.2.out"]) as off:
        model(x, atm=True, atm_tau=1.0)  # block 2 is the first ATM block: its cosines do not depend on tau
    cos = off["blocks.2.atm.adjacent_cos"][0]
    tau = float(cos[0] + cos[1:].max()) / 2  # token 0 stays alone, a later pair merges
    assert cos[1:].max() > cos[0]
    with torch.no_grad(), tracing(["blocks.2.atm.merge_map", "blocks.2.out"]) as on:
        model(x, atm=True, atm_tau=tau)
    groups = on["blocks.2.atm.merge_map"][0].tolist()
    first_merge = next(t for t in range(15) if groups[t] == groups[t + 1])
    assert first_merge > 0
    close_to_scale(on["blocks.2.out"][0, :first_merge], off["blocks.2.out"][0, :first_merge], "before the merge")


@pytest.mark.parametrize("variant", ["off", "paper", "causal"])
def test_atm_leaks_the_next_token_unless_off_or_causal(model, variant):
    """The paper's ATM copies a merged pair's attention output back to both tokens (eq. 32), so
    position t reads token t + 1: changing token t + 1 changes position t's logits exactly where t
    opens a pair. With ATM off or causal, no position's logits depend on a later token."""
    options = {"off": dict(atm=False), "paper": dict(atm=True, atm_tau=-1.0),  # tau -1: (0, 1), (2, 3), ... merge
               "causal": dict(atm=True, atm_tau=-1.0, atm_causal=True)}[variant]
    x = ids(1, 16, seed=3)
    with torch.no_grad(), tracing(["blocks.2.atm.merge_map"]) as tr:
        base = model(x, **options).logits
    groups = tr["blocks.2.atm.merge_map"][0].tolist() if variant != "off" else list(range(16))
    leaked = []
    for t in range(15):
        y = x.clone()
        y[0, t + 1] = (y[0, t + 1] + 1) % TINY["vocab_size"]
        with torch.no_grad():
            changed = model(y, **options).logits
        past, now = base[0, :t + 1], changed[0, :t + 1]
        if (past - now).abs().max() > 1e-3 * past.abs().max():  # a leak moves logits by ~1%; rounding by ~1e-7
            leaked.append(t)
        else:
            assert_close_to_scale(now, past, FORWARD_EPS, msg=f"{variant}: positions <= {t} vs token {t + 1}")
    opens_pair = [t for t in range(15) if groups[t] == groups[t + 1]]
    if variant == "paper":
        assert opens_pair == list(range(0, 15, 2))  # the greedy scan pairs every even t with t + 1
        assert leaked == opens_pair  # exactly the positions merged with their next token
    else:
        assert leaked == []


def manual_causal_atm_attention(block, n: torch.Tensor, summaries: torch.Tensor | None,
                                groups: list[int]) -> torch.Tensor:
    """Causal ATM's attention for one row n (T, d), position by position: the query at t is the mean
    of t's group up to t; it reads every earlier token that is not the first of a pair (those keys
    are their pair's mean at its second token) and itself, as an ordinary causal attention over that
    sub-sequence whose last element is t."""
    T = n.shape[0]
    opens = [t + 1 < T and groups[t] == groups[t + 1] for t in range(T)]
    z = [(n[t - 1] + n[t]) / 2 if t > 0 and groups[t] == groups[t - 1] else n[t] for t in range(T)]
    out = []
    for t in range(T):
        seen = [s for s in range(t) if not opens[s]] + [t]
        ctx = None if summaries is None else summaries[seen][None]
        out.append(block.attn(torch.stack([z[s] for s in seen])[None], torch.tensor([seen]), ctx, None)[0, -1])
    return torch.stack(out)


def test_causal_atm_matches_a_loop(model):
    B, T, tau = 2, 14, 0.0
    with torch.no_grad(), tracing() as tr:
        model(ids(B, T, seed=8), atm=True, atm_tau=tau, atm_causal=True)
    lam, n_pairs = model.config.gcla_lambda, 0
    for i in model.config.atm_layers:
        block = model.blocks[i]
        assert tr[f"blocks.{i}.attn.self_out"].shape[1] == T  # full length: nothing is merged away
        for b in range(B):
            hidden = tr[f"blocks.{i}.atm.hidden"][b]
            groups = loop_merge_map(hidden, tau)
            assert tr[f"blocks.{i}.atm.merge_map"][b].tolist() == groups
            n_pairs += T - len(set(groups))
            prev = [tr[f"blocks.{j}.out"][b] for j in range(max(0, i - lam), i)]
            summaries = torch.stack([loop_running_mean(o) for o in prev], dim=1) if prev else None
            with torch.no_grad():
                want = manual_causal_atm_attention(block, hidden, summaries, groups)
            close_to_scale(tr[f"blocks.{i}.attn_out"][b], want, "causal ATM attention")
    assert n_pairs > 0


def test_causal_atm_is_a_config_choice_and_a_per_call_option(model):
    x = ids(1, 12, seed=9)
    torch.manual_seed(0)
    causal_model = Wiola(WiolaConfig(**TINY, atm_causal=True)).eval()  # the fixture's weights, causal by default
    with torch.no_grad():
        by_config = causal_model(x, atm=True, atm_tau=0.0).logits
        by_call = model(x, atm=True, atm_tau=0.0, atm_causal=True).logits
        paper = causal_model(x, atm=True, atm_tau=0.0, atm_causal=False).logits
    torch.testing.assert_close(by_config, by_call, rtol=0, atol=0)
    assert (paper - by_config).abs().max() > 1e-3 * by_config.abs().max()


def test_greedy_merge_map_matches_loop_on_random_cosines():
    g = torch.Generator().manual_seed(4)
    cos = torch.rand(5, 30, generator=g) * 2 - 1
    for tau in (-0.5, 0.0, 0.3, 0.9):
        got = greedy_merge_map(cos, tau)
        for b in range(5):
            want, grp, t = [], 0, 0
            while t < 31:
                want.append(grp)
                if t < 30 and cos[b, t] > tau:
                    want.append(grp)
                    t += 1
                t += 1
                grp += 1
            assert got[b].tolist() == want


def test_atm_without_merges_equals_atm_off(model):
    x = ids(2, 16, seed=5)
    with torch.no_grad(), tracing(["blocks.2.atm.merge_map"]) as tr:
        on = model(x, atm=True, atm_tau=1.0).logits  # cos > 1 never holds
    assert tr["blocks.2.atm.merge_map"].tolist() == [list(range(16))] * 2
    with torch.no_grad():
        off = model(x, atm=False).logits
        causal = model(x, atm=True, atm_tau=1.0, atm_causal=True).logits
    assert_close_to_scale(on, off, FORWARD_EPS, msg="ATM with no merge vs ATM off")
    assert_close_to_scale(causal, off, FORWARD_EPS, msg="causal ATM with no merge vs ATM off")


def test_atm_defaults_on_in_training_only():
    m = Wiola(WiolaConfig(**TINY))
    x = ids(1, 10)
    m.train()
    with tracing(["blocks.2.atm.merge_map"]) as tr:
        m(x)
    assert "blocks.2.atm.merge_map" in tr
    m.eval()
    with torch.no_grad(), tracing(["blocks.2.atm.merge_map"]) as tr:
        m(x)
    assert "blocks.2.atm.merge_map" not in tr


def test_atm_with_cache_raises(model):
    with pytest.raises(ValueError, match="KV cache"):
        with torch.no_grad():
            model(ids(1, 4), atm=True, cache=model.new_cache())


def test_dsff_drop_stream_b(model):
    layer = "blocks.1.dsff"
    dsff = model.blocks[1].dsff
    calls, io = [], {}
    hooks = [dsff.ffn_b.register_forward_hook(lambda mod, i, o: calls.append(1)),
             dsff.register_forward_hook(lambda mod, i, o: io.update(x=i[0], y=o))]
    try:
        with torch.no_grad(), tracing() as tr:
            model(ids(1, 12), ablation=Ablation(drop=((layer, 1),)))
    finally:
        for h in hooks:
            h.remove()
    assert calls == []
    assert f"{layer}.stream_b" not in tr
    assert torch.equal(tr[f"{layer}.gate"], torch.ones(1, 12, TINY["d_model"]))
    a = dsff.ffn_a  # independent SwiGLU: down(silu(gate x) * up x)
    x = io["x"]
    want = (F.silu(x @ a.gate.weight.T) * (x @ a.up.weight.T)) @ a.down.weight.T
    # same matmuls, another association of the down projection's sum: a few eps of the output's scale
    assert_close_to_scale(io["y"], want, 16, msg="DSFF output")
    assert_close_to_scale(tr[f"{layer}.stream_a"], want, 16, msg="stream_a site")


def test_dsff_force_equals_drop_and_drop_a_gives_zero_gate(model):
    x = ids(1, 10, seed=6)
    with torch.no_grad():
        forced = model(x, ablation=Ablation(force=(("blocks.3.dsff", 0),))).logits
        dropped = model(x, ablation=Ablation(drop=(("blocks.3.dsff", 1),))).logits
        with tracing(["blocks.3.dsff.gate", "blocks.3.dsff.stream_a"]) as tr:
            model(x, ablation=Ablation(drop=(("blocks.3.dsff", 0),)))
    torch.testing.assert_close(forced, dropped, rtol=0, atol=0)  # exact: forcing A is run as dropping B
    assert torch.equal(tr["blocks.3.dsff.gate"], torch.zeros(1, 10, TINY["d_model"]))
    assert "blocks.3.dsff.stream_a" not in tr
    assert model.routing_layers() == {f"blocks.{i}.dsff": 2 for i in range(6)}


def test_gcla_beta_initial_value(model):
    with torch.no_grad(), tracing() as tr:
        model(ids(1, 6))
    assert "blocks.0.attn.gcla_beta" not in tr  # block 0 has no earlier layers
    for i in range(1, TINY["n_layers"]):
        assert math.isclose(float(tr[f"blocks.{i}.attn.gcla_beta"]), 1 / (1 + math.exp(3)), rel_tol=1e-6)


def gcla_float64(attn, x: torch.Tensor, summaries: torch.Tensor, c: WiolaConfig) -> torch.Tensor:
    """Eqs. 24-29 written out in float64 from the module's weights, one row x (T, d), summaries
    (T, L, d): causal GQA self-attention and the per-position cross-layer attention share the
    SRPE-rotated query; blend (1 - beta, beta) per head; sigmoid gate; then W_O."""
    T, H, Hkv, hd = x.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
    rep, xd, sd = H // Hkv, x.double(), summaries.double()
    wq, wk, wv = attn.self_attn.qkv.weight.double().split([H * hd, Hkv * hd, Hkv * hd])
    rot = lambda t, n: srpe_float64(t.view(T, n, hd).transpose(0, 1), list(range(T)), c.srpe_k,  # noqa: E731
                                    c.srpe_a, c.srpe_f).transpose(0, 1)  # (T, n, hd)
    q, k, v = rot(xd @ wq.T, H), rot(xd @ wk.T, Hkv), (xd @ wv.T).view(T, Hkv, hd)
    kc = (sd @ attn.cross.k.weight.double().T).view(T, -1, Hkv, hd)  # (T, L, Hkv, hd)
    vc = (sd @ attn.cross.v.weight.double().T).view(T, -1, Hkv, hd)
    beta = 1 / (1 + math.exp(-float(attn.phi)))
    o = torch.zeros(T, H, hd, dtype=torch.float64)
    for t in range(T):
        for h in range(H):
            j = h // rep
            w_self = torch.softmax(torch.stack([q[t, h] @ k[s, j] for s in range(t + 1)]) / math.sqrt(hd), 0)
            o_self = sum(w_self[s] * v[s, j] for s in range(t + 1))
            w_ctx = torch.softmax(kc[t, :, j] @ q[t, h] / math.sqrt(hd), 0)  # (L,)
            o_ctx = (w_ctx[:, None] * vc[t, :, j]).sum(0)
            o[t, h] = (1 - beta) * o_self + beta * o_ctx
    gate = torch.sigmoid(xd @ attn.gate.weight.double().T)  # (T, H * hd)
    return (gate * o.reshape(T, H * hd)) @ attn.proj.weight.double().T


def test_gcla_matches_an_independent_float64_recomputation():
    c = WiolaConfig(**{**TINY, "n_heads": 4, "n_kv_heads": 2, "srpe_a": 0.3, "srpe_f": 0.05})
    torch.manual_seed(5)
    m = Wiola(c).eval()
    attn = m.blocks[3].attn
    with torch.no_grad():
        attn.phi.fill_(0.4)  # beta ~ 0.6: both terms matter
    g = torch.Generator().manual_seed(6)
    B, T, L = 2, 9, 2
    x, summaries = torch.randn(B, T, c.d_model, generator=g), torch.randn(B, T, L, c.d_model, generator=g)
    with torch.no_grad(), tracing() as tr:
        got = attn(x, torch.arange(T)[None], summaries, None)
    for b in range(B):
        with torch.no_grad():
            want = gcla_float64(attn, x[b], summaries[b], c)
        # float32 projections, softmaxes and a blend against float64: the forward's rounding
        assert_close_to_scale(got[b], want, FORWARD_EPS, msg="GCLA vs float64")
    assert attn.gate.weight.shape == attn.proj.weight.shape[::-1] == (c.n_heads * c.head_dim, c.d_model)
    assert tr["blocks.3.attn.cross.weights"].shape == (B, T, c.n_heads, L)


@pytest.mark.parametrize("field,value", [("n_kv_heads", 3), ("atm_tau", 2.0), ("d_b", -1), ("srpe_k", 0),
                                         ("gcla_lambda", -1), ("norm_eps", 0.0)])
def test_bad_config_names_field(field, value):
    with pytest.raises(ConfigError, match=field):
        WiolaConfig(**{**TINY, field: value})


def srpe_float64(x: torch.Tensor, positions: list[int], k_s: float, a_s: float, f_s: float) -> torch.Tensor:
    """The paper's SRPE (Sec. VI) element by element in float64: pair j = (j, j + hd/2) at position
    p is rotated by Theta = p omega_j (1 + 1/k_s) and scaled by r = 1 + a_s sin(p f_s omega_j),
    omega_j = 10000^(-2j/hd). x: (H, T, hd)."""
    H, T, hd = x.shape
    out = torch.empty(H, T, hd, dtype=torch.float64)
    for h in range(H):
        for t, p in enumerate(positions):
            for j in range(hd // 2):
                omega = 10000.0 ** (-2.0 * j / hd)
                theta = p * omega * (1.0 + 1.0 / k_s)
                r = 1.0 + a_s * math.sin(p * f_s * omega)
                lo, hi = float(x[h, t, j]), float(x[h, t, j + hd // 2])
                out[h, t, j] = r * (lo * math.cos(theta) - hi * math.sin(theta))
                out[h, t, j + hd // 2] = r * (hi * math.cos(theta) + lo * math.sin(theta))
    return out


@pytest.mark.parametrize("k_s,a_s,f_s", [(8, 0.1, 0.01), (3, 0.4, 0.7), (1, 0.0, 0.0)])
def test_srpe_matches_the_papers_formula_in_float64(k_s, a_s, f_s):
    hd, C = 16, 40
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 7, hd, generator=g)  # (B, H, T, hd)
    positions = torch.tensor([[0, 1, 5, 17, 40, 63, 79], [3, 3, 9, 22, 31, 50, 78]])  # up to 2C - 1
    got = SRPE(hd, C, k_s, a_s, f_s)(x, positions)
    for b in range(2):
        want = srpe_float64(x[b], positions[b].tolist(), k_s, a_s, f_s)
        # one float32 rotation (2 products and a sum) of float32-rounded tables: a few eps of the scale
        assert_close_to_scale(got[b], want, 8, msg="SRPE vs float64")


def test_srpe_scores_are_relative_without_the_radial_term_and_tables_are_not_saved():
    hd, C = 8, 32
    g = torch.Generator().manual_seed(12)
    q, k = torch.randn(1, 1, 1, hd, generator=g), torch.randn(1, 1, 1, hd, generator=g)
    s = SRPE(hd, C, k_s=8, a_s=0.0, f_s=0.01)
    score = lambda p, n: float((s(q, torch.tensor([[p]])) * s(k, torch.tensor([[n]]))).sum())  # noqa: E731
    assert math.isclose(score(9, 4), score(30, 25), rel_tol=1e-5)  # same distance, same score
    assert not math.isclose(score(9, 4), score(9, 5), rel_tol=1e-3)
    spiral = SRPE(hd, C, k_s=8, a_s=0.3, f_s=0.05)
    assert not math.isclose(float((spiral(q, torch.tensor([[9]])) * spiral(k, torch.tensor([[4]]))).sum()),
                            float((spiral(q, torch.tensor([[30]])) * spiral(k, torch.tensor([[25]]))).sum()),
                            rel_tol=1e-3)  # the radial factor is absolute
    assert not s.state_dict()  # tables are non-persistent


def test_wiola_rmsnorm_offset():
    n = WiolaRMSNorm(6, eps=1e-6)
    with torch.no_grad():
        n.delta.copy_(torch.linspace(-1, 1, 6))
        n.weight.copy_(torch.linspace(0.5, 2, 6))
    x = torch.randn(3, 6)
    z = x + n.delta
    torch.testing.assert_close(n(x), n.weight * z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_registry_tiny_preset_roundtrip():
    cfg = from_name("wiola-tiny", n_layers=3)
    assert cfg == WiolaConfig(n_layers=3, atm_tau=0.6)  # the tiny preset's merge threshold (registry comment)
    assert WiolaConfig().atm_tau == 0.92  # the paper's, kept by the config and the paper-scale presets
    assert WiolaConfig.from_dict(cfg.to_dict()) == cfg


def test_eq22_grouping_is_ours_up_to_a_permutation_of_query_heads(model):
    """Eq. 22 pairs query head h with K/V head h mod H_kv; ours (and the authors' repeat_kv) pairs it
    with h // (H / H_kv). A plain loop of eqs. 22-23 with eq. 22's grouping, on the query heads
    reordered by pi(h) = (h % rep) * H_kv + h // rep, gives our head h's output as its head pi(h)."""
    att = model.blocks[1].attn.self_attn
    H, Hkv, hd = att.n_heads, att.n_kv, att.hd
    rep = H // Hkv
    B, T = 2, 10
    x = torch.randn(B, T, TINY["d_model"], generator=torch.Generator().manual_seed(5))
    pos = torch.arange(T)[None]
    with torch.no_grad():
        ours, _ = att(x, pos, None)  # (B, T, H, hd)
        q, k, v = att.qkv(x).double().split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = att.srpe(q.view(B, T, H, hd).transpose(1, 2), pos)  # (B, H, T, hd), our head order
        k = att.srpe(k.view(B, T, Hkv, hd).transpose(1, 2), pos)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
    pi = [(h % rep) * Hkv + h // rep for h in range(H)]
    assert sorted(pi) == list(range(H))  # a permutation
    paper_q = torch.empty_like(q)
    for h in range(H):
        paper_q[:, pi[h]] = q[:, h]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)  # M of eq. 22
    for hp in range(H):  # eqs. 22-23, head by head, g = h mod H_kv
        g = hp % Hkv
        a = torch.softmax((paper_q[:, hp] @ k[:, g].transpose(-1, -2) + mask) / math.sqrt(hd), dim=-1)
        out = a @ v[:, g]  # (B, T, hd)
        h = pi.index(hp)
        assert_close_to_scale(ours[:, :, h], out, 64, msg=f"paper head {hp} = our head {h}")
