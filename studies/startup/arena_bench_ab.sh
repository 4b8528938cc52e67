#!/usr/bin/env bash
# Decoding speed with the panel copy's weights mapped from the kept file (NEW, this tree: kernels/lowbit/arena.py)
# against a fresh huge-page block filled in each process (OLD, a worktree of the commit before), alternated ROUNDS
# times, each a whole `bench` process of the shipped profile and our plain loop (HF greedy, which bench always runs, the only peer). Alone on the machine.
#   OLD=/tmp/wt OLD_CACHE=/tmp/cache_old bash studies/startup/arena_bench_ab.sh
OLD=${OLD:-/tmp/wt} NEW=${NEW:-$(cd "$(dirname "$0")/../.." && pwd)} ROUNDS=${ROUNDS:-2} OUT=${OUT:-/tmp/arena_ab}
P=profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml
mkdir -p "$OUT"
lscpu | grep -E "Model name|CPU family|^Model:"
for round in $(seq 1 "$ROUNDS"); do
  for tree in old new; do
    if [ $tree = old ]; then root=$OLD cache=${OLD_CACHE:-/tmp/cache_old}; else root=$NEW cache=$HOME/.cache/skipsearch; fi
    cd "$root"
    env SKIPSEARCH_CACHE="$cache" PYTHONPATH="$root" "$NEW/.venv/bin/python" -m skipsearch bench --model smollm2-135m \
      --profiles $P --peers hf-greedy --dataset mtbench,humaneval --split heldout --n-prompts 12 --max-new-tokens 96 \
      --repeats 1 --sweep-prompts 0 --seed 0 --device cpu --dtype float32 --threads 2 --kernel panel-c8 --force \
      --report "$OUT/$tree-$round.md" --json-out "$OUT/$tree-$round.json" >/dev/null 2>&1 || echo "$tree $round failed"
    "$NEW/.venv/bin/python" - "$OUT/$tree-$round.json" "$tree" "$round" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print(sys.argv[2], "round", sys.argv[3], "  ".join(f"{r['method']}: {r['tokens_per_s']:.1f} tok/s" for r in rows))
PY
  done
done
