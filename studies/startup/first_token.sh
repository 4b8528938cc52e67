#!/usr/bin/env bash
# time to the first token of a warm decode (graphs kept): the tree before this change, three times, then after it, three
# times (not alternated: the two trees' C++ extension sources have other paths, so each switch rebuilds it); alone
P=profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml
lscpu | grep -E "Model name|CPU family|^Model:"
for tree in old new; do
  for round in 1 2 3 4; do
    if [ $tree = old ]; then root=/tmp/old; else root=/work/main; fi
    cd $root
    /usr/bin/time -f "$tree round $round: wall %e s" env PYTHONPATH=$root /work/main/.venv/bin/python -m skipsearch decode \
      --profile $P --prompt "def fib(n):" --max-new-tokens 1 2>&1 | grep -E "wall|\.\.\. [0-9]+ s"
  done
done
