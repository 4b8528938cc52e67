#!/usr/bin/env bash
# The panel kernel's wrapper at -Og (section 8 of studies/int8-target.md), alone on the machine:
#   bash studies/int8-target/og.sh TAG
# 1. wrapper_ab.py: -O0 against -Og in one process, 4 held-out prompts x 96 tokens x 4 rounds, int8 and fp32 targets
# 2. bench, twice: the int8 profiles on panel-c2 beside llama.cpp Q8_0 plain and n-gram 3/4, 12 prompts x 96 tokens
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:?usage: og.sh TAG}
HERE=studies/int8-target
: "${SKIPSEARCH_LLAMA_SERVER:?set SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp)}"
lscpu | grep -E "Model name|CPU family|^Model:"
for p in int8 native; do .venv/bin/python "$HERE/wrapper_ab.py" 2 "$p" O0,Og 2>/dev/null; done > "$HERE/og-ab-$TAG.json"
bash "$HERE/q8-bench.sh" "$HERE/og-bench-$TAG" "$HERE/cpu-int8-zen3-replanned-$TAG-panel-c2.yaml,$HERE/cpu-int8-$TAG-panel-c2.yaml"
echo "done: $HERE/og-ab-$TAG.json, $HERE/og-bench-$TAG-run-{a,b}.md"
