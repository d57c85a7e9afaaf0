"""Every causal-LM mixture-of-experts model type the installed transformers ships, as a tiny random
model: the types are enumerated from transformers itself (a config class with an expert-count field,
at top level or nested under `text_config` / `ffn_config`, and a `*ForCausalLM`), so a new pin tests
its new types without an edit here. Sizes are shrunk field by field from each type's own defaults;
`OVERRIDES` holds the few fields a type's validation ties together (test data, one row a type)."""
from __future__ import annotations

import json

import torch

EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOPK_FIELDS = ("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "moe_topk", "moe_k", "top_k_experts")
LAYER_FIELDS = ("num_hidden_layers", "n_layers", "num_layers")
N_EXPERTS, TOP_K, N_LAYERS = 8, 2, 4
# the types the fast suite checks, one or two of each router shape (softmax top-k, sigmoid with a
# selection bias, a biased router with no probabilities, scores passed to pre-scaled experts); the full
# suite checks every type
REPRESENTATIVE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss", "llama4")

# small values for the size fields types share (set wherever a type's config has the field)
SIZES = dict(
    hidden_size=64, d_model=64, n_embd=64, intermediate_size=64, moe_intermediate_size=32, ffn_hidden_size=32,
    shared_expert_intermediate_size=32, shared_intermediate_size=32, shared_experts_intermediate_size=32,
    num_attention_heads=4, n_heads=4, num_key_value_heads=4, kv_n_heads=4, head_dim=16,
    max_position_embeddings=256, n_positions=256, sliding_window=32, max_window_layers=N_LAYERS,
    kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, qk_head_dim=16,
    n_group=2, num_expert_group=2, topk_group=1, first_k_dense_replace=1, num_dense_layers=1,
    decoder_sparse_step=1, moe_layer_freq=1, layer_group_size=2,
    n_shared_experts=1, num_shared_experts=1, moe_num_shared_experts=1,
    attn_layer_period=2, attn_layer_offset=0, expert_layer_period=2, expert_layer_offset=1,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
    linear_head_dim=16, linear_num_heads=4,
    mamba_d_state=8, mamba_n_heads=4, mamba_head_dim=16, mamba_d_head=16, mamba_d_conv=4, mamba_expand=2,
    mamba_dt_rank=8, mamba_n_groups=1, mamba_chunk_size=16, ssm_state_size=8, n_groups=1, chunk_size=16,
    index_n_heads=2, index_head_dim=16, index_topk=8, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16,
    swa_num_attention_heads=4, swa_num_key_value_heads=4, swa_head_dim=16, swa_v_head_dim=16,
    ple_embed_dim=32, ngram_vocab_size_base=512, heads_per_ngram=2, make_ngram_vocab_size_divisible_by=8,
    expert_ffn_hidden_size=32,  # longcat_flash's experts (its default 2048 made 280 M parameters)
)
OVERRIDES: dict[str, dict] = {
    # its sliding-window layers double the key/value heads: 2 x 2 must divide the 4 query heads
    "mimo_v2_flash": {"num_key_value_heads": 2, "rope_parameters": {
        t: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        for t in ("full_attention", "sliding_attention")}},
    "qwen4_exp_text": {"indexer_budget": 64, "indexer_compress_ratio": 4},
    "dots3_note_text": {"head_dim": 16},  # its SWA head_dim must equal qk_nope + qk_rope
    "mistral4": {"head_dim": 16},  # qk_nope + qk_rope: its rotary part is partial_rotary_factor of it
    "granitemoehybrid": {"mamba_d_head": 32, "layer_types": ["mamba", "attention", "mamba", "attention"]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention", "conv", "full_attention"]},
    "zaya": {"num_experts_per_tok": 1},  # its validation accepts top-1 only
    "longcat_flash": {"zero_expert_num": 2},  # identity experts beside the 8 real ones (256 by default)
    # dense by default; the MoE variant is what this zoo is for, with a square expert count (product keys:
    # num_keys = floor(sqrt(num_experts)) per half, num_keys^2 experts chosen among)
    "doge": {"is_moe": True, "num_experts": 16},
    "gemma4_text": {"enable_moe_block": True},
    "gemma4": {"enable_moe_block": True},
    # its attention reads attn_config.rope_theta, which DbrxAttentionConfig does not default, and clamps by
    # clip_qkv, which fails at its default None: both as DBRX's own config.json sets them
    "dbrx": {"attn_config": {"kv_n_heads": 4, "rope_theta": 10000.0, "clip_qkv": 8.0}},
    "dots3_note": {"adapter_in_dim": 64, "adapter_out_dim": 64},  # its vision adapter joins the two widths
    # its towers' adapters: their own width (must equal hidden_size) -> the text model's
    "dots3_note_vision_encoder": {"adapter_in_dim": 64, "adapter_out_dim": 64},
    "dots3_note_audio_encoder": {"adapter_input_size": 64, "adapter_out_dim": 64},
}


def _is_moe_dict(d: dict) -> bool:
    subs = [d] + [d[k] for k in ("text_config", "ffn_config") if isinstance(d.get(k), dict)]
    return any(any(f in s for f in EXPERT_FIELDS) for s in subs)


def causal_lm_names() -> dict[str, str]:
    """model_type -> its *ForCausalLM class name: where transformers' causal-LM auto mapping files it,
    or where another auto mapping does (Mistral-4's is filed under image-text-to-text)."""
    from transformers.models.auto import modeling_auto

    out = dict(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    for k, m in vars(modeling_auto).items():
        if k.endswith("_MAPPING_NAMES") and isinstance(m, dict):
            for t, name in m.items():
                if isinstance(name, str) and name.endswith("ForCausalLM"):
                    out.setdefault(t, name)
    return out


def causal_lm(model_type: str):
    """The class that builds `model_type` as a causal LM (from_config / from_pretrained)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return transformers.AutoModelForCausalLM
    return _Concrete(getattr(transformers, causal_lm_names()[model_type]))


class _Concrete:
    """A concrete *ForCausalLM class with the auto class's from_config / from_pretrained."""

    def __init__(self, cls):
        self.cls = cls

    def from_config(self, cfg, **kw):
        return self.cls._from_config(cfg, **kw)

    def from_pretrained(self, path, **kw):
        return self.cls.from_pretrained(path, **kw)


def moe_types() -> dict[str, type]:
    """model_type -> config class: every causal-LM type whose default config has an expert field."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    causal = causal_lm_names()
    out = {}
    for model_type, name in CONFIG_MAPPING_NAMES.items():
        if model_type not in causal:
            continue
        cls = getattr(transformers, name, None)
        try:
            d = cls().to_dict()
        except Exception:  # a config that cannot be made with its defaults: enumerated, reported as not built
            out[model_type] = cls
            continue
        if _is_moe_dict(d):
            out[model_type] = cls
    return out


def shrink(d: dict, vocab: int) -> dict:
    """`d` (a config dict) with every size field small, N_LAYERS layers keeping each kind of layer,
    N_EXPERTS experts, top-TOP_K routing; nested configs shrunk the same way."""
    d = dict(d)
    model_type = d.pop("model_type", None)
    d.pop("transformers_version", None)
    for k, v in SIZES.items():
        if k in d and not isinstance(d[k], (list, dict)):
            d[k] = v
    for f in EXPERT_FIELDS:
        if f in d and not isinstance(d[f], (list, dict)) and d[f] != 0:
            d[f] = N_EXPERTS
    for f in TOPK_FIELDS:
        if f in d and not isinstance(d[f], (list, dict)):
            d[f] = TOP_K
    if d.get("qk_rope_head_dim") and "head_dim" in d:  # multi-head latent attention: head_dim is the rotary part
        d["head_dim"] = d["qk_rope_head_dim"]
    n = next((d[f] for f in LAYER_FIELDS if isinstance(d.get(f), int)), None)
    for k, v in list(d.items()):
        if isinstance(v, list) and v and n and len(v) == n:  # one entry per layer: the first ones, every kind kept
            out = v[:N_LAYERS]
            missing = [x for x in dict.fromkeys(map(json.dumps, v)) if x not in map(json.dumps, out)]
            for j, x in enumerate(missing[:N_LAYERS - 1]):
                out[N_LAYERS - 1 - j] = json.loads(x)
            d[k] = out
        elif isinstance(v, dict) and v and all(str(x).isdigit() for x in v):  # keyed by layer index
            d[k] = {x: shrink(y, vocab) if isinstance(y, dict) else y for x, y in v.items() if int(x) < N_LAYERS}
        elif k in ("text_config", "ffn_config", "attn_config") and isinstance(v, dict):
            d[k] = shrink(v, vocab)
            if "model_type" in v:
                d[k]["model_type"] = v["model_type"]
                d[k].update(OVERRIDES.get(v["model_type"], {}))
        elif k.endswith("_config") and isinstance(v, dict):  # vision/audio towers: small too
            d[k] = {**shrink(v, vocab), **({"model_type": v["model_type"]} if "model_type" in v else {}),
                    **OVERRIDES.get(v.get("model_type"), {})}
    for f in LAYER_FIELDS:
        if isinstance(d.get(f), int):
            d[f] = N_LAYERS
    for f in ("vocab_size", "vocab_size_per_layer_input"):  # the second: gemma4's per-layer embeddings (262,144)
        if f in d:
            d[f] = vocab
    for f in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(d.get(f), int) and not isinstance(d[f], bool) and d[f] >= vocab:
            d[f] = vocab - 1
        elif isinstance(d.get(f), list):
            d[f] = [min(x, vocab - 1) for x in d[f]]
    d.update(OVERRIDES.get(model_type, {}))
    return d


def tiny_moe(model_type: str, cls: type, vocab: int, seed: int = 0):
    """A random tiny transformers model of `model_type` in eval mode; router weights scaled up so
    routes differ between tokens (at their initial values they sit near uniform)."""
    cfg = cls(**shrink(cls().to_dict(), vocab))
    torch.manual_seed(seed)
    model = causal_lm(model_type).from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".gate." in name or ".router." in name or name.endswith((".gate.weight", ".router.weight")):
                if p.dim() == 2:
                    p.normal_(0.0, 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
    return model
