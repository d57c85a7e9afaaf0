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
from safetensors import safe_open
from safetensors.torch import load_file

from .base import RouteScopeLM
from .checkpoint import (DTYPE_NAMES, check_size, load_tokenizer_file, materialise, save_checkpoint, shape_model,
                         storage_dtypes, tokenizer_mismatch)
from .config import BaseConfig, ConfigError, json_kind, short_repr
from .papaformer import PapaformerConfig
from .pgpt import PGPTConfig
from .weights import CheckpointError, Header, read_header

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

# RouteScope config field -> the reference argument it comes from (error messages name both)
PAPAFORMER_FIELDS = {"vocab_size": "args.vocab_size", "d_model": "args.dim", "d_par": "args_paraller.dim",
                     "n_heads": "args.n_heads", "n_par_heads": "args_paraller.n_heads",
                     "n_parallel_layers": "args.n_layers", "n_paths": "args_paraller.n_parallel_blocks",
                     "context": "args.max_seq_len"}
PGPT_FIELDS = {"vocab_size": "gpt_config.vocab_size", "d_model": "gpt_config.n_embd", "n_layers": "gpt_config.n_layer",
               "n_heads": "gpt_config.n_head", "context": "gpt_config.block_size"}


def _section(d: Any, where: str, ints: tuple[str, ...], nullable: tuple[str, ...] = (),
             optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check one object of the reference config: an object, `ints` (and `nullable`) present, each of
    `ints`, `nullable`, `optional` an integer (`nullable` may be null)."""
    if not isinstance(d, dict):
        raise ImportError_(f"reference config {where}: expected a JSON object, got {json_kind(d)}")
    missing = [k for k in ints + nullable if k not in d]
    if missing:
        raise ImportError_(f"reference config {where}: missing {', '.join(missing)}")
    for k in ints + nullable + optional:
        v = d.get(k)
        if k in d and type(v) is not int and not (k in nullable and v is None):
            raise ImportError_(f"reference config {where}.{k} = {short_repr(v)}: expected an integer, got {json_kind(v)}")
    return d


def _make(cls: type, fields: dict[str, str], **kw: Any):
    try:
        return cls(**kw)
    except ConfigError as e:  # name the reference argument beside RouteScope's field
        m = re.match(r"\w+\.(\w+) =", str(e))
        raise ImportError_(f"{e} (from {fields[m[1]]})" if m and m[1] in fields else str(e)) from None


def papaformer_config(ref: dict[str, Any], source: str) -> PapaformerConfig:
    """Decoder(args, args_paraller) hyper-parameters -> PapaformerConfig with the reference options."""
    if "args" not in ref or "args_paraller" not in ref:
        raise ImportError_("PaPaformer reference config needs the objects 'args' and 'args_paraller'")
    a = _section(ref["args"], "args", ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"),
                 nullable=("pad_id",), optional=("head_dim",))
    p = _section(ref["args_paraller"], "args_paraller", ("dim", "n_heads", "n_parallel_blocks"), optional=("head_dim",))
    problems = []
    for name, obj in (("args", a), ("args_paraller", p)):
        if obj.get("ff_type", "SwiGLU") != "SwiGLU":
            problems.append(f"{name}.ff_type = {short_repr(obj['ff_type'])} (only SwiGLU is supported)")
        if obj.get("norm", "RMS") != "RMS":
            problems.append(f"{name}.norm = {short_repr(obj['norm'])} (only RMS is supported)")
        if obj.get("attention_type", "MultiH") != "MultiH":
            problems.append(f"{name}.attention_type = {short_repr(obj['attention_type'])} (only MultiH is supported)")
        if "head_dim" in obj and obj["head_dim"] * obj["n_heads"] != obj["dim"]:
            problems.append(f"{name}.head_dim = {obj['head_dim']} does not equal dim / n_heads")
    if source != "papaformer-share-linear" and p["n_parallel_blocks"] != 2:
        problems.append(f"args_paraller.n_parallel_blocks = {p['n_parallel_blocks']}: the reference Gumbel MoE "
                        "consumes exactly two paths")
    if problems:
        raise ImportError_("unsupported reference config: " + "; ".join(problems))
    pad = a["pad_id"]
    return _make(
        PapaformerConfig, PAPAFORMER_FIELDS,
        vocab_size=a["vocab_size"], d_model=a["dim"], d_par=p["dim"], n_heads=a["n_heads"], n_par_heads=p["n_heads"],
        n_large_pre=1, n_parallel_layers=a["n_layers"] + 1, n_paths=p["n_parallel_blocks"], n_large_post=1,
        combiner=COMBINER[source], ffn_mult=4, context=a["max_seq_len"], tie_embeddings=False,
        rope="interleaved", attn_out_proj=False, swiglu_beta=True, norm_eps=1e-5,
        pad_id=pad if pad is not None and 0 <= pad < a["vocab_size"] else -1,
        parallel_residual=False, fused_grow=source == "papaformer-share-linear", router_bias=True)


def pgpt_config(ref: dict[str, Any]) -> PGPTConfig:
    g = _section(ref.get("gpt_config", ref), "gpt_config" if "gpt_config" in ref else "(top level)",
                 ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"))
    bias = g.get("bias", False)
    if not isinstance(bias, bool):
        raise ImportError_(f"reference config gpt_config.bias = {short_repr(bias)}: expected true or false, "
                           f"got {json_kind(bias)}")
    if g["n_layer"] % 2:
        raise ImportError_(f"gpt_config.n_layer = {g['n_layer']}: ParallelGPT splits the layers over 2 paths")
    return _make(PGPTConfig, PGPT_FIELDS, vocab_size=g["vocab_size"], d_model=g["n_embd"], n_layers=g["n_layer"],
                 n_paths=2, n_heads=g["n_head"], context=g["block_size"], mix="sigmoid", pre_proj_bias=True,
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
        src = {"combine": "MoE.share_linear" if c.has_combined_route else "Share.linear",
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

def _safetensors_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise ImportError_(f"{path}: no such weights file")
    if path.suffix in (".pt", ".pth", ".bin", ".ckpt", ".pkl"):
        raise ImportError_(f"{path}: pickle-based weights are not opened (loading them can run code); convert them "
                           "where they were trained: safetensors.torch.save_file(state_dict, 'weights.safetensors')")
    if path.suffix != ".safetensors":
        raise ImportError_(f"{path}: unsupported weights format {path.suffix!r} (expected .safetensors)")
    return path


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    path = _safetensors_path(path)
    try:
        return load_file(str(path))
    except Exception as e:
        raise ImportError_(f"{path}: not a readable safetensors file ({e})") from None


def target_config(source: str, ref_config: Any) -> tuple[BaseConfig, Callable[..., Rule]]:
    """The RouteScope config for the reference hyper-parameters, and the tensor map of `source`."""
    if source not in SOURCES:
        raise ImportError_(f"--from {source!r}: expected one of {', '.join(SOURCES)}")
    if not isinstance(ref_config, dict):
        raise ImportError_(f"reference config: expected a JSON object, got {json_kind(ref_config)}")
    if source == "pgpt":
        return pgpt_config(ref_config), pgpt_rule
    return papaformer_config(ref_config, source), papaformer_rule


def plan(source: str, config: BaseConfig, rule_for: Callable[..., Rule], header: Header, config_where: str,
         weights_where: str) -> tuple[RouteScopeLM, dict[str, Rule]]:
    """The model with its parameters not yet allocated, and each of its tensors' rule, after checking
    the reference tensors' names, shapes and dtypes (`header`: name -> (shape, safetensors dtype))
    and, before any module is built, that the config's size fits the number of reference values."""
    try:
        check_size(config, header, config_where, weights_where)
    except CheckpointError as e:  # name the reference arguments beside RouteScope's fields
        fields = PGPT_FIELDS if source == "pgpt" else PAPAFORMER_FIELDS
        raise ImportError_(re.sub(r"\b(\w+) = (\d+)", lambda m: f"{m[0]} (from {fields[m[1]]})" if m[1] in fields
                                  else m[0], str(e), count=4)) from None
    model = shape_model(config)
    target = model.state_dict(keep_vars=True)
    rules = {k: rule_for(k, tuple(v.shape), config) for k, v in target.items()}
    expected = {s: (shape, target[k]) for k, r in rules.items() for s, shape in zip(r.sources, r.shapes)}
    problems = [f"missing reference key {k} {list(expected[k][0])}" for k in sorted(set(expected) - set(header))]
    problems += [f"unknown reference key {k} {list(header[k][0])}" for k in sorted(set(header) - set(expected))]
    for k in sorted(set(expected) & set(header)):
        (shape, stored), (want, into) = header[k], expected[k]
        if shape != want:
            problems.append(f"reference key {k} has shape {list(shape)}, expected {list(want)} for this config")
        if stored not in storage_dtypes(into):
            problems.append(f"reference key {k} is stored as {stored}, expected {' or '.join(storage_dtypes(into))}")
    if problems:
        raise ImportError_(f"{weights_where}: {source} weights do not fit the hyper-parameters of {config_where}: "
                           + "; ".join(problems))
    return model, rules


def fill(model: RouteScopeLM, rules: dict[str, Rule], tensor: Callable[[str], torch.Tensor], where: str) -> RouteScopeLM:
    """Allocate the planned model and copy each tensor from its reference tensors; refuses NaN/Inf."""
    model = materialise(model)
    target = model.state_dict()
    with torch.no_grad():
        for k, r in rules.items():
            value = target[k].copy_(r.join([tensor(s).float() for s in r.sources]))
            if not bool(torch.isfinite(value).all()):
                raise ImportError_(f"{where}: reference tensor {' / '.join(r.sources)} holds "
                                   f"{int((~torch.isfinite(value)).sum()):,} NaN/Inf value(s)")
    return model.eval()


def convert(source: str, state: dict[str, torch.Tensor], ref_config: dict[str, Any]) -> RouteScopeLM:
    """Build the RouteScope model for `source` and fill it from the reference state dict."""
    config, rule_for = target_config(source, ref_config)
    header = {k: (tuple(v.shape), DTYPE_NAMES.get(v.dtype, str(v.dtype))) for k, v in state.items()}
    model, rules = plan(source, config, rule_for, header, "the reference config", "the reference state dict")
    return fill(model, rules, state.__getitem__, "reference state dict")


def model_card(source: str, ref_config: dict[str, Any], weights: str, model: RouteScopeLM) -> str:
    ref = {k: ref_config[k] for k in ("reference_repo", "reference_file", "reference_commit") if k in ref_config}
    lines = [f"# Imported {source} checkpoint", "",
             f"Converted by `routescope import --from {source}` from `{Path(weights).name}`.", ""]
    lines += [f"- {k}: {v}" for k, v in ref.items()]
    lines += [f"- family: {model.config.family}", f"- parameters: {model.num_params():,}",
              "- training data, steps and validation loss: unknown (trained outside RouteScope)", ""]
    return "\n".join(lines)


def read_reference_config(path: str | os.PathLike) -> dict[str, Any]:
    try:
        ref = json.loads(Path(path).read_bytes())
    except (OSError, ValueError, RecursionError) as e:  # ValueError: JSON and UTF-8 decoding
        raise ImportError_(f"{path}: cannot read the reference config as JSON ({e})") from None
    if not isinstance(ref, dict):
        raise ImportError_(f"{path}: expected a JSON object of reference arguments, got {json_kind(ref)}")
    return ref


def import_checkpoint(source: str, weights: str | os.PathLike, config: str | os.PathLike | dict,
                      out: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> Path:
    """Check everything (config, tokenizer, the weights' header), then read and convert the weights,
    then write `out`; on any error nothing is written."""
    ref = config if isinstance(config, dict) else read_reference_config(config)
    where = "reference config" if isinstance(config, dict) else str(config)
    try:
        target, rule_for = target_config(source, ref)
    except ImportError_ as e:
        raise ImportError_(f"{where}: {e}") from None
    tok = load_tokenizer_file(tokenizer) if tokenizer else None
    if tok is not None and (problem := tokenizer_mismatch(tok, target.vocab_size)):
        raise ImportError_(f"{tokenizer}: {problem} (from {where})")
    path = _safetensors_path(weights)
    try:
        header = read_header(path)
    except CheckpointError as e:
        raise ImportError_(str(e)) from None
    model, rules = plan(source, target, rule_for, header, where, str(path))
    with safe_open(str(path), framework="pt") as f:
        model = fill(model, rules, f.get_tensor, str(path))
    return save_checkpoint(model, out, tokenizer=tok, card=model_card(source, ref, str(weights), model),
                           dtype=torch.float32)
