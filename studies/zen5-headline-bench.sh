#!/usr/bin/env bash
# The README's headline benches on the Zen 5, alone on the machine: the shipped Zen 5 profiles at 2 threads and 1,
# two runs each, every peer in the same run; reports studies/zen5-smollm2-cpu-TAG-run-{a,b} and -TAG-1t-run-{a,b}.
#   SKIPSEARCH_LLAMA_SERVER=... bash studies/zen5-headline-bench.sh TAG
# TAG names the round: r32 (the panel kernel's wrapper at -Og), r33 (the kernel's steps without dynamo's bytecode).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:?usage: zen5-headline-bench.sh TAG}
: "${SKIPSEARCH_LLAMA_SERVER:?set SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp)}"
for run in a b; do
  for t in 2 1; do
    if [ "$t" = 2 ]; then
      P=profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml,studies/xeon-avx512/cpu-float32-mixed-xeon-panel-c8-vnni.yaml
      PEERS=hf-greedy,hf-compiled,hf-prompt-lookup,llama.cpp R=studies/zen5-smollm2-cpu-$TAG-run-$run
    else
      P=profiles/smollm2-135m/cpu-float32-mixed-1t-zen5-panel-c8.yaml,studies/xeon-avx512/cpu-float32-mixed-1t-xeon-panel-c8-vnni.yaml
      PEERS=hf-greedy,hf-compiled,llama.cpp R=studies/zen5-smollm2-cpu-$TAG-1t-run-$run
    fi
    .venv/bin/skipsearch bench --model smollm2-135m --profiles "$P" --peers "$PEERS" --dataset mtbench,humaneval \
      --split heldout --n-prompts 12 --max-new-tokens 96 --repeats 1 --sweep-prompts 2 --seed 0 --device cpu \
      --dtype float32 --threads "$t" --kernel panel-c8 --force --report "$R.md" --json-out "$R.json"
  done
done
