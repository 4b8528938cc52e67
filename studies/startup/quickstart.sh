#!/usr/bin/env bash
# README command 1 after setup (the venv exists), its graphs kept from earlier decodes on this machine; alone
cd /work/main
lscpu | grep -E "Model name|CPU family|^Model:"
rm -rf studies/quickstart profiles/smollm2-135m/quickstart.yaml
s=$(date +%s)
.venv/bin/skipsearch optimize --model smollm2-135m --strategy hybrid --schemes int8 --vocab-sizes 0 \
  --dataset mtbench,humaneval --n-prompts 4 --max-new-tokens 64 --max-k 8 --budget 120 --shortlist 2 --threads 2 \
  --kernel panel-c8 --study studies/quickstart --out profiles/smollm2-135m/quickstart.yaml 2>&1 | grep -v "it/s\]\|s/it\]"
m=$(date +%s); echo "optimize: $((m - s)) s"
.venv/bin/skipsearch bench --profiles profiles/smollm2-135m/quickstart.yaml --peers hf-greedy,hf-compiled \
  --dataset mtbench,humaneval --split heldout --n-prompts 4 --max-new-tokens 64 --threads 2 --sweep-prompts 0 \
  --kernel panel-c8 2>&1 | grep -v "it/s\]\|s/it\]"
e=$(date +%s); echo "bench: $((e - m)) s; both: $((e - s)) s"
