#!/usr/bin/env bash
# Issue 63's vLLM measurements on this machine, one after another, nothing else running (a quiet machine):
#   bash studies/vllm-engine/run.sh TAG [PROFILE]     (TAG names the CPU, e.g. zen5)
# 1. optimize --engine vllm over the shipped fp32 profile: plain, vLLM's n-gram lookup 2-4 at K 2/4/6 and the
#    profile's own export (its nearest: the lookup alone), each in a server of its own, timed at 1, 2 and 4
#    requests in flight, two passes; the winner's K per concurrency checked as it would ship
#    -> search-TAG.log, PROFILE's stem-TAG-vllm.yaml (the profile with vLLM's record), search-TAG-logs/
# 2. bench, twice: the profile in skipsearch beside vLLM plain and vLLM with what the record ships, HF greedy,
#    HF compiled greedy and llama.cpp plain, 12 held-out prompts x 96 tokens -> bench-TAG-run-{a,b}.*
#    (llama.cpp needs SKIPSEARCH_LLAMA_SERVER; without it the report says so in one line)
# Needs SKIPSEARCH_VLLM_PYTHON (bash scripts/setup_engines.sh vllm prints it).
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:?usage: run.sh TAG [PROFILE]}
BASE=${2:-profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml}
HERE=studies/vllm-engine
PROFILE=$HERE/$(basename "$BASE" .yaml)-$TAG-vllm.yaml
: "${SKIPSEARCH_VLLM_PYTHON:?set SKIPSEARCH_VLLM_PYTHON (bash scripts/setup_engines.sh vllm)}"
lscpu | grep -E "Model name|CPU family|^Model:" > "$HERE/cpu-$TAG.txt"
grep -o -w -E "avx2|avx512f|avx512_vnni|avx512_bf16|amx_tile" /proc/cpuinfo | sort -u >> "$HERE/cpu-$TAG.txt"
"$SKIPSEARCH_VLLM_PYTHON" -c "import vllm; print('vllm', vllm.__version__)" >> "$HERE/cpu-$TAG.txt" 2>/dev/null

if [ ! -f "$PROFILE" ]; then
    { time .venv/bin/skipsearch optimize --engine vllm --profile "$BASE" --dataset mtbench,humaneval \
        --n-prompts 8 --max-new-tokens 64 --threads 2 --concurrency 1,2,4 --out "$PROFILE"; } \
        > "$HERE/search-$TAG.log" 2>&1
fi

[ "${SEARCH_ONLY:-0}" = 1 ] && exit 0
for run in a b; do
    .venv/bin/skipsearch bench --profiles "$PROFILE" --peers hf-greedy,hf-compiled,llama.cpp,vllm \
        --llama-settings plain --dataset mtbench,humaneval \
        --split heldout --n-prompts 12 --max-new-tokens 96 --threads 2 --sweep-prompts 0 \
        --report "$HERE/bench-$TAG-run-$run.md" --json-out "$HERE/bench-$TAG-run-$run.json" \
        > "$HERE/bench-$TAG-run-$run.log" 2>&1
done
echo "done: $PROFILE, $HERE/bench-$TAG-run-{a,b}.md"
