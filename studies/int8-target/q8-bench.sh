#!/usr/bin/env bash
# Two bench runs of int8-target profiles on panel-c2 beside HF greedy and llama.cpp Q8_0 (plain and n-gram 3/4),
# 12 held-out prompts x 96 tokens, alone on the machine: PREFIX-run-{a,b}.{md,json,log}.
#   bash studies/int8-target/q8-bench.sh PREFIX PROFILE[,PROFILE...]      (used by og.sh and studies/replay/ab.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=${1:?usage: q8-bench.sh PREFIX PROFILES}
PROFILES=${2:?usage: q8-bench.sh PREFIX PROFILES}
: "${SKIPSEARCH_LLAMA_SERVER:?set SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp)}"
for run in a b; do
    .venv/bin/skipsearch bench --profiles "$PROFILES" \
        --target-precision int8 --peers hf-greedy,llama.cpp --llama-settings "plain,ngram 3/4" --dataset mtbench,humaneval \
        --split heldout --n-prompts 12 --max-new-tokens 96 --threads 2 --kernel panel-c2 \
        --report "$PREFIX-run-$run.md" --json-out "$PREFIX-run-$run.json" > "$PREFIX-run-$run.log" 2>&1
done
