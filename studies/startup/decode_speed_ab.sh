#!/usr/bin/env bash
# Does a process-wide change move decoding speed? `bench` of the shipped profile and our plain loop (8 held-out
# prompts x 96 tokens, panel-c8, no peer), the tree before the change (OLD, a worktree with its own C++ extension
# under OLD_CACHE) and this tree, alternated, ROUNDS times each; prints each run's tokens/s rows. Alone on the machine.
#   OLD=/tmp/wt_head OLD_CACHE=/tmp/cache_old ROUNDS=2 bash studies/startup/decode_speed_ab.sh
set -e
NEW=$(cd "$(dirname "$0")/../.." && pwd) OLD=${OLD:-/tmp/wt} ROUNDS=${ROUNDS:-2}
P=$NEW/profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml
lscpu | grep -E "Model name|CPU family|^Model:"
for round in $(seq 1 "$ROUNDS"); do
  for tree in old new; do
    if [ $tree = old ]; then root=$OLD cache=${OLD_CACHE:-/tmp/cache_old}; else root=$NEW cache=$HOME/.cache/skipsearch; fi
    echo "== $tree round $round"
    (cd / && env SKIPSEARCH_CACHE="$cache" PYTHONPATH="$root" "$NEW/.venv/bin/python" -m skipsearch bench \
      --profiles "$P" --peers "" --dataset mtbench,humaneval --split heldout --n-prompts 8 --max-new-tokens 96 \
      --threads 2 --sweep-prompts 0 --kernel panel-c8 --json-out /tmp/decode_speed_$tree$round.json --force >/dev/null 2>&1)
    "$NEW/.venv/bin/python" -c "
import json, sys
rows = json.load(open('/tmp/decode_speed_$tree$round.json'))['rows']
for r in rows:
    print(f\"  {r['method']:<22} {r['tokens_per_s']:7.1f} tokens/s  identical {r.get('identical')}\")"
  done
done
