"""A real-size routing layout at a tiny width: a random Qwen3-MoE with 128 experts, top-8, in 24 (or
48) layers, built from transformers' own config class and written with `save_pretrained`, as a user's
directory would be (hidden size 32: about 11 MB). For the controls and views that must scale."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "checkpoints" / "tokenizer.json"


def scale_moe(path: Path, experts: int = 128, layers: int = 24, top_k: int = 8, seed: int = 0) -> Path:
    """A random `qwen3_moe` checkpoint at `path` (made): `experts` per layer, every layer sparse."""
    import transformers as T

    config = T.Qwen3MoeConfig(vocab_size=4096, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=8, intermediate_size=32, moe_intermediate_size=8,
                              num_experts=experts, num_experts_per_tok=top_k, decoder_sparse_step=1,
                              norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # router weights scaled up so tokens pick different experts
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
    model.save_pretrained(path)
    shutil.copy(TOKENIZER, path / "tokenizer.json")
    return path
