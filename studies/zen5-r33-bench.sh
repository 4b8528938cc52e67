#!/usr/bin/env bash
# The README's headline benches again (thirty-third round, the kernel's steps without dynamo's bytecode), alone on the machine:
# the shipped Zen 5 profiles at 2 threads and 1, two runs each, every peer in the same run.
#   SKIPSEARCH_LLAMA_SERVER=... bash studies/zen5-r33-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${SKIPSEARCH_LLAMA_SERVER:?set SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp)}"
for run in a b; do
  for t in 2 1; do
    if [ "$t" = 2 ]; then
      P=profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml,studies/xeon-avx512/cpu-float32-mixed-xeon-panel-c8-vnni.yaml
      PEERS=hf-greedy,hf-compiled,hf-prompt-lookup,llama.cpp R=studies/zen5-smollm2-cpu-r33-run-$run
    else
      P=profiles/smollm2-135m/cpu-float32-mixed-1t-zen5-panel-c8.yaml,studies/xeon-avx512/cpu-float32-mixed-1t-xeon-panel-c8-vnni.yaml
      PEERS=hf-greedy,hf-compiled,llama.cpp R=studies/zen5-smollm2-cpu-r33-1t-run-$run
    fi
    .venv/bin/skipsearch bench --model smollm2-135m --profiles "$P" --peers "$PEERS" --dataset mtbench,humaneval \
      --split heldout --n-prompts 12 --max-new-tokens 96 --repeats 1 --sweep-prompts 2 --seed 0 --device cpu \
      --dtype float32 --threads "$t" --kernel panel-c8 --force --report "$R.md" --json-out "$R.json"
  done
done
