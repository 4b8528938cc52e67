#!/usr/bin/env bash
# The replay A/B (studies/replay-cpu.md), alone on the machine:   bash studies/replay/ab.sh BEFORE_TREE TAG
# BEFORE_TREE: a checkout of the commit before the change (git worktree add /tmp/before <rev>). Each side in its own
# process, alternating before/after three times (the first of each untimed: it builds or loads the calls), then
# two bench runs of the int8 profiles beside llama.cpp Q8_0, as studies/int8-target/og.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
BEFORE=${1:?usage: ab.sh BEFORE_TREE TAG}
TAG=${2:?usage: ab.sh BEFORE_TREE TAG}
HERE=studies/replay
: "${SKIPSEARCH_LLAMA_SERVER:?set SKIPSEARCH_LLAMA_SERVER (bash scripts/setup_engines.sh llama.cpp)}"
lscpu | grep -E "Model name|CPU family|^Model:"
side() { PYTHONPATH="$1" .venv/bin/python "$HERE/step_ab.py" panel-c2 "$2" 2>/dev/null; }
side "$BEFORE" 1 > /dev/null
side "$PWD" 1 > /dev/null
for i in 1 2 3; do
    if [ $((i % 2)) = 1 ]; then side "$BEFORE" 3; side "$PWD" 3; else side "$PWD" 3; side "$BEFORE" 3; fi
done > "$HERE/ab-$TAG.jsonl"
bash studies/int8-target/q8-bench.sh "$HERE/bench-int8-$TAG" "studies/int8-target/cpu-int8-$TAG-panel-c2.yaml"
echo "done: $HERE/ab-$TAG.jsonl, $HERE/bench-int8-$TAG-run-{a,b}.md"
