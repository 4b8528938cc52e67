#!/bin/bash
# README command 1's search (without its bench), after and before the forty-seventh round's change to the cost
# model's rotations, alternated twice, each on a new study; alone on the machine. NEW and OLD are checkouts of 0bfaf34
# (the kernel's calls timed apart) and 89619aa (in one rotation with the eager steps), each with a .venv.
#   bash studies/search-gap/search_ab.sh NEW OLD OUTDIR
NEW=$1 OLD=$2 OUT=$3
for i in 1 2; do
  for side in new old; do
    if [ $side = new ]; then cd "$NEW"; else cd "$OLD"; fi
    rm -rf "$OUT/ab-study-$side-$i"
    echo "== $side run $i $(date -u +%H:%M:%S)"
    .venv/bin/skipsearch optimize --model smollm2-135m --strategy hybrid --schemes int8 --vocab-sizes 0 \
      --dataset mtbench,humaneval --n-prompts 4 --max-new-tokens 64 --max-k 8 --budget 120 --shortlist 2 --threads 2 \
      --kernel panel-c8 --study "$OUT/ab-study-$side-$i" --out "$OUT/ab-$side-$i.yaml" 2>&1 | grep -E "^timed|^ships"
  done
done
