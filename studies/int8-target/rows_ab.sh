#!/usr/bin/env bash
# The int8 product at 1-13 rows on one vector unit, two builds of the kernel alternating process by process:
#   [ROWS="1 2 4 8 13"] bash studies/int8-target/rows_ab.sh OLD_TREE NEW_TREE [ISA] [ROUNDS] [WEIGHTS: int8, fp32,
#                                                                                         dq8 or dq4]
# Each tree is a checkout with .venv beside it (a worktree: git worktree add /tmp/wt-tile 475d3cc, then
# git -C /tmp/wt-tile apply studies/int8-target/avx2-tile.patch, which applies to that commit, before the AVX2 product
# ran in halves). Each build is compiled before the first timing.
set -euo pipefail
old=$1 new=$2 isa=${3:-avx2} rounds=${4:-4} weights=${5:-int8}
here=$(cd "$(dirname "$0")" && pwd)
lscpu | grep -E 'Model name|CPU family|^Model:' | tr -s ' '
for tree in "$old" "$new"; do
  PYTHONPATH=$tree "$tree/.venv/bin/python" -c "from skipsearch.kernels.lowbit import check_lowbit; check_lowbit()"
done
for r in $(seq "$rounds"); do
  for tree in "$old" "$new"; do
    PYTHONPATH=$tree "$tree/.venv/bin/python" "$here/rows_ab.py" --isa "$isa" --weights "$weights" ${ROWS:+--rows $ROWS} --label "$tree round $r"
  done
done
