"""A transformers model without some experts (`HFModel.pruned_copy`), one with some experts merged into
others (`HFModel.merged_copy`, M-SMoE style), and writing a checkpoint with transformers' own
save_pretrained."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping, Sequence

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

    # --- merging: experts averaged into others (then removed by pruned_copy) ---------------------------
    def expert_tensors(self, layer: str) -> list[str]:
        """State-dict keys of routing layer `layer`'s experts module (its weights, stacked or not)."""
        prefix = self.routing_modules[layer].block.experts + "."
        return [k for k in self.hf.state_dict() if k.startswith(prefix)]

    def merge_problem(self, n: int) -> str | None:
        """Why `n` experts of every MoE layer cannot be merged into others (None: they can): pruning's
        conditions, and each layer's experts one module of tensors stacked on their first axis
        [experts, ...] (transformers 5's fused gate_up_proj / down_proj), which merging averages."""
        why = self.prune_problem(n)
        if why:
            return why
        if self._stack is None:  # the similarity reads each experts module's input from `capture`
            why = self.quirk.reason("resume") or "no single stack of decoder layers with a final norm"
            return f"{self.config.model_type}: merging reads the experts' inputs from a captured forward ({why})"
        for name, m in self.routing_modules.items():
            block = m.block
            if block.experts is None or block.routes_at_router:
                return (f"{self.config.model_type}: layer {name}'s experts are not one experts(hidden, top_k_index, "
                        "top_k_weights) module whose per-expert weights merging could average")
            state = self.hf.state_dict()
            keys = self.expert_tensors(name)
            bad = [k for k in keys if state[k].dim() == 0 or state[k].shape[0] != m.n_experts]
            if bad or not keys:
                return (f"{self.config.model_type}: {bad[0] if bad else block.experts} is not a tensor stacked on "
                        f"its first axis over the {m.n_experts} experts [experts, ...]: merging averages those")
        return None

    def every_expert_output(self, layer: str, hidden: torch.Tensor) -> torch.Tensor:
        """[tokens, n_experts, hidden]: every routed expert of `layer` run on every token of `hidden`
        [tokens, hidden] (the experts module's input), unweighted, by transformers' experts module."""
        m = self.routing_modules[layer]
        experts = self.hf.get_submodule(m.block.experts)
        one = torch.ones(hidden.shape[0], 1, dtype=hidden.dtype, device=hidden.device)
        idx = torch.zeros(hidden.shape[0], 1, dtype=torch.long, device=hidden.device)
        return torch.stack([experts(hidden, idx + e, one) for e in range(m.n_experts)], 1)

    def merged_copy(self, into: Mapping[str, Mapping[int, int]], usage: Mapping[str, Sequence[float]]) -> Any:
        """A copy of this model (the same expert count) in which each kept expert t of a layer holds the
        usage-weighted mean of its own weights and those of every expert d merged into it
        (`into[layer][d] = t`), for every tensor of the experts module (M-SMoE: weights by how often
        each was routed to, `usage[layer][expert]`; an equal mean where none of them was). The merged
        experts' own weights and router rows stay: a run drops them (`Ablation`), and `pruned_copy`
        of the copy removes them with their router rows, giving the same logits."""
        state = self.hf.state_dict()
        for layer, pairs in into.items():
            groups: dict[int, list[int]] = {}
            for d, t in sorted(pairs.items()):
                groups.setdefault(int(t), [int(t)]).append(int(d))
            u = torch.as_tensor(list(usage[layer]), dtype=torch.float64)
            for k in self.expert_tensors(layer):
                w = state[k].clone()
                for t, members in groups.items():
                    c = u[members]
                    c = c / c.sum() if c.sum() > 0 else torch.full_like(c, 1.0 / len(members))
                    c = c.to(w.device).reshape(-1, *[1] * (w.dim() - 1))
                    w[t] = (c * w[members].double()).sum(0).to(w.dtype)
                state[k] = w
        hf = build_causal_lm(copy.deepcopy(self.hf.config), dtype=next(self.hf.parameters()).dtype)
        hf.load_state_dict(state, strict=True)
        return type(self)(self.config, hf.to(self.device).eval()).eval()


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
