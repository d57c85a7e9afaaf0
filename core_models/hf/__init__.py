"""Hugging Face transformers language models as a RouteScope family, on transformers' own classes.

The package, by concern: `config` (HFConfig), `quirks` (what differs by model type), `layout` (which
modules route), `instrument` (the wrapped forwards and ablation by watching ops), `model` (HFModel),
`resume` (prefix capture and resume), `prune` (pruning, checkpoint writing), `load` (directory
checks, device maps, the loader).

Nothing here re-implements a model: `HFModel` holds the `AutoModelForCausalLM` that transformers
builds from the checkpoint and instruments it by wrapping, once at load, the `forward` of each router,
experts module, shared expert, decoder layer and routing layer's attention (`instrument.Wrapped`: an
instance attribute that calls the module's own forward, holding the HFModel by a weak reference, so
deleting the HFModel frees it at once; `HFModel.detach()` gives the forwards back). A wrapper reads the call in progress
(`current()`: ablation) and the active trace (`active_trace()`) from the same
ContextVars as our own sites. Idle, it costs those ContextVar reads and one Python call; no
RouteScope hook sits on a module (a hook sends every call of its module down torch's slow path,
which cost about 2.5% of a tiny Mixtral's forward), and nothing per call ever lives on a module, so
one model serves every session. A wrapper can also skip a computation: a routing decoder layer's
attention returns a captured output when a ContextVar names it (`resume`, prefix reuse).

Which modules route is read from transformers itself, for every MoE model type it ships, at module
boundaries (`moe_layout`), and what differs by type from one named record per type (`quirks.Quirk`:
router output layout, scoring, selection bias, where experts per token and the expert count live,
shared experts, final norm), checked against the built model at load:
- the **router** of each MoE block is the innermost module of a class transformers records for
  `output_router_logits` (`_can_record_outputs["router_logits"]`, an `OutputRecorder`; JetMoE
  records its attention around its attention experts' gating); its module path is the routing
  layer's name (`model.layers.3.mlp.gate`, `...self_attention.experts.router`); a router class
  the record names static (DeepSeek-V4's hash routers: a fixed token-id table) makes no routing layer;
- the **experts** are the router's sibling `experts`, which every MoE block calls as
  `experts(hidden_states, top_k_index, top_k_weights)`, unless its record reads the routes at the
  router (`Quirk.routes`: the indices are the router's own top-k, the weights Llama-4's scores
  there (its experts take tokens pre-scaled by them) or JetMoE's gates put back in token order, or,
  Doge, the gather and softmax after its top-k over every expert); a block that calls them
  otherwise without such a record is refused in one line saying so, and a call without the indices
  and weights raises instead of passing unrecorded;
- a **shared expert** is the sibling its record names (its gate, where the record names one, is a site).

Each routing layer's roles and their sites (`HFRoutingLayer.roles`; shapes as recorded):
- `logits`  `<router>.logits`  [batch, pos, n] the router's output where its record's layout puts
  the logits (else, Gemma-4, its linear's result) (dropped experts -inf);
- `indices` `<router>.indices` [batch, pos, k] and `weights` `<router>.weights` [batch, pos, k]: the
  experts module's inputs, exactly what the block routed with;
- `probs`   `<router>.probs`   [batch, pos, n] the router's own probabilities: its output where the
  record's layout has them, else the first softmax or sigmoid the router applies to a tensor of its
  logits' shape. Where the record says a type has none (gpt-oss applies its softmax to the top-k
  logits only) the site stays empty and `HFRoutingLayer.unavailable["probs"]` says why.

Ablations go through the router's own code: a torch function mode, entered around the router's
forward by its wrapper (thread-local, like every function mode), sets the logits of dropped
experts to -inf as the router's linear returns them (the record's `logits_ops`; ZAYA's MLP router:
the linear of its `logits_weight`; Doge: the scores its top-k over every expert takes), and where the record
names a selection bias (DeepSeek-V3's `gate.e_score_correction_bias`, AFMoE's `expert_bias`, which its
block passes in, ...) sets the dropped experts' biased scores to -1e9 as the router adds it
(finite, so group sums stay ordered). The model's own selection and normalisation then pick the
next choices. Forcing expert e drops every other routed expert. A shared expert is the layer's last
option ("shared expert"): dropping it zeroes its output; it always runs otherwise, so it cannot be
forced.
"""
from __future__ import annotations

from .config import HFConfig, hf_param_count, is_hf_config
from .instrument import Prefix
from .layout import HFRoutingLayer, MoEBlock, UnsupportedMoE, moe_layout
from .load import check_hf_directory, load_hf
from . import quirks
from .model import HFModel, execution_device
from .quirks import LOGIT_MASK, REFUSED, Quirk, quirk

__all__ = ["LOGIT_MASK", "REFUSED", "HFConfig", "HFModel", "HFRoutingLayer", "MoEBlock", "Prefix", "Quirk",
           "UnsupportedMoE", "check_hf_directory", "execution_device", "hf_param_count", "is_hf_config", "load_hf",
           "moe_layout", "quirk", "quirks"]
