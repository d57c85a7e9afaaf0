"""A transformers model without some experts (`HFModel.pruned_copy`), and writing a checkpoint with
transformers' own save_pretrained."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import build_causal_lm


class PruneMixin:
    """HFModel's pruning and checkpoint writing (needs its hf, routing_modules and device)."""

    # --- pruning: a transformers model without some experts -------------------------------------------
    def prune_problem(self, n: int) -> str | None:
        """Why `n` experts cannot be removed from every MoE layer (None: they can)."""
        if len({m.n_experts for m in self.routing_modules.values()}) != 1:
            return "the MoE layers have different expert counts; one config field cannot say both"
        for name, m in self.routing_modules.items():
            if not 1 <= n <= m.n_experts - m.top_k:
                return (f"layer {name} has {m.n_experts} experts and routes each token to {m.top_k}; "
                        f"prune 1..{m.n_experts - m.top_k}")
        q = self.quirk
        if q.reason("prune"):
            return f"{q.model_type}: {q.reason('prune')}"
        text = getattr(self.hf.config, "text_config", None) or self.hf.config
        g = getattr(text, q.expert_groups, None) if q.expert_groups else None
        if isinstance(g, int) and g > 1:  # a group-limited top-k: every group the same size, scored by its top 2
            kept = next(iter(self.routing_modules.values())).n_experts - n
            if kept % g or kept // g < 2:
                return (f"{q.model_type}'s router picks among {q.expert_groups}={g} groups of experts, each scored by "
                        f"its top 2: keep a multiple of {g}, at least {2 * g} (prune {n} leaves {kept})")
        if _expert_count_field(self.hf.config, q.expert_count) is None:
            return f"{q.model_type}'s config has no integer {q.expert_count} (its record's expert count)"
        return None

    def pruned_copy(self, drop: dict[str, list[int]]) -> nn.Module:
        """A new transformers model without the experts `drop` names (layer -> options, the same count in
        every MoE layer): transformers builds it from the config with the expert count lowered, and it
        gets the kept weights (router rows and expert tensors sliced on their expert axis)."""
        counts = {len(v) for v in drop.values()}
        if set(drop) != set(self.routing_modules) or len(counts) != 1:
            raise ValueError("pruning removes the same number of experts from every MoE layer")
        cfg = copy.deepcopy(self.hf.config)
        text, field_ = _expert_count_field(cfg, self.quirk.expert_count)
        setattr(text, field_, getattr(text, field_) - counts.pop())
        new = build_causal_lm(cfg, dtype=next(self.hf.parameters()).dtype)
        state = self.hf.state_dict()
        for layer, options in drop.items():
            m = self.routing_modules[layer]
            keep = torch.tensor(sorted(set(range(m.n_experts)) - set(options)))
            for prefix in (layer + ".", m.block.experts + "."):
                for k in [k for k in state if k.startswith(prefix)]:
                    if state[k].dim() and state[k].shape[0] == m.n_experts:
                        state[k] = state[k].index_select(0, keep.to(state[k].device))
        new.load_state_dict(state, strict=True)
        return new.to(self.device).eval()


    @property
    def checkpoint_format(self) -> str:
        """How a saved copy is laid out (the trainer's model card says it)."""
        return (f"a Hugging Face transformers directory (`{type(self.hf).__name__}`, written by `save_pretrained`: "
                "config.json, model.safetensors, generation_config.json), with the project tokenizer; transformers "
                "opens it as it is")

    def write_checkpoint_files(self, path: Path, dtype: torch.dtype) -> None:
        """What `checkpoint.save_checkpoint` writes for this model: transformers' own save_pretrained
        (config.json, safetensors) of a copy in the storage dtype (the shared model is not touched)."""
        # transformers is optional (the hf extra): imported when an HF model is used
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its "Writing model shards" bar: the caller reports what it wrote
        try:
            copy.deepcopy(self.hf).to(dtype).save_pretrained(path, safe_serialization=True)
        finally:
            if bars:
                hf_logging.enable_progress_bar()


def _expert_count_field(config: Any, path: str | None) -> tuple[Any, str] | None:
    """(config object, field) of the record's expert count `path` ("num_experts", "ffn_config.moe_num_experts")
    in the (text) config, or None where it does not hold an integer there."""
    if path is None:
        return None
    source = getattr(config, "text_config", None) or config
    *outer, field_ = path.split(".")
    for part in outer:
        source = getattr(source, part, None)
    v = getattr(source, field_, None)
    return (source, field_) if isinstance(v, int) and not isinstance(v, bool) else None
