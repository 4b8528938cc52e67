#!/usr/bin/env bash
# The test suite on a busy machine (issue 28): README command 2's tests, with a busy loop pinned to every core
# this shell may use running beside them the whole time. Tests assert behaviour, never speed, so they must pass
# here as on a quiet machine.
#
#   bash scripts/stress_suite.sh                 # README command 2: set up (if .venv is missing), then the tests
#   bash scripts/stress_suite.sh --setup         # set up first in any case (the whole README command 2)
#   bash scripts/stress_suite.sh tests/test_objective.py -x    # arguments go to pytest (after -q)
#
# The busy loops start after set-up (pip is not what is tested) and stop when the tests end, fail or are
# interrupted (Ctrl-C: exit 130). The last line gives pytest's exit code, the loops and the time taken.
set -euo pipefail
cd "$(dirname "$0")/.."

setup=0
if [[ "${1:-}" == "--setup" ]]; then
    setup=1
    shift
fi
if [[ $setup == 1 || ! -x .venv/bin/python ]]; then
    bash scripts/setup.sh --dev
fi

# the cores this shell may run on (its affinity), else all of them
cores=$(.venv/bin/python -c 'import os; print(*sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1))')
pin=""
command -v taskset >/dev/null && pin=yes

loops=()
stop_loops() {
    local pid
    for pid in ${loops[@]+"${loops[@]}"}; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in ${loops[@]+"${loops[@]}"}; do
        wait "$pid" 2>/dev/null || true
    done
    loops=()
}
trap stop_loops EXIT
trap 'stop_loops; exit 130' INT
trap 'stop_loops; exit 143' TERM

for core in $cores; do
    if [[ -n $pin ]]; then
        taskset -c "$core" sh -c 'while :; do :; done' &
    else
        sh -c 'while :; do :; done' &
    fi
    loops+=("$!")
done
n=${#loops[@]}
where="$n busy loop(s) on core(s) $(echo $cores | tr ' ' ,)${pin:+, pinned}"
echo "stress_suite: $where" >&2

start=$SECONDS
status=0
SKIPSEARCH_REQUIRE_POSTGRES=1 .venv/bin/python -m pytest -q "$@" || status=$?
stop_loops
echo "stress_suite: pytest exit $status after $((SECONDS - start)) s beside $where" >&2
exit "$status"
