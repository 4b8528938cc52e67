#!/usr/bin/env bash
# The int8 target's verify curve v(k) on panel-c8, two builds of the low-bit kernel alternating process by process,
# on one vector unit (AVX2 by default, so an AVX-512 machine times an AVX2 laptop's path too):
#   bash studies/int8-target/verify_ab.sh OLD_TREE NEW_TREE [ISA] [ROUNDS]
# Each tree is a checkout with .venv beside it; each run is `skipsearch costs --target-precision int8` with the
# product's path chosen first (lowbit.use_isa). Prints each run's step and v(1..9). Alone on the machine.
set -euo pipefail
old=$1 new=$2 isa=${3:-avx2} rounds=${4:-2}
out=$(mktemp -d)
lscpu | grep -E 'Model name|CPU family|^Model:' | tr -s ' '
for r in $(seq "$rounds"); do
  for tree in "$old" "$new"; do
    (cd / && PYTHONPATH=$tree "$tree/.venv/bin/python" -c "
import sys
from skipsearch.kernels.lowbit import use_isa
use_isa('$isa')
from skipsearch.__main__ import main
sys.argv = ['skipsearch', 'costs', '--model', 'smollm2-135m', '--target-precision', 'int8', '--kernel', 'panel-c8',
            '--threads', '2', '--out', '$out/costs.yaml', '--force']
main()" > "$out/log" 2>&1) || { tail -5 "$out/log"; exit 1; }
    PYTHONPATH=$tree "$tree/.venv/bin/python" -c "
import yaml
d = yaml.safe_load(open('$out/costs.yaml'))
c = d['costs']; print('$tree round $r', 'step', round(c['step_seconds'] * 1000, 3), 'ms, v(k)', c['verify_ratio'][:10])"
  done
done
