"""Tiny random Hugging Face models of every supported MoE type (and dense ones), built from
transformers' own config classes and saved with `save_pretrained`, as a user's directory would be."""
from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, tie_word_embeddings=False)


def hf_config(model_type: str, vocab_size: int):
    """A small config of `model_type` with a dense layer between MoE layers where the type has one."""
    import transformers as T

    v = dict(vocab_size=vocab_size, **COMMON)
    if model_type == "mixtral":
        return T.MixtralConfig(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, **v)
    if model_type == "qwen2_moe":  # layer 1 dense (mlp_only_layers), a shared expert with its gate
        return T.Qwen2MoeConfig(intermediate_size=48, moe_intermediate_size=24, shared_expert_intermediate_size=40,
                                num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1], **v)
    if model_type == "qwen3_moe":  # every second layer sparse (decoder_sparse_step 2: layer 1 of 0..2)
        return T.Qwen3MoeConfig(intermediate_size=48, moe_intermediate_size=24, num_experts=5, num_experts_per_tok=2,
                                norm_topk_prob=True, head_dim=8, decoder_sparse_step=2, **v)
    if model_type == "olmoe":
        return T.OlmoeConfig(intermediate_size=48, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, **v)
    if model_type == "deepseek_v3":  # first layer dense (first_k_dense_replace), group-limited routing, shared expert
        return T.DeepseekV3Config(intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8, n_group=4,
                                  topk_group=2, num_experts_per_tok=3, n_shared_experts=1, first_k_dense_replace=1,
                                  routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=16, q_lora_rank=None,
                                  qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                  **{**v, "num_key_value_heads": 4})  # its attention keeps one value head per query head
    if model_type == "gpt_oss":
        return T.GptOssConfig(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, head_dim=8,
                              sliding_window=16, **v)
    if model_type == "llama":
        return T.LlamaConfig(intermediate_size=48, **v)
    if model_type == "qwen2":
        return T.Qwen2Config(intermediate_size=48, **v)
    if model_type == "gpt2":
        return T.GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=128)
    raise KeyError(model_type)


MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss")


def hf_model(model_type: str, vocab_size: int, seed: int = 0):
    """A random transformers model in eval mode; router weights (and DeepSeek-V3's correction bias)
    scaled up so routes differ between tokens instead of sitting at near-uniform initial values."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(model_type, vocab_size)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("mlp.gate.weight", "mlp.router.weight", "mlp.router.bias")):
                p.normal_(0.0, 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
    return model


def save_hf(model, path: Path, tokenizer=None) -> Path:
    model.save_pretrained(path)  # safetensors, as transformers writes it
    if tokenizer is not None:
        tokenizer.save(str(path / "tokenizer.json"))
    return path


def saved_models(tmp_path_factory, tokenizer):
    """A module fixture's maker: model_type -> (tiny transformers model, its saved directory), each
    built and saved once per module."""
    made = {}

    def make(model_type: str):
        if model_type not in made:
            m = hf_model(model_type, tokenizer.get_vocab_size())
            made[model_type] = m, save_hf(m, tmp_path_factory.mktemp("hf") / f"tiny-{model_type}", tokenizer)
        return made[model_type]
    return make
