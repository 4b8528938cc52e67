#!/usr/bin/env bash
# Re-planning the int8 target across machines (issue 64, item 3), alone on the machine:
#   bash studies/int8-target/replan.sh TAG        (TAG names this CPU, e.g. zen5)
# 1. the int8 target's cost file here, on panel-c2                     -> costs/cpu-float32-int8-TAG-panel-c2.yaml
# 2. the shipped Zen 3 int8 profile re-planned with it                 -> cpu-int8-zen3-replanned-TAG-panel-c2.yaml
# 3. bench, twice: the shipped profile, its re-plan and the profile searched here (cpu-int8-TAG-panel-c2.yaml,
#    run.sh), beside llama.cpp Q8_0 plain, 12 held-out prompts x 96 tokens -> moved-bench-TAG-run-{a,b}.{md,json,log}
# Needs SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp prints it).
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:?usage: replan.sh TAG}
HERE=studies/int8-target
COSTS=costs/cpu-float32-int8-$TAG-panel-c2.yaml
SHIPPED=profiles/smollm2-135m/cpu-int8-zen3-panel-c2.yaml
REPLANNED=$HERE/cpu-int8-zen3-replanned-$TAG-panel-c2.yaml
: "${SKIPSEARCH_LLAMA_SERVER:?set SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp)}"
lscpu | grep -E "Model name|CPU family|^Model:"
{ time .venv/bin/skipsearch costs --model smollm2-135m --target-precision int8 --kernel panel-c2 --threads 2 \
    --out "$COSTS" --force; } > "$HERE/replan-costs-$TAG.log" 2>&1
.venv/bin/skipsearch plan profile --profile "$SHIPPED" --costs "$COSTS" --out "$REPLANNED" --force \
    > "$HERE/replan-plan-$TAG.log" 2>&1
for run in a b; do
    .venv/bin/skipsearch bench --profiles "$SHIPPED,$REPLANNED,$HERE/cpu-int8-$TAG-panel-c2.yaml" \
        --target-precision int8 --peers llama.cpp --llama-settings plain --dataset mtbench,humaneval --split heldout \
        --n-prompts 12 --max-new-tokens 96 --threads 2 --kernel panel-c2 \
        --report "$HERE/moved-bench-$TAG-run-$run.md" --json-out "$HERE/moved-bench-$TAG-run-$run.json" \
        > "$HERE/moved-bench-$TAG-run-$run.log" 2>&1
done
echo "done: $COSTS, $REPLANNED, $HERE/moved-bench-$TAG-run-{a,b}.md"
