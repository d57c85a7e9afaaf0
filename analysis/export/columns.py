"""Column names of every analysis table, and the schema of the one export table.

Analyses return long ("tidy") DataFrames: one row per (token, layer, option) or coarser, with the
column names below, so a table can be filtered, pivoted or plotted without knowing which function
made it. Names are constants so they are typed once.

The export table (`EXPORT_SCHEMA`) is the same for every family; `KINDS` documents what `value`
means for each `kind`. `analysis.export.table_files` reads and writes it.
"""
from __future__ import annotations

# --- identifiers ------------------------------------------------------------------------------
BATCH = "batch"  # row of the traced batch
POSITION = "position"  # token position in the sequence as run (0-based)
LAYER = "layer"  # routing layer as in `model.routing_layers()` ("parallel.0", "paths", "blocks.2.dsff"),
# or the component of a per-layer value ("blocks.2.attn" for a GCLA beta, "blocks.2.atm" for ATM)
OPTION = "option"  # 0-based option of a routing layer (path / block / expert / stream / pathway)
LABEL = "label"  # human name of an option ("path 1", "combined", "swiglu", ...)
RANK = "rank"  # 0 = best of the top-k selection

# --- routing values ---------------------------------------------------------------------------
LOGIT = "logit"
PROB = "prob"  # noise-free softmax of the router logits
ARGMAX = "argmax"  # this option is the noise-free argmax
SELECTED = "selected"  # this option was used in the traced call (recorded choice / top-k)
STABILITY = "stability"  # fraction of seeded Gumbel samples agreeing with the noise-free argmax
N_SAMPLES = "n_samples"
WEIGHT = "weight"
COUNT = "count"
N_TOKENS = "n_tokens"
SHARE = "share"
OPTION_A = "option_a"
OPTION_B = "option_b"
COSINE = "cosine"
DOMINANT = "dominant"
NORM = "norm"  # L2 norm of an option's contribution to the layer output

# --- Wiola / PAGMLP ---------------------------------------------------------------------------
ADJACENT_COS = "adjacent_cos"  # cos(hidden_t, hidden_{t+1}); NaN at the last position
GROUP = "group"  # ATM merge group of a position (equal groups = merged)
PARTNER = "partner"  # position this token is merged with (NA if unmerged)
MERGED = "merged"
TAU = "tau"
N_PAIRS = "n_pairs"
MU = "mu"  # merge ratio: tokens removed by merging / T
FLOP_SAVING = "flop_saving"  # attention-FLOP saving 1 - (1 - mu)^2 = mu (2 - mu)
GATE_MEAN = "gate_mean"  # DSFF alpha (weight of stream A) averaged over the model dimension
ALPHA = "alpha"
BETA = "beta"
SCALE = "scale"  # PAGMLP pathway scale (alpha for SwiGLU, beta for GEGLU)
ACT_NORM = "act_norm"  # norm of the scaled pathway activation (before the down projection)
OUT_NORM = "out_norm"  # norm of the pathway's output contribution down[:, half] @ act

# --- probe prompts with expected routes (a family's `ProbeTable`) and their accuracy ------------
PROMPT_ID = "prompt_id"
DOMAIN = "domain"
EXPECTED_PATH = "expected_path"
PROMPT = "prompt"
ROUTE = "route"  # 1-based route like the paper: path j -> j, combined -> n_paths + 1
ROUTES = "routes"  # formatted "2>2>1", one route per parallel layer
PAPER_ROUTES = "paper_routes"
CORRECT = "correct"
SOURCE = "source"  # "ours" or "paper"
METRIC = "metric"
VALUE = "value"
PROBE_SET = "probe_set"  # accuracy tables: which probe file
ROUTE_AT = "route_at"  # ... and how a prompt's route was read (last token, majority, the paper's)

# --- effects and attribution ------------------------------------------------------------------
TOKEN_ID = "token_id"
KL = "kl"  # KL(base || ablated) of the next-token distributions, nats (float64, clamped at 0: never negative)
BASE_TOP = "base_top"
ABLATED_TOP = "ablated_top"
FLIPPED = "flipped"  # the top-1 token id changed and neither model has the two tied (effects.tie_tolerance)
BASE_PROB = "base_prob"  # probability of the base top-1 token under the base model
ABLATED_PROB = "ablated_prob"  # ... and under the ablated model
OP = "op"  # difflib alignment op: equal | replace | insert | delete
BASE_INDEX = "base_index"
ABLATED_INDEX = "ablated_index"
BASE_TOKEN_ID = "base_token_id"
ABLATED_TOKEN_ID = "ablated_token_id"
BASE_TOKEN = "base_token"
ABLATED_TOKEN = "ablated_token"
CHANGED = "changed"
ATTRIBUTION = "attribution"
METHOD = "method"
CONTRIBUTION = "contribution"
FULL_LOG_PROB = "full_log_prob"
REFERENCE_LOG_PROB = "reference_log_prob"

# --- the export table -------------------------------------------------------------------------
MODEL = "model"
FAMILY = "family"
TOKEN = "token"
PHASE = "phase"
SITE = "site"
KIND = "kind"
ABLATION = "ablation"
SEED = "seed"

PHASES = ("prompt", "generated")

# column -> pandas dtype. Integers and booleans are nullable: rows that describe a whole call
# (a learned weight, a GCLA beta) have no position, token or phase; kinds without options have no
# option; `selected` is NA where nothing is selected.
EXPORT_SCHEMA: dict[str, str] = {
    MODEL: "string",  # checkpoint name (directory name)
    FAMILY: "string",  # config family: papaformer, moep, pgpt, wiola, llama
    PROMPT_ID: "string",
    POSITION: "Int64",  # NA for per-call rows
    TOKEN: "string",  # decoded text of the token at `position` (NA for per-call rows)
    TOKEN_ID: "Int64",
    PHASE: "string",  # "prompt" | "generated" (NA for per-call rows)
    LAYER: "string",  # routing layer (parallel.1, moe_shrink, paths, blocks.3.dsff) or component (blocks.3.atm)
    SITE: "string",  # the recorded site the value was computed from
    KIND: "string",  # what `value` is; see KINDS
    OPTION: "Int64",  # 0-based option (NA where the kind has none)
    VALUE: "float64",
    SELECTED: "boolean",  # whether the option was used / dominant (NA where not applicable)
    ABLATION: "string",  # Ablation.describe() of the call, "none" if unablated
    SEED: "Int64",  # routing / sampling seed of the call
}
EXPORT_COLUMNS: tuple[str, ...] = tuple(EXPORT_SCHEMA)
TEXT_COLUMNS: tuple[str, ...] = tuple(c for c, t in EXPORT_SCHEMA.items() if t == "string")

# kind -> meaning of `value` (and of `option` / `selected`) in the export table
KINDS: dict[str, str] = {
    "prob": "router probability of the option (noise-free softmax of the logits); Gumbel routers "
            "(PaPaformer) and top-k routers (MoEP). selected = the option was used (Gumbel choice, "
            "or in the top-k).",
    "weight": "weight of the option in the layer output: MoEP renormalised top-k weight (selected options "
              "only, per token); ParallelGPT learned mixing weight (per call, position NA).",
    "cosine": "cosine similarity of the path/block output with the layer's combined output (PaPaformer, per "
              "token). selected = the dominant (highest-cosine) path.",
    "contribution": "norm share of the option's output contribution, ||c_j|| / sum_k ||c_k|| (ParallelGPT: "
                    "c_j = w_j * path_j; PAGMLP: c_j = down[:, half_j] @ act_j). selected = the largest.",
    "norm": "PAGMLP: L2 norm of the pathway's output contribution down[:, half_j] @ act_j (per token).",
    "gate_mean": "Wiola DSFF: option 0 = mean over dimensions of alpha (weight of stream A), option 1 = "
                 "1 - that (stream B), per token. selected = the stream with the larger mean weight.",
    "beta": "Wiola GCLA beta = sigmoid(phi) of a block (per call, option NA); PAGMLP beta = sigmoid(b), "
            "the GEGLU pathway scale (per call, option 1).",
    "alpha": "PAGMLP alpha = sigmoid(a), the SwiGLU pathway scale (per call, option 0).",
    "adjacent_cos": "Wiola ATM: cosine of the hidden states at position t and t + 1 (not for the last "
                    "position); only when the call merged tokens (--atm).",
    "merge": "Wiola ATM: merge group index of the position; selected = the token was merged with a "
             "neighbour.",
}
