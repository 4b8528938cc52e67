#!/usr/bin/env bash
# Issue 64's measurements on this machine, one after another, nothing else running (a quiet machine):
#   bash studies/int8-target/run.sh TAG [KERNEL]      (TAG names the CPU, e.g. zen5; KERNEL default panel-c8)
# 1. the plain step of both targets against their memory time (step.py)         -> step-TAG.json
# 2. optimize --target-precision int8 (the README's hybrid search, int4 copies)   -> optimize-TAG.log and
#    studies/int8-target/cpu-int8-TAG-KERNEL.yaml
# 3. bench, twice: that profile, HF greedy and HF compiled over the int8 target, llama.cpp at Q8_0 plain and
#    speculative, 12 held-out prompts x 96 tokens                                -> bench-TAG-run-{a,b}.{md,json,log}
# Needs SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp prints it).
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:?usage: run.sh TAG [KERNEL]}
KERNEL=${2:-panel-c8}
HERE=studies/int8-target
PROFILE=$HERE/cpu-int8-$TAG-$KERNEL.yaml  # beside the evidence: profiles/ is what the suite checks one by one
: "${SKIPSEARCH_LLAMA_SERVER:?set SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp)}"
lscpu | grep -E "Model name|CPU family|^Model:" > "$HERE/cpu-$TAG.txt"
grep -o -w -E "avx2|avx512f|avx512_vnni|avx512_bf16|amx_tile" /proc/cpuinfo | sort -u >> "$HERE/cpu-$TAG.txt"

[ -f "$HERE/step-$TAG.json" ] || .venv/bin/python "$HERE/step.py" --kernel "$KERNEL" > "$HERE/step-$TAG.json"

if [ ! -f "$PROFILE" ]; then
    { time .venv/bin/skipsearch optimize --model smollm2-135m --strategy hybrid --target-precision int8 \
        --schemes int4 --vocab-sizes 0 --dataset mtbench,humaneval --n-prompts 4 --max-new-tokens 64 --max-k 8 \
        --budget 120 --shortlist 2 --threads 2 --kernel "$KERNEL" --study "$HERE/search-$TAG-$KERNEL" \
        --out "$PROFILE"; } > "$HERE/optimize-$TAG-$KERNEL.log" 2>&1
fi

for run in a b; do
    .venv/bin/skipsearch bench --profiles "$PROFILE" --target-precision int8 \
        --peers hf-greedy,hf-compiled,llama.cpp --dataset mtbench,humaneval --split heldout --n-prompts 12 \
        --max-new-tokens 96 --threads 2 --kernel "$KERNEL" \
        --llama-settings "plain,ngram 3/4,draft q4_0 n=4,ngram 3/4 + draft q4_0 n=4" \
        --report "$HERE/bench-$TAG-$KERNEL-run-$run.md" --json-out "$HERE/bench-$TAG-$KERNEL-run-$run.json" \
        > "$HERE/bench-$TAG-$KERNEL-run-$run.log" 2>&1
done
echo "done: $HERE/step-$TAG.json, $PROFILE, $HERE/bench-$TAG-$KERNEL-run-{a,b}.md"
