"""What differs, model type by model type, from the generic way RouteScope reads a transformers MoE block.

The generic block (`GENERIC`; Mixtral, OLMoE, Qwen3-MoE, ...): a router whose first `F.linear` gives the
logits and returns (logits, top-k weights, top-k indices); a softmax over every expert, then top-k;
`experts(hidden_states, top_k_index, top_k_weights)`; `num_experts` and the router's `top_k` in the
config and module; no shared expert; the decoder stack ends in `norm`. A type that differs in any of
that has one `Quirk` record below, stated from transformers 5.23's own modeling files (each `why`
names what its router does). `moe_layout` checks every record against the model transformers builds
and refuses, in one line, a model that does not match its record. Adding a quirk: one record here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

LOGITS, PROBS, SCORES = "logits", "probs", "scores"  # SCORES: [tokens, n] weights, 0 where not chosen
SLOTS, GATES = "sorted slots", "sorted gates"  # JetMoE: token-major top-k slots sorted by expert, their weights
EXPERTS_CALL = ("hidden_states", "top_k_index", "top_k_weights")  # what every block passes its experts
ONE_SLOT = "one slot"  # an experts call with one expert per token (top_k_index [tokens, 1]), for per-expert outputs


@dataclass(frozen=True)
class Quirk:
    """One model type's routing, where it differs from the generic block (field defaults are the generic one)."""

    model_type: str
    why: str  # what differs and why, in one line (shown where a role or a type is refused)
    output: tuple[str, ...] = ("logits", "weights", "indices")  # the router's return value, element by element
    scoring: str = "softmax"  # softmax | sigmoid | softmax over the top-k | sparsemixer | MLP router
    logits_ops: tuple[str, ...] = ("linear",)  # torch ops whose first result inside the router is the logits
    logits_weight: str | None = None  # the weight (path in the router) of the op giving the logits, where
    # it is not the router's first (ZAYA's MLP router: its last linear, router_mlp.out_proj.weight)
    # where the block's routes are read: "experts" (the experts call's top_k_index, top_k_weights) or
    # "router" (the router's own first torch.topk gives the indices; the weights are its dense `scores`
    # output gathered there (Llama-4: its experts take tokens already scaled by them), or its `sorted
    # gates` put back in token order by its `sorted slots` (JetMoE))
    routes: str = "experts"
    experts: str | None = "experts"  # the experts module beside the router, by child name (None: none is one
    # module; per-expert outputs are then unavailable)
    call_order: tuple[str, ...] = ()  # a decoder layer's children in the order its forward calls them, where
    # routers sit in several and module order differs (JetMoE registers its MLP before its attention)
    option_nouns: tuple[tuple[str, str], ...] = ()  # (path segment, what a routing layer under it routes
    # to), where not MLP experts (JetMoE's attention experts)
    expert_attr: str | None = None  # the router's attribute counting its experts, where its logits are not
    # one per expert; the record then masks a dropped expert where the router's top-k chooses among every
    # expert (the scores it takes, by the expert ids of the last integer tensor of that width: Doge)
    expert_power: int = 1  # experts = expert_attr ** this (Doge: num_keys per half of its product keys, so
    # num_keys^2 experts chosen among; a config's num_experts that is no square has rows no route reaches)
    expert_groups: str | None = None  # the (text) config field grouping the experts for a group-limited top-k
    # (each group scored by its top 2): pruning keeps a multiple of it, at least 2 a group
    last_options: tuple[str, ...] = ()  # labels of the router's last options where they are no experts
    # (ZAYA's skip class)
    static_routers: tuple[str, ...] = ()  # router classes that pick experts by a fixed table, not a choice
    # transformers records: their blocks run as built and are no routing layers (DeepSeek-V4's hash layers)
    choice_bias: str | None = None  # the tensor (path from the MoE block) added to scores before selection
    top_k: str = "router.top_k"  # experts per token: "router.<attr>" or "config.<field>" (text config)
    expert_count: str | None = "num_experts"  # the (text) config field counting routed experts: lowered by pruning
    shared: str | None = None  # the MoE block's shared expert (runs for every token), by child name
    shared_gate: str | None = None  # its gate linear, by child name
    final_norm: str | None = "norm"  # the final norm beside the decoder layers' ModuleList (None: no resume)
    logit_mask: float = float("-inf")  # a dropped expert's logit
    unavailable: tuple[tuple[str, str], ...] = ()  # (role, why it has no site for this type)
    refused: str | None = None  # why RouteScope cannot follow this type at all

    def reason(self, role: str) -> str | None:
        """Why `role` is not recorded for this type (None: it is)."""
        return dict(self.unavailable).get(role)


GENERIC = Quirk("*", "the common transformers MoE block: linear logits, softmax over every expert, top-k")

_TOPK_SOFTMAX = ((PROBS, "its router applies its softmax to the top-k logits only: there is no probability "
                         "over every expert"),)
# DeepSeek-V3's router and the many types transformers derives from it (modular files): sigmoid scores, the
# selection made on scores + e_score_correction_bias (group-limited where n_group > 1), weights gathered
# from the unbiased scores; shared experts beside the routed ones
_DEEPSEEK_V3 = Quirk("", "DeepSeek-V3's router: sigmoid scores, selection on scores + e_score_correction_bias, "
                         "shared experts", scoring="sigmoid", choice_bias="gate.e_score_correction_bias",
                     expert_count="n_routed_experts", shared="shared_experts", expert_groups="n_group")
_QWEN2_MOE = Quirk("", "Qwen2-MoE's block: a softmax router plus one shared expert scaled by its own sigmoid gate",
                   shared="shared_expert", shared_gate="shared_expert_gate")
_SIGMOID = Quirk("", "a sigmoid router: each expert scored on its own, top-k of the sigmoid scores", scoring="sigmoid")


def _as(base: Quirk, model_type: str, why: str | None = None, **changes) -> Quirk:
    return replace(base, model_type=model_type, why=why or base.why, **changes)


QUIRKS: dict[str, Quirk] = {q.model_type: q for q in [
    # softmax routers that differ in a name only
    Quirk("jamba", "Jamba's hybrid stack ends in final_layernorm", final_norm="final_layernorm"),
    Quirk("deepseek_v2", "DeepSeek-V2: softmax router (greedy or group-limited top-k), shared experts",
          shared="shared_experts"),
    Quirk("mistral4", "Mistral-4: DeepSeek-V2's softmax router (group-limited top-k, weights times "
          "routed_scaling_factor), shared experts; transformers files its causal LM under image-text-to-text "
          "(the loader finds it by `architectures`)", expert_count="n_routed_experts", shared="shared_experts",
          expert_groups="n_group"),
    Quirk("hunyuan_v1_moe", "HunYuan-MoE: the router's `wg` linear, softmax; a shared MLP", shared="shared_mlp"),
    Quirk("ernie4_5_moe", "ERNIE-4.5: softmax router whose selection adds moe_statics.e_score_correction_bias to the "
          "probabilities; shared experts", choice_bias="gate.moe_statics.e_score_correction_bias",
          shared="shared_experts"),
    Quirk("longcat_flash", "LongCat-Flash: softmax scores, selection on scores + e_score_correction_bias; zero-"
          "computation experts past the routed ones", choice_bias="router.e_score_correction_bias",
          expert_count="n_routed_experts",
          unavailable=(("prune", "its router's logits also cover zero_expert_num zero-computation experts, which "
                                 "pruning by n_routed_experts would not slice"),
                       (ONE_SLOT, "its experts call squeezes the slot axis, so a call with one expert per token "
                                  "fails (transformers 5.23)"))),
    Quirk("gemma4_text", "Gemma-4: the router normalises its input, projects (`proj`), and returns the softmax "
          "probabilities, not the logits; experts per token in config.top_k_experts",
          output=("probs", "weights", "indices"), top_k="config.top_k_experts"),
    Quirk("dbrx", "DBRX: the router returns its linear's logits only (the block's route_tokens_to_experts takes "
          "the softmax and top-k); expert fields under ffn_config", output=("logits",),
          top_k="config.ffn_config.moe_top_k", expert_count=None, final_norm="norm_f",
          unavailable=((PROBS, "its router returns logits only; the softmax is taken by the MoE block"),
                       ("prune", "its experts' weights are stacked as one [experts x ffn, hidden] tensor per "
                                 "projection (w1, v1, w2), which pruning does not slice"))),
    Quirk("phimoe", "Phi-MoE: sparsemixer routing subtracts logits from their maximum (a -inf mask would give NaN)",
          scoring="sparsemixer", expert_count="num_local_experts", logit_mask=-1e9,
          unavailable=((PROBS, "its sparsemixer takes a softmax of logits masked around each choice: there is no "
                               "probability over every expert"),)),
    # softmax over the top-k logits only: no probabilities over every expert
    Quirk("gpt_oss", "gpt-oss: the router's linear has a bias; softmax over the top-k logits only",
          scoring="softmax over the top-k", unavailable=_TOPK_SOFTMAX),
    Quirk("aria_text", "Aria: softmax over the top-k logits only; shared experts; moe_* config names",
          scoring="softmax over the top-k", top_k="router.top_k", expert_count="moe_num_experts",
          shared="shared_experts", unavailable=_TOPK_SOFTMAX),
    *[Quirk(t, "Granite-MoE: softmax over the top-k logits only", scoring="softmax over the top-k",
            expert_count="num_local_experts", unavailable=_TOPK_SOFTMAX)
      for t in ("granitemoe", "granitemoe_swa", "granitemoehybrid", "granitemoeshared")],
    Quirk("cohere2_moe", "Cohere2-MoE: top-k of the logits, then softmax or sigmoid (expert_selection_fn) of those "
          "k only; shared experts", scoring="softmax or sigmoid over the top-k", shared="shared_experts",
          unavailable=((PROBS, "its router normalises the top-k logits only (expert_selection_fn)"),)),
    # Qwen2-MoE's block: a shared expert with a sigmoid gate
    *[_as(_QWEN2_MOE, t) for t in ("qwen2_moe", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")],
    *[_as(_QWEN2_MOE, t, "Qwen4-Exp: Qwen2-MoE's block inside hyper-connections (hc_count residual streams, "
          "mixed by hyper_connection_mixer before the head; no final norm)", final_norm=None,
          unavailable=(("resume", "its decoder layers carry hc_count residual streams (hyper-connections), mixed by "
                                  "hyper_connection_mixer, not a final norm, before the head"),))
      for t in ("qwen4_exp", "qwen4_exp_text")],
    # sigmoid routers without a selection bias
    _as(_SIGMOID, "flint", shared="shared_expert"),
    _as(_SIGMOID, "hy_v3", "HY-V3: sigmoid router; the block passes its e_score_correction_bias in for selection; "
        "shared experts", choice_bias="e_score_correction_bias", shared="shared_experts"),
    _as(_SIGMOID, "minimax_m2", "MiniMax-M2: sigmoid router; the block passes its e_score_correction_bias in for "
        "selection", choice_bias="e_score_correction_bias"),
    _as(_SIGMOID, "afmoe", "AFMoE: sigmoid of the router's `gate` linear; the block passes its expert_bias in for "
        "selection; shared experts", choice_bias="expert_bias", shared="shared_experts"),
    _as(_SIGMOID, "lfm2_moe", "LFM2-MoE: sigmoid router; the block passes its expert_bias in for selection "
        "(use_expert_bias); its final norm is named embedding_norm",
        choice_bias="expert_bias", final_norm="embedding_norm"),
    # DeepSeek-V3's router
    *[_as(_DEEPSEEK_V3, t) for t in ("deepseek_v3", "deepseek_v32", "axk1", "axk2", "dots1", "dots3_note",
                                     "dots3_note_text", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "hy_v4",
                                     "inkling_text", "solar_open")],
    _as(_DEEPSEEK_V3, "nemotron_h", final_norm="norm_f"),
    _as(_DEEPSEEK_V3, "mimo_v2_flash", shared=None),
    _as(_DEEPSEEK_V3, "inkling2_text", "Inkling-2: score_fn (sigmoid or softmax) scores, selection on scores + "
        "e_score_correction_bias", scoring="score_fn (sigmoid or softmax)", shared=None),
    *[_as(_DEEPSEEK_V3, t, expert_count="num_experts") for t in ("exaone_moe", "laguna", "minimax_m3_vl_text")],
    *[_as(_DEEPSEEK_V3, t, expert_count="num_experts", expert_groups="num_expert_group")
      for t in ("kimi_linear", "bailing_hybrid")],
    _as(_DEEPSEEK_V3, "beam", expert_count="num_experts", shared=None),
    _as(_DEEPSEEK_V3, "kolibri1", "Kolibri-1: selection on the logits + e_score_correction_bias, sigmoid of the "
        "chosen logits only; on CUDA its logits come from torch.mm", expert_count="num_experts",
        logits_ops=("linear", "mm"),
        unavailable=((PROBS, "its router takes the sigmoid of the chosen logits only"),)),
    # the block scales each token by its expert's score before the experts run
    *[Quirk(t, "Llama-4: the router returns (scores, logits), scores the sigmoid of the top-k logits scattered "
            "over every expert (0 elsewhere); the experts take each token pre-scaled by its score and return "
            "their sum; a shared expert", output=(SCORES, LOGITS), scoring="sigmoid over the top-k",
            routes="router", expert_count="num_local_experts", shared="shared_expert",
            unavailable=((PROBS, "its router takes the sigmoid of the top-k logits only (the others score 0): "
                                 "there is no probability over every expert"),))
      for t in ("llama4", "llama4_text")],
    Quirk("deepseek_v4", "DeepSeek-V4: score_fn (sqrtsoftplus by default) of the router's logits, selection on "
          "scores + e_score_correction_bias, shared experts; its first layers' hash routers pick experts by a "
          "fixed token-id table (tid2eid) and are no routing layers; hyper-connections before the head",
          scoring="score_fn (sqrtsoftplus by default)", choice_bias="gate.e_score_correction_bias",
          expert_count="n_routed_experts", shared="shared_experts", static_routers=("DeepseekV4HashRouter",),
          final_norm=None,
          unavailable=((PROBS, "its scores are score_fn (sqrtsoftplus by default) of the logits, not probabilities "
                               "over every expert"),
                       ("resume", "its decoder layers carry hc_mult residual streams (hyper-connections), mixed by "
                                  "hc_head before the final norm"),
                       ("prune", "its hash layers' experts, picked by tid2eid, are no routing layers: pruning would "
                                 "not slice them"))),
    Quirk("doge", "Doge (cross-domain MoE): the MoE block is its own router; router_gate gives product-key "
          "logits [2, tokens, num_keys], a top-k over each half and over their sums picks among num_keys^2 experts "
          "(rows of down_embed / up_embed, used inline), softmax over the chosen; a shared MLP inline",
          output=("output", "product-key logits"), scoring="product keys, softmax over the top-k", routes="router",
          experts=None, expert_attr="num_keys", expert_power=2, expert_count=None,
          unavailable=((LOGITS, "its router gives product-key logits (two halves of num_keys each, mixed across "
                                "tokens by a view), not one logit per expert"),
                       (PROBS, "its softmax is over the chosen experts' scores only"),
                       ("prune", "its experts are indexed by product keys (num_keys^2 of them)"),
                       ("expert_outputs", "its experts are rows of down_embed / up_embed that the block uses inline"))),
    # JetMoE: attention experts too; its gatings select inside and return their gates sorted by expert
    Quirk("jetmoe", "JetMoE: a mixture of attention heads (each attention's query and output projections are "
          "experts, routed by their own top-k gating) as well as of MLP experts; each gating's linear gives the "
          "logits, a softmax over the top-k logits the gates, returned sorted by expert",
          output=(SLOTS, "token of each slot", GATES, "tokens per expert", LOGITS), scoring="softmax over the top-k",
          routes="router", experts=None, expert_count="num_local_experts", call_order=("self_attention", "mlp"),
          option_nouns=(("self_attention", "attention expert"),),
          unavailable=(*_TOPK_SOFTMAX,
                       ("prune", "its attention and MLP experts share num_local_experts, and its experts are the "
                                 "blocks' input_linear / output_linear, which pruning does not slice"),
                       ("expert_outputs", "its experts are the block's input_linear and output_linear around its "
                                          "activation (MLP) or its attention (MoA), not one module"))),
    # an MLP router: its last linear gives the logits
    Quirk("zaya", "ZAYA: an MLP router (down_proj plus the previous layer's router states, then norm, fc1, fc2, "
          "out_proj) whose last linear gives the logits over the experts and one skip class (no compute); "
          "softmax, selection on the probabilities + balancing_biases", scoring="MLP router",
          logits_weight="router_mlp.out_proj.weight", choice_bias="gate.balancing_biases", final_norm=None,
          last_options=("skip (no expert runs)",),
          output=(LOGITS, "weights", "indices", "router states"),
          unavailable=(("prune", "its router scores a skip class past the num_experts experts, which pruning by "
                                 "num_experts would not keep"),
                       ("resume", "its decoder layers hand the router states on to the next layer's router beside "
                                  "the residual stream, which a restart would take from the unablated run"))),
]}
QUIRKS["gemma4"] = _as(QUIRKS["gemma4_text"], "gemma4")


def quirk(model_type: str) -> Quirk:
    """The record for `model_type`: its own, or the generic one."""
    return QUIRKS.get(model_type) or replace(GENERIC, model_type=model_type)


# plain views of the records that callers read by type
REFUSED: dict[str, str] = {t: q.refused for t, q in QUIRKS.items() if q.refused}
LOGIT_MASK: dict[str, float] = {t: q.logit_mask for t, q in QUIRKS.items() if q.logit_mask != float("-inf")}
