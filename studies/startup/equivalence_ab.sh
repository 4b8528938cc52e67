#!/bin/bash
# the 16-bit real-model equivalence tests, the tree before (OLD) and after (NEW), alternated, alone
# OLD: a worktree of the commit before the change (640d721 here), NEW: the tree with it; ROUNDS: how many each
K="(test_real_model_layer_skip_in_16_bit_is_identical_or_equal_up_to_ties and bfloat16) or (test_real_model_every_shipped_method_in_bf16_is_never_different and (example or precision-chat-1t))"
lscpu | grep -E "Model name|CPU family|^Model:"
for round in $(seq 1 "${ROUNDS:-1}"); do
  for tree in old new; do
    root=${OLD:-/tmp/wt_old}; [ $tree = new ] && root=${NEW:-/work/main}
    cd $root
    PYTHONPATH=$root .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_equivalence.py -k "$K" --durations=0 2>&1 \
      | grep -E '^[0-9.]+s (call|setup)|passed|failed' | sed "s/^/$tree round $round: /"
  done
done
