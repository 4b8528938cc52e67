#!/usr/bin/env bash
# a first build on this machine (every kept graph cleared; skipsearch's C++ extension kept), then a second process; alone
cd /work/main
P=profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml
lscpu | grep -E "Model name|CPU family|^Model:"
rm -rf ~/.cache/skipsearch/graphs ~/.cache/skipsearch/inductor
for tag in cold warm; do
  /usr/bin/time -f "$tag: wall %e s" .venv/bin/python -m skipsearch decode --profile $P --prompt "def fib(n):" \
     --max-new-tokens 96 --check 2>&1 | grep -v "it/s\]" | grep -E "wall|\.\.\. [0-9]+ s|tok/s|check"
done
