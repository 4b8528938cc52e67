#!/usr/bin/env bash
# A first build: `decode` of the shipped profile with no graph and inductor's cache empty (the converted model and
# the C++ extension kept), the tree before a change (OLD, a worktree with its own C++ extension under OLD_CACHE) and
# this tree, alternated, ROUNDS times each; prints the build's own line and the command's wall time. Alone.
#   OLD=/tmp/wt_head OLD_CACHE=/tmp/cache_old ROUNDS=2 bash studies/startup/first_build_ab.sh
set -e
NEW=$(cd "$(dirname "$0")/../.." && pwd) OLD=${OLD:-/tmp/wt} ROUNDS=${ROUNDS:-2}
P=$NEW/profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml
lscpu | grep -E "Model name|CPU family|^Model:"
for round in $(seq 1 "$ROUNDS"); do
  for tree in old new; do
    if [ $tree = old ]; then root=$OLD lowbit=${OLD_CACHE:-/tmp/cache_old}/lowbit; else root=$NEW lowbit=$HOME/.cache/skipsearch/lowbit; fi
    rm -rf /tmp/cold && mkdir -p /tmp/cold && ln -s ~/.cache/skipsearch/models /tmp/cold/models && ln -s "$lowbit" /tmp/cold/lowbit
    start=$(date +%s.%N)
    (cd / && env SKIPSEARCH_CACHE=/tmp/cold TORCHINDUCTOR_CACHE_DIR=/tmp/cold/inductor PYTHONPATH="$root" \
      "$NEW/.venv/bin/python" -m skipsearch decode --profile "$P" --prompt "def fib(n):" --max-new-tokens 16 \
      --threads 2 2>&1 | grep -E "built or loaded" | cut -c1-150)
    echo "$tree round $round: wall $(echo "$(date +%s.%N) - $start" | bc) s"
  done
done
