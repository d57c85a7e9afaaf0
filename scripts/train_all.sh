#!/usr/bin/env bash
# Rebuild every shipped checkpoint in checkpoints/ (about 2 hours on 2 quiet CPU cores;
# each run stops at a step boundary after MAX_MINUTES, default 8: raise it on a busy machine).
# Each run's exact command is recorded in its model card; STEPS_SCALE=0.1 makes a quick dry run.
set -euo pipefail
cd "$(dirname "$0")/.."
RS=${RS:-.venv/bin/routescope}
OUT=${OUT:-checkpoints}
SCALE=${STEPS_SCALE:-1}
steps() { python3 -c "print(max(10, int($1 * $SCALE)))"; }
mkdir -p "$OUT"
[ -f "$OUT/tokenizer.json" ] || $RS tokenizer --out "$OUT/tokenizer.json"
TOK="$OUT/tokenizer.json"
common=(--tokenizer "$TOK" --batch-size 16 --seq-len 256 --eval-every 100 --max-minutes "${MAX_MINUTES:-8}" --quiet)

train() {  # name preset data steps [extra...]
  local name=$1 preset=$2 data=$3 n; n=$(steps "$4"); shift 4
  [ -f "$OUT/$name/model.safetensors" ] && { echo "skip $name (exists)"; return; }
  echo "== $name"
  $RS train "$preset" --out "$OUT/$name" --data "$data" --steps "$n" "${common[@]}" "$@"
}

# step counts, never a wall-clock cap, so that the commands reproduce: the shipped path-math stopped at
# step 686 of its 700-step schedule (on the 10-minute cap it ran with), --stop-after keeps that
train path-story path story=1 700 --max-minutes 0
train path-math path math=1 700 --max-minutes 0 --stop-after 686
# PaPaformer: N = 3 parallel layers (the 3-layer paths), Share-Linear with the paper's k*d' -> d grow,
# Gumbel aux terms on pi with the paper's signs. Routing recipe (checkpoints/experiments/gumbel-routing.md):
# the Gumbel combiner starts as the reference's N(0, 0.02) init (a mean-of-paths start is a hedge the
# routers collapse onto); for the first WARM steps the paths are frozen and every token goes through
# its own domain's pre-trained path (story -> path 0, math -> path 1), the Gumbel routers learning that
# route by cross-entropy (route_target_lambda 1; not in the paper); then everything trains freely.
# A checkpoint made before that (its config differs from its preset, a Gumbel run whose history has
# no aux terms, or a run without the domain-route warm-up) is rebuilt.
papa_stale() {  # dir combiner -> status 0 if missing or stale
  [ -f "$1/model.safetensors" ] || return 0
  ${PY:-.venv/bin/python} - "$1" "$2" <<'PY'
import json, sys
from routescope.core_models.registry import PRESETS
from routescope.core_models.routers import AUX_ENTROPY
from routescope.core_models.training.compose import PRESETS as COMBINER_PRESET
ck, comb = sys.argv[1], sys.argv[2]
cfg = json.load(open(f"{ck}/config.json"))
history = json.load(open(f"{ck}/training.json")).get("history") or [{}]
changed = any(cfg.get(k) != v for k, v in PRESETS[COMBINER_PRESET[comb]][1].items())
old_aux = comb != "share_linear" and f"train_aux_{AUX_ENTROPY}" not in history[-1]
no_warmup = not json.load(open(f"{ck}/training.json"))["train"].get("domain_route_steps")
sys.exit(0 if changed or old_aux or no_warmup else 1)
PY
}
for comb in share_linear gumbel_v1 gumbel_v2; do
  name=papaformer-${comb//_/-}
  if papa_stale "$OUT/$name" "$comb"; then
    rm -rf "$OUT/$name"
    $RS compose --paths "$OUT/path-story" "$OUT/path-math" --combiner "$comb" --combiner-init normal \
      --out "$OUT/.composed-$comb"
    if [ "$comb" = share_linear ]; then warm=(200); else warm=(150 --set route_target_lambda=1.0); fi
    train "$name" "$name" story=0.5,math=0.5 600 --init-from "$OUT/.composed-$comb" --lr 1e-3 \
      --freeze 'parallel.*.paths.*' --freeze-for "$(steps "${warm[0]}")" --domain-routes story=0,math=1 \
      --domain-route-steps "$(steps "${warm[0]}")" "${warm[@]:1}" --max-minutes "${MAX_MINUTES:-20}"
    rm -rf "$OUT/.composed-$comb"
  fi
done
# PAGMLP and its SwiGLU baseline train the same way (PAGMLP §4: dropout 0.1 in both, set by the presets):
# the same steps and seed, and no time cap, so that neither stops earlier than the other
train llama-dense llama-dense story=0.5,math=0.5 300 --max-minutes 0
train pagmlp pagmlp story=0.5,math=0.5 300 --max-minutes 0
# GPT-2-style blocks (learned positions, LayerNorm, GELU: pgpt, moep) need more steps than llama-dense's
# RoPE blocks to reach its loss here (checkpoints/experiments/parallel-quality.md); wiola too
long=(--max-minutes "${MAX_MINUTES:-90}")
train pgpt pgpt story=0.5,math=0.5 600 "${long[@]}"
train moep moep story=0.5,math=0.5 1000 "${long[@]}"
train moep-swiglu moep-swiglu story=0.5,math=0.5 1000 "${long[@]}"
train wiola-tiny wiola-tiny story=0.5,math=0.5 600 "${long[@]}"
# standard MoE models with transformers' own classes (the `hf` extra), at moep's active parameters per token
train mixtral-tiny mixtral-tiny story=0.5,math=0.5 1000 "${long[@]}"
train olmoe-tiny olmoe-tiny story=0.5,math=0.5 1000 "${long[@]}"
