#!/usr/bin/env bash
# The README's "search your machine's own" command, cold (as search_cold.sh: the converted model and the C++ extension
# kept, no graph, inductor's cache empty, a new study), the tree before a change (OLD, a worktree of the commit before
# it) and after it (NEW), alternated ROUNDS times each; alone on the machine. Prints each search's wall time and what
# it shipped.
OLD=${OLD:-/tmp/wt} NEW=${NEW:-$(cd "$(dirname "$0")/../.." && pwd)} ROUNDS=${ROUNDS:-1}
lscpu | grep -E "Model name|CPU family|^Model:"
for round in $(seq 1 "$ROUNDS"); do
  for tree in old new; do
    if [ $tree = old ]; then root=$OLD; else root=$NEW; fi
    rm -rf /tmp/cold && mkdir -p /tmp/cold && ln -s ~/.cache/skipsearch/models /tmp/cold/models
    lowbit=$HOME/.cache/skipsearch/lowbit; [ $tree = old ] && lowbit=${OLD_CACHE:-/tmp/cache_old}/lowbit
    cp -r "$lowbit" /tmp/cold/lowbit  # each tree's C++ extension, built from its own source paths
    cd "$root"
    start=$(date +%s.%N)
    env SKIPSEARCH_CACHE=/tmp/cold TORCHINDUCTOR_CACHE_DIR=/tmp/cold/inductor PYTHONPATH="$root" \
      "$NEW/.venv/bin/python" -m skipsearch optimize --model smollm2-135m --strategy hybrid --schemes int8,int4 \
      --vocab-sizes 0 --dataset mtbench,humaneval --n-prompts 8 --max-new-tokens 96 --max-k 8 --budget 600 \
      --shortlist 3 --threads 2 --kernel panel-c8 --study /tmp/cold/study --out /tmp/cold/mine.yaml --force 2>&1 \
      | grep -E "^ships|compiling .* [0-9]+ s$"
    echo "$tree round $round: wall $(echo "$(date +%s.%N) - $start" | bc) s"
  done
done
