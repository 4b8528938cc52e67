#!/usr/bin/env bash
# the README's "search your machine's own", cold (models and the C++ extension kept, no graph), under cProfile: where its
# minutes go (read it with pstats, cumulative). Alone on the machine.
set -e
cd "$(dirname "$0")/../.."
rm -rf /tmp/cold && mkdir -p /tmp/cold && ln -s ~/.cache/skipsearch/models /tmp/cold/models && ln -s ~/.cache/skipsearch/lowbit /tmp/cold/lowbit
lscpu | grep -E "Model name|CPU family|^Model:"
/usr/bin/time -f "wall %e s" env SKIPSEARCH_CACHE=/tmp/cold PYTHONPATH=$PWD .venv/bin/python -m cProfile -o ${PROF:-/tmp/search.prof} -m skipsearch optimize --model smollm2-135m --strategy hybrid --schemes int8,int4 --vocab-sizes 0 \
    --dataset mtbench,humaneval --n-prompts 8 --max-new-tokens 96 --max-k 8 --budget 600 --shortlist 3 \
    --threads 2 --kernel panel-c8 --out ${OUT:-/tmp/mine.yaml} 2>&1 | grep -v "it/s\]" 
