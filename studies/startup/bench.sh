#!/usr/bin/env bash
# $1: tree (old|new), $2: tag
tree=$1; tag=$2
if [ "$tree" = old ]; then root=/tmp/old; else root=/work/main; fi
cd $root
PYTHONPATH=$root /work/main/.venv/bin/python -m skipsearch bench --model smollm2-135m \
  --profiles profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml --peers hf-greedy,hf-compiled \
  --dataset mtbench,humaneval --split heldout --n-prompts 8 --max-new-tokens 96 --repeats 1 --sweep-prompts 0 \
  --seed 0 --device cpu --dtype float32 --threads 2 --kernel panel-c8 \
  --report /tmp/ab/$tag.md --json-out /tmp/ab/$tag.json > /tmp/ab/$tag.out 2> /tmp/ab/$tag.err
echo "exit $?" >> /tmp/ab/$tag.out
