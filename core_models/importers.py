"""Import state dicts trained with the papers' own code into RouteScope families.

- PaPaformer (github.com/Jtapsa/Decoder_Only_Transformer_Research): Paformer_lin.py (Share-Linear),
  gumbel_moe.py (Gumbel v1), gumbel_moe_2.py (Gumbel v2), class Decoder(args, args_paraller).
- ParallelGPT (github.com/SkAndMl/gpt-variations): models.py, class ParallelGPT(GPTConfig).

The reference hyper-parameters come as JSON with the reference's own argument names (the parity
fixtures' config.json is accepted as it is). Each RouteScope tensor is mapped from named
reference tensors; before anything is copied every unknown, missing or mis-shaped reference key is
collected and reported together. Weights are read from .safetensors only: a pickle-based .pt/.pth
file is refused, never opened (convert it where it was trained).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file

from .base import RouteScopeLM
from .papaformer import PapaformerConfig
from .pgpt import PGPTConfig
from .registry import build_model

SOURCES = ("papaformer-share-linear", "papaformer-gumbel-v1", "papaformer-gumbel-v2", "pgpt")
COMBINER = {"papaformer-share-linear": "share_linear", "papaformer-gumbel-v1": "gumbel_v1",
            "papaformer-gumbel-v2": "gumbel_v2"}


class ImportError_(ValueError):
    """A reference state dict or config does not fit; the message lists every problem."""


@dataclass(frozen=True)
class Rule:
    """One RouteScope tensor built from reference tensors."""

    sources: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    join: Callable[[list[torch.Tensor]], torch.Tensor]


def _same(t: list[torch.Tensor]) -> torch.Tensor:
    return t[0]


def _cat_rows(t: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(t, dim=0)


def _flatten(t: list[torch.Tensor]) -> torch.Tensor:
    return t[0].reshape(-1)


# --- hyper-parameters -----------------------------------------------------------------------------

def _need(d: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        raise ImportError_(f"reference config {where}: missing {', '.join(missing)}")


def papaformer_config(ref: dict[str, Any], source: str) -> PapaformerConfig:
    """Decoder(args, args_paraller) hyper-parameters -> PapaformerConfig with the reference options."""
    if "args" not in ref or "args_paraller" not in ref:
        raise ImportError_("PaPaformer reference config needs the objects 'args' and 'args_paraller'")
    a, p = ref["args"], ref["args_paraller"]
    _need(a, ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len", "pad_id"), "args")
    _need(p, ("dim", "n_heads", "n_parallel_blocks"), "args_paraller")
    problems = []
    for name, obj in (("args", a), ("args_paraller", p)):
        if obj.get("ff_type", "SwiGLU") != "SwiGLU":
            problems.append(f"{name}.ff_type = {obj['ff_type']!r} (only SwiGLU is supported)")
        if obj.get("norm", "RMS") != "RMS":
            problems.append(f"{name}.norm = {obj['norm']!r} (only RMS is supported)")
        if obj.get("attention_type", "MultiH") != "MultiH":
            problems.append(f"{name}.attention_type = {obj['attention_type']!r} (only MultiH is supported)")
        if "head_dim" in obj and obj["head_dim"] * obj["n_heads"] != obj["dim"]:
            problems.append(f"{name}.head_dim = {obj['head_dim']} does not equal dim / n_heads")
    if source != "papaformer-share-linear" and p["n_parallel_blocks"] != 2:
        problems.append(f"args_paraller.n_parallel_blocks = {p['n_parallel_blocks']}: the reference Gumbel MoE "
                        "consumes exactly two paths")
    if problems:
        raise ImportError_("unsupported reference config: " + "; ".join(problems))
    pad = a["pad_id"]
    return PapaformerConfig(
        vocab_size=a["vocab_size"], d_model=a["dim"], d_par=p["dim"], n_heads=a["n_heads"], n_par_heads=p["n_heads"],
        n_large_pre=1, n_parallel_layers=a["n_layers"] + 1, n_paths=p["n_parallel_blocks"], n_large_post=1,
        combiner=COMBINER[source], ffn_mult=4, context=a["max_seq_len"], tie_embeddings=False,
        rope="interleaved", attn_out_proj=False, swiglu_beta=True, norm_eps=1e-5,
        pad_id=pad if pad is not None and 0 <= pad < a["vocab_size"] else -1,
        parallel_residual=False, fused_grow=source == "papaformer-share-linear", router_bias=True)


def pgpt_config(ref: dict[str, Any]) -> PGPTConfig:
    g = ref.get("gpt_config", ref)
    _need(g, ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"), "gpt_config")
    bias = bool(g.get("bias", False))
    if g["n_layer"] % 2:
        raise ImportError_(f"gpt_config.n_layer = {g['n_layer']}: ParallelGPT splits the layers over 2 paths")
    return PGPTConfig(vocab_size=g["vocab_size"], d_model=g["n_embd"], n_layers=g["n_layer"], n_paths=2,
                      n_heads=g["n_head"], context=g["block_size"], mix="sigmoid", pre_proj_bias=True,
                      ln_bias=bias, linear_bias=bias, gelu_approx="none", tie_embeddings=False)


# --- tensor maps --------------------------------------------------------------------------------

def _papaformer_block(prefix: str, rest: str, shape: tuple[int, ...]) -> Rule:
    if rest == "attn.qkv.weight":
        d = shape[1]
        return Rule(tuple(f"{prefix}attention.{x}.linear.weight" for x in "QKV"), ((d, d),) * 3, _cat_rows)
    if rest == "ffn.beta":
        return Rule((f"{prefix}feedforward.beta",), ((1, shape[0]),), _flatten)
    names = {"ffn.gate.weight": "feedforward.linear1.weight", "ffn.up.weight": "feedforward.linear2.weight",
             "ffn.down.weight": "feedforward.linear3.weight", "norm_1.weight": "norm_1.weight",
             "norm_2.weight": "norm_2.weight"}
    return Rule((prefix + names[rest],), (shape,), _same)


def papaformer_rule(key: str, shape: tuple[int, ...], c: PapaformerConfig) -> Rule:
    last = c.n_parallel_layers  # reference index of the last parallel layer (layers.0 is the first full one)
    simple = {"embed.weight": "embeddings.weight", "norm.weight": "norm.weight", "head.weight": "Linear.linear.weight",
              "shrink.weight": "layers.0.Share.linear.weight"}
    if key in simple:
        return Rule((simple[key],), (shape,), _same)
    if m := re.fullmatch(r"large_pre\.0\.(.+)", key):
        return _papaformer_block("layers.0.block.", m[1], shape)
    if m := re.fullmatch(r"large_post\.0\.(.+)", key):
        return _papaformer_block(f"layers.{last + 1}.block.", m[1], shape)
    if m := re.fullmatch(r"parallel\.(\d+)\.paths\.(\d+)\.block\.(.+)", key):
        return _papaformer_block(f"layers.{int(m[1]) + 1}.blocks.{m[2]}.", m[3], shape)
    if m := re.fullmatch(r"parallel\.(\d+)\.(combine|router\.proj|grow)\.(weight|bias)", key):
        layer = f"layers.{int(m[1]) + 1}."
        src = {"combine": "Share.linear" if c.combiner == "share_linear" else "MoE.share_linear",
               "router.proj": "MoE.router", "grow": "out_linear.linear"}[m[2]]
        return Rule((layer + src + "." + m[3],), (shape,), _same)
    raise ImportError_(f"no reference tensor maps to {key}")


def pgpt_rule(key: str, shape: tuple[int, ...], c: PGPTConfig) -> Rule:
    simple = {"embed.wte.weight": "transformer.wte.weight", "embed.wpe.weight": "transformer.wpe.weight",
              "mixer.w": "transformer.wt", "ln_f.weight": "transformer.ln_f.weight",
              "ln_f.bias": "transformer.ln_f.bias", "head.weight": "lm_head.weight"}
    if key in simple:
        return Rule((simple[key],), (shape,), _same)
    if m := re.fullmatch(r"paths\.(\d+)\.pre\.(weight|bias)", key):
        return Rule((f"transformer.lin_{int(m[1]) + 1}.{m[2]}",), (shape,), _same)
    if m := re.fullmatch(r"paths\.(\d+)\.blocks\.(\d+)\.(.+)", key):
        names = {"norm_1": "ln_1", "norm_2": "ln_2", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj",
                 "ffn.fc": "mlp.c_fc", "ffn.proj": "mlp.c_proj"}
        module, _, param = m[3].rpartition(".")
        return Rule((f"transformer.h_{int(m[1]) + 1}.{m[2]}.{names[module]}.{param}",), (shape,), _same)
    raise ImportError_(f"no reference tensor maps to {key}")


# --- conversion ---------------------------------------------------------------------------------

def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise ImportError_(f"{path}: no such weights file")
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except Exception as e:
            raise ImportError_(f"{path}: not a readable safetensors file ({e})") from None
    if path.suffix in (".pt", ".pth", ".bin", ".ckpt", ".pkl"):
        raise ImportError_(f"{path}: pickle-based weights are not opened (loading them can run code); convert them "
                           "where they were trained: safetensors.torch.save_file(state_dict, 'weights.safetensors')")
    raise ImportError_(f"{path}: unsupported weights format {path.suffix!r} (expected .safetensors)")


def convert(source: str, state: dict[str, torch.Tensor], ref_config: dict[str, Any]) -> RouteScopeLM:
    """Build the RouteScope model for `source` and fill it from the reference state dict."""
    if source not in SOURCES:
        raise ImportError_(f"--from {source!r}: expected one of {', '.join(SOURCES)}")
    if source == "pgpt":
        config, rule_for = pgpt_config(ref_config), pgpt_rule
    else:
        config, rule_for = papaformer_config(ref_config, source), papaformer_rule
    model = build_model(config)
    target = model.state_dict()
    rules = {k: rule_for(k, tuple(v.shape), config) for k, v in target.items()}
    expected = {s: shape for r in rules.values() for s, shape in zip(r.sources, r.shapes)}
    problems = [f"missing reference key {k} {list(expected[k])}" for k in sorted(set(expected) - set(state))]
    problems += [f"unknown reference key {k} {list(state[k].shape)}" for k in sorted(set(state) - set(expected))]
    problems += [f"reference key {k} has shape {list(state[k].shape)}, expected {list(expected[k])} for this config"
                 for k in sorted(set(expected) & set(state)) if tuple(state[k].shape) != expected[k]]
    if problems:
        raise ImportError_(f"{source} weights do not fit the given hyper-parameters: " + "; ".join(problems))
    with torch.no_grad():
        for k, r in rules.items():
            target[k].copy_(r.join([state[s].float() for s in r.sources]))
    return model.eval()


def model_card(source: str, ref_config: dict[str, Any], weights: str, model: RouteScopeLM) -> str:
    ref = {k: ref_config[k] for k in ("reference_repo", "reference_file", "reference_commit") if k in ref_config}
    lines = [f"# Imported {source} checkpoint", "",
             f"Converted by `routescope import --from {source}` from `{Path(weights).name}`.", ""]
    lines += [f"- {k}: {v}" for k, v in ref.items()]
    lines += [f"- family: {model.config.family}", f"- parameters: {model.num_params():,}",
              "- training data, steps and validation loss: unknown (trained outside RouteScope)", ""]
    return "\n".join(lines)


def import_checkpoint(source: str, weights: str | os.PathLike, config: str | os.PathLike | dict,
                      out: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> Path:
    from .checkpoint import load_tokenizer_file, save_checkpoint

    if isinstance(config, dict):
        ref = config
    else:
        try:
            ref = json.loads(Path(config).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ImportError_(f"{config}: cannot read the reference config as JSON ({e})") from None
    model = convert(source, read_state_dict(weights), ref)
    tok = load_tokenizer_file(tokenizer) if tokenizer else None
    if tok is not None and tok.get_vocab_size() > model.vocab_size:
        raise ImportError_(f"{tokenizer}: {tok.get_vocab_size()} tokens exceed the model's vocabulary "
                           f"({model.vocab_size})")
    return save_checkpoint(model, out, tokenizer=tok, card=model_card(source, ref, str(weights), model),
                           dtype=torch.float32)
