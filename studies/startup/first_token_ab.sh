#!/usr/bin/env bash
# time to the first token of a warm decode (graphs kept), the tree before a change (OLD, a worktree of the commit
# before it) and after it (NEW), alternated, ROUNDS times each; alone on the machine. The old tree reads a cache
# folder of its own for skipsearch's C++ extension (OLD_CACHE: its graphs and models linked to the user's), which
# is built from each tree's own source paths: one folder for both would build it again at every switch
OLD=${OLD:-/tmp/wt} NEW=${NEW:-$(cd "$(dirname "$0")/../.." && pwd)} ROUNDS=${ROUNDS:-4}
P=profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml
lscpu | grep -E "Model name|CPU family|^Model:"
for round in $(seq 1 "$ROUNDS"); do
  for tree in old new; do
    if [ $tree = old ]; then root=$OLD cache=${OLD_CACHE:-/tmp/cache_old}; else root=$NEW cache=$HOME/.cache/skipsearch; fi
    cd "$root"
    /usr/bin/time -f "$tree round $round: wall %e s" env SKIPSEARCH_CACHE="$cache" PYTHONPATH="$root" \
      "$NEW/.venv/bin/python" -m skipsearch \
      decode --profile $P --prompt "def fib(n):" --max-new-tokens 1 2>&1 | grep -E "wall|\.\.\. [0-9]+ s"
  done
done
