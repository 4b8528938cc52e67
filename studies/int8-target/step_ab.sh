#!/usr/bin/env bash
# The plain one-token step of both targets (step.py: the int8 and the fp32 target interleaved in one process, with
# the read bandwidth measured beside them), two trees alternating process by process, the order swapped every round:
#   bash studies/int8-target/step_ab.sh OLD_TREE NEW_TREE [ROUNDS] [KERNEL]
# Each tree is a checkout with .venv beside it (a worktree of the commit before a change). Alone on the machine.
set -euo pipefail
old=$1 new=$2 rounds=${3:-6} kernel=${4:-panel-c8}
here=$(cd "$(dirname "$0")" && pwd)
lscpu | grep -E 'Model name|CPU family|^Model:' | tr -s ' '
side() {
  (cd / && PYTHONPATH=$1 "$1/.venv/bin/python" "$here/step.py" --kernel "$kernel" 2>/dev/null) | "$1/.venv/bin/python" -c "
import json, sys
d = json.load(sys.stdin)
print(json.dumps({'tree': '$1', 'round': $2, 'bandwidth_gb_s': d['bandwidth_gb_s'], 'int8_step_ms': d['int8']['step_ms'],
                  'fp32_step_ms': d['native']['step_ms']}))"
}
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then side "$old" "$r"; side "$new" "$r"; else side "$new" "$r"; side "$old" "$r"; fi
done
