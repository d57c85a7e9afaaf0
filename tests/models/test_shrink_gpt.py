"""lgpt / cgpt: the width schedule of the ParallelGPT paper's eqs. 6-7 and §4.1 (the last halving
included), fixed head count, the paper's 36.4M at its own configuration (built on the meta device),
and what Listing 1 (Appendix A) counts: it leaves the last halving out."""
import pytest
import torch

from routescope.core_models import ConfigError, build_model, from_name, param_count
from tolerances import FORWARD_EPS, assert_close_to_scale

# the paper's configuration: GPTConfig(n_layer=8, n_head=8, n_embd=512, block_size=1024) with
# vocab_size=50304 as its train.py passes; LinearGPT halves after every 2 blocks
PAPER = dict(d_model=512, n_layers=8, n_heads=8, halve_every=2, vocab_size=50304, context=1024)


def listing_schedule(d: int, n_layers: int, k: int) -> tuple[list[int], int]:
    """Block widths and the output width of eqs. 6-7: k blocks at width w, then w -> w // 2, for
    n_layers // k groups (the last group's halving included: d / 2^(N/n), §4.1's "final 32")."""
    widths, w = [], d
    for _ in range(n_layers // k):
        widths += [w] * k
        w //= 2
    return widths, w


def listing_param_count(d: int, n_layers: int, k: int, vocab: int, context: int) -> int:
    """Parameters of the paper's LinearGPT, module by module (bias-free blocks and LayerNorms,
    biased halving Linears, untied head)."""
    widths, out = listing_schedule(d, n_layers, k)
    total = vocab * d + context * d  # wte, wpe
    for i, w in enumerate(widths):
        total += w + 3 * w * w + w * w  # ln_1, c_attn, c_proj
        total += w + 4 * w * w + 4 * w * w  # ln_2, c_fc, c_proj
        if i % k == k - 1:
            total += w * (w // 2) + w // 2  # halving Linear(w, w // 2)
    return total + out + out * vocab  # ln_f, lm_head


def meta_model(family: str, **fields):
    with torch.device("meta"):
        return build_model(from_name(family, **fields))


@pytest.mark.parametrize("family", ["lgpt", "cgpt"])
def test_paper_configuration_counts_36_4M(family):
    model = meta_model(family, **PAPER)
    n = sum(p.numel() for p in model.parameters())
    assert round(n / 1e6, 1) == 36.4  # the paper's figure, to its rounding
    assert n == listing_param_count(512, 8, 2, 50304, 1024) == param_count(model.config)


@pytest.mark.parametrize("family,fields", [
    ("lgpt", PAPER), ("cgpt", PAPER),
    ("lgpt", dict(d_model=96, n_layers=6, n_heads=3, halve_every=3, vocab_size=50, context=16)),
    ("cgpt", dict(d_model=64, n_layers=4, n_heads=2, halve_every=1, vocab_size=50, context=16)),
])
def test_block_widths_and_heads_follow_the_listing(family, fields):
    model = meta_model(family, **fields)
    widths, out = listing_schedule(fields["d_model"], fields["n_layers"], fields["halve_every"])
    assert [b.attn.qkv.in_features for b in model.blocks] == widths
    assert [b.attn.n_heads for b in model.blocks] == [fields["n_heads"]] * len(widths)  # fixed n_head
    assert [b.attn.hd for b in model.blocks] == [w // fields["n_heads"] for w in widths]
    assert [b.ffn.fc.out_features for b in model.blocks] == [4 * w for w in widths]
    assert model.ln_f.normalized_shape == (out,) and model.head.in_features == out
    group_in = widths[::fields["halve_every"]]
    for red, w in zip(model.reductions, group_in, strict=True):  # one halving per group, the last included
        weight = red.weight if family == "lgpt" else red.conv.weight
        assert weight.shape[:2] == (w // 2, w)


def test_cgpt_kernel_1_conv_is_the_lgpt_linear():
    torch.manual_seed(0)
    fields = dict(vocab_size=50, d_model=32, n_layers=4, n_heads=2, halve_every=2, context=16)
    cg = build_model(from_name("cgpt", **fields)).eval()
    lg = build_model(from_name("lgpt", **fields)).eval()
    state = {k.replace(".conv.", ".") if k.startswith("reductions.") else k: v for k, v in cg.state_dict().items()}
    state = {k: v.squeeze(-1) if k.startswith("reductions.") and k.endswith("weight") else v for k, v in state.items()}
    lg.load_state_dict(state)
    idx = torch.randint(0, 50, (2, 9))
    assert_close_to_scale(lg(idx).logits, cg(idx).logits, FORWARD_EPS, msg="kernel-1 conv vs linear")


@pytest.mark.parametrize("fields,named", [
    (dict(d_model=64, n_layers=5, n_heads=2, halve_every=2), "n_layers"),  # a group without its halving
    (dict(d_model=64, n_layers=6, n_heads=32, halve_every=2), "n_heads"),  # 16-wide blocks cannot hold 32 heads
    (dict(d_model=8, n_layers=8, n_heads=1, halve_every=2), "d_model"),  # 8 -> 4 -> 2 -> 1 -> 1/2
])
def test_impossible_schedules_are_named(fields, named):
    with pytest.raises(ConfigError, match=named):
        from_name("lgpt", **fields)


def listing_1(vocab_size: int, n_embd: int, n_layer: int, layer_red: int) -> tuple[int, int, int]:
    """Appendix A's Listing 1, line by line (bias False): (gpt_params, lgpt_params, final width).
    Lines 18-19 count a block on every iteration (the indentation printed puts them in the `if`,
    which would skip most blocks and matches none of the paper's numbers)."""
    embedding_params = vocab_size * n_embd
    block_params = n_layer * (12 * n_embd ** 2)
    gpt_params = embedding_params + block_params + n_embd * vocab_size
    total_lgpt_params = embedding_params
    current_embd = n_embd
    for i in range(n_layer):
        linear_layer_params = 0
        if i % layer_red == 0 and i != 0:
            current_embd = max(1, current_embd // 2)
            linear_layer_params = current_embd * 2 * current_embd
        block_params = 12 * current_embd ** 2
        total_lgpt_params += block_params + linear_layer_params
    return gpt_params, total_lgpt_params + current_embd * vocab_size, current_embd


def test_listing_1_leaves_the_last_halving_out():
    """Appendix A's 581,827,200 (d 1600, 48 layers, halving every 12) is Listing 1's count, whose loop
    halves only between groups: 3 halvings for 4 groups, final width d / 2^3. Eq. 7, §4.1's "final
    embedding dimension ... 32" (512 / 2^4 with n = 2, N = 8) and Table 2's 36.4M need the last one."""
    gpt, lgpt, final = listing_1(50304, 1600, 48, 12)
    assert (gpt, lgpt) == (1_635_532_800, 581_827_200)  # Appendix A, both figures
    assert final == 1600 // 2 ** 3 != listing_schedule(1600, 48, 12)[1] == 1600 // 2 ** 4
    # ours: the last halving too (8 heads: Appendix A's 16 do not divide the width 200 of the last group)
    assert from_name("lgpt", **{**PAPER, "d_model": 1600, "n_layers": 48, "n_heads": 8,
                                "halve_every": 12}).out_dim == 100
    # at §4.1's configuration: ours ends at 32 and counts 36.4M; Listing 1 ends at 64 and would not
    assert meta_model("lgpt", **PAPER).config.out_dim == 32
    _, lgpt_paper, final_paper = listing_1(50304, 512, 8, 2)
    assert final_paper == 64 and round(lgpt_paper / 1e6, 1) != 36.4
