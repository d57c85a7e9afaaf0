#!/usr/bin/env bash
# Rebuild every shipped checkpoint in checkpoints/ (about 90 minutes on 2 quiet CPU cores;
# each run stops at a step boundary after --max-minutes).
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
common=(--tokenizer "$TOK" --batch-size 16 --seq-len 256 --eval-every 100 --max-minutes 8 --quiet)

train() {  # name preset data steps [extra...]
  local name=$1 preset=$2 data=$3 n; n=$(steps "$4"); shift 4
  [ -f "$OUT/$name/model.safetensors" ] && { echo "skip $name (exists)"; return; }
  echo "== $name"
  $RS train "$preset" --out "$OUT/$name" --data "$data" --steps "$n" "${common[@]}" "$@"
}

train path-story path story=1 700
train path-math path math=1 700
for comb in share_linear gumbel_v1 gumbel_v2; do
  name=papaformer-${comb//_/-}
  if [ ! -f "$OUT/$name/model.safetensors" ]; then
    $RS compose --paths "$OUT/path-story" "$OUT/path-math" --combiner "$comb" --out "$OUT/.composed-$comb"
    train "$name" "$name" story=0.5,math=0.5 300 --init-from "$OUT/.composed-$comb" --lr 1e-3
    rm -rf "$OUT/.composed-$comb"
  fi
done
train llama-dense llama-dense story=0.5,math=0.5 300
train pagmlp pagmlp story=0.5,math=0.5 300
train pgpt pgpt story=0.5,math=0.5 300
train moep moep story=0.5,math=0.5 250
train moep-swiglu moep-swiglu story=0.5,math=0.5 250
train wiola-tiny wiola-tiny story=0.5,math=0.5 200
