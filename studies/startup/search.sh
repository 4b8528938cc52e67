cd /work/main
/usr/bin/time -f "optimize wall %e s" .venv/bin/skipsearch optimize --model smollm2-135m --strategy hybrid --schemes int8,int4 --vocab-sizes 0 \
    --dataset mtbench,humaneval --n-prompts 8 --max-new-tokens 96 --max-k 8 --budget 600 --shortlist 3 \
    --threads 2 --kernel panel-c8 --out /tmp/ab/mine.yaml --force > /tmp/ab/search.out 2> /tmp/ab/search.err
/usr/bin/time -f "decode wall %e s" .venv/bin/skipsearch decode --profile /tmp/ab/mine.yaml --prompt "def fib(n):" --max-new-tokens 96 --check > /tmp/ab/mine-decode.out 2> /tmp/ab/mine-decode.err
echo done >> /tmp/ab/search.err
