#!/usr/bin/env bash
# the README's "search your machine's own" command, cold (the converted model and the C++ extension kept, no graph, a new study),
# timed whole with no profiler, inductor's own cache empty too (TORCHINDUCTOR_CACHE_DIR); then the issue's decode of what it
# wrote, in a new process. Alone on the machine.
set -e
cd "$(dirname "$0")/../.."
rm -rf /tmp/cold && mkdir -p /tmp/cold && ln -s ~/.cache/skipsearch/models /tmp/cold/models && ln -s ~/.cache/skipsearch/lowbit /tmp/cold/lowbit
lscpu | grep -E "Model name|CPU family|^Model:"
date -u
/usr/bin/time -f "optimize wall %e s" env SKIPSEARCH_CACHE=/tmp/cold TORCHINDUCTOR_CACHE_DIR=/tmp/cold/inductor .venv/bin/skipsearch optimize --model smollm2-135m \
    --strategy hybrid --schemes int8,int4 --vocab-sizes 0 --dataset mtbench,humaneval --n-prompts 8 --max-new-tokens 96 \
    --max-k 8 --budget 600 --shortlist 3 --threads 2 --kernel panel-c8 --study /tmp/cold/study --out ${OUT:-/tmp/mine.yaml} --force 2>&1 \
    | grep -v "it/s\]"
/usr/bin/time -f "decode wall %e s" env SKIPSEARCH_CACHE=/tmp/cold TORCHINDUCTOR_CACHE_DIR=/tmp/cold/inductor .venv/bin/skipsearch decode --profile ${OUT:-/tmp/mine.yaml} \
    --prompt "def fib(n):" --max-new-tokens 96 --check 2>&1 | grep -v "it/s\]" | tail -5
