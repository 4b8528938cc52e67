#!/usr/bin/env bash
# Issue 63's llama.cpp measurements on this machine, one after another, nothing else running (a quiet machine):
#   bash studies/llamacpp-engine/run.sh TAG [PROFILE]     (TAG names the CPU, e.g. zen5)
# 1. optimize --engine llama.cpp over the int8 profile of issue 64 (the model at Q8_0 as llama.cpp's target, what CPU
#    users run): every llama.cpp setting and the profile's own export, two passes, 8 calib prompts x 96 tokens
#    -> search-TAG.log and cpu-int8-TAG-llama.cpp.yaml (the profile with llama.cpp's record)
# 2. bench, twice: that profile in skipsearch (panel-c2) beside llama.cpp plain and its export (the setting llama.cpp
#    measured fastest), HF greedy over the int8 target, 12 held-out prompts x 96 tokens -> bench-TAG-run-{a,b}.*
# Needs SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp prints it).
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:?usage: run.sh TAG [PROFILE]}
BASE=${2:-studies/int8-target/cpu-int8-zen5-panel-c2.yaml}
HERE=studies/llamacpp-engine
PROFILE=$HERE/cpu-int8-$TAG-llama.cpp.yaml
: "${SKIPSEARCH_LLAMA_SERVER:?set SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp)}"
lscpu | grep -E "Model name|CPU family|^Model:" > "$HERE/cpu-$TAG.txt"
grep -o -w -E "avx2|avx512f|avx512_vnni|avx512_bf16|amx_tile" /proc/cpuinfo | sort -u >> "$HERE/cpu-$TAG.txt"

if [ ! -f "$PROFILE" ]; then
    { time .venv/bin/skipsearch optimize --engine llama.cpp --profile "$BASE" --dataset mtbench,humaneval \
        --n-prompts 8 --max-new-tokens 96 --threads 2 --out "$PROFILE"; } > "$HERE/search-$TAG.log" 2>&1
fi

for run in a b; do
    .venv/bin/skipsearch bench --profiles "$PROFILE" --target-precision int8 --peers hf-greedy,llama.cpp \
        --llama-settings plain,export --dataset mtbench,humaneval --split heldout --n-prompts 12 \
        --max-new-tokens 96 --threads 2 --sweep-prompts 0 \
        --report "$HERE/bench-$TAG-run-$run.md" --json-out "$HERE/bench-$TAG-run-$run.json" \
        > "$HERE/bench-$TAG-run-$run.log" 2>&1
done
echo "done: $PROFILE, $HERE/bench-$TAG-run-{a,b}.md"
