"""``cudagraph``: the whole model compiled by ``torch.compile`` for a CUDA GPU and replayed as CUDA graphs over a
static KV cache (inductor's ``triton.cudagraphs``, what ``mode="reduce-overhead"`` turns on).

Why: on a GPU a step of HF's eager forward is host launches from Python, not memory reads. The first GPU run
(``studies/gpu-h100.md``, an H100 in bf16) found every step of the 135M model costing 21-32 ms, about 300 times the
0.09 ms its weights take to read, so every draft token cost about a full step and no draft paid. A CUDA graph
launches a whole step's kernels at once: what is left is the GPU's own time.

Same graphs, cache and rules as ``inductor`` (``kernels/inductor.py``, whose ``CompiledBlocks`` runs it): a
one-token graph and a block of ``chunk`` tokens for every forward of the full model after the prompt, a graph per
draft (the model as it stands, its stand-ins swapped in), the cache's tensors static addresses the graphs read and
write in place, nothing recompiled while decoding. Three settings differ: no frozen weights and no max-autotune
(inductor's Triton code, not its CPU templates), CUDA graphs on, and every logits tensor copied out of the graph's
memory pool, which the next replay overwrites.

Lossless as every kernel is: fp32 output identical to eager, bf16 equal up to numerical ties; ``skipsearch costs``
checks the argmax of every timed block against eager's, and the GPU kit (``scripts/gpu_bench.sh``) compares greedy
output with HF's. Refused in one line before the model loads where no CUDA device is.

No torch at import until ``check`` (the registry parses ``--kernel`` before anything loads).
"""

from __future__ import annotations

from skipsearch.config import ConfigError
from skipsearch.kernels.base import Adapter, Kernel, KernelSpec
from skipsearch.kernels.inductor import CHUNKS, CompiledBlocks, static_cache_supported

DEFAULT_BLOCK = 8  # a verify of up to 8 tokens in one graph: on a GPU a block's cost grows little with its width

# inductor's settings for CUDA graphs (they replace the CPU kernels' frozen weights and autotuned GEMM templates)
SETTINGS = {"freezing": False, "max_autotune": False, "triton.cudagraphs": True}


def check(kernel: Kernel, device: str, instead: str) -> None:
    """Refuses in one line a device other than one CUDA GPU, a machine where CUDA is not available, an old
    transformers."""
    dev = device.split(":")[0]
    if dev not in ("cuda", "auto"):
        raise ConfigError(f"kernel {kernel.label} replays CUDA graphs and runs on a CUDA GPU only, not {device}: "
                          f"use {instead} here")
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"kernel {kernel.label} replays CUDA graphs, and this machine has no CUDA GPU that torch "
                          f"{torch.__version__} can use: use {instead} here")
    if dev == "auto" and torch.cuda.device_count() > 1:
        raise ConfigError(f"kernel {kernel.label} captures the whole model on one GPU: name it (--device cuda:0), "
                          f"or use {instead} for a model spread over {torch.cuda.device_count()} GPUs")
    if not static_cache_supported():
        import transformers

        raise ConfigError(f"kernel {kernel.label} needs a transformers whose StaticCache layers keep their own "
                          f"length (5.x); this is {transformers.__version__}: use {instead}")


def build(sm: Adapter, kernel: Kernel, capacity: int) -> CompiledBlocks:
    """Compile and capture the model for sequences of up to ``capacity`` positions (a minute or so, once per
    process: inductor's Triton kernels are kept in its on-disk cache for the next)."""
    return CompiledBlocks(sm, kernel, capacity=capacity + kernel.chunk, settings=SETTINGS, copy_out=True)


KERNEL = KernelSpec(
    name="cudagraph",
    summary="torch.compile for a CUDA GPU, each step, verify block and draft step replayed as a CUDA graph over a "
            "StaticCache",
    compiled=True,
    build=build,
    check=check,
    blocks=CHUNKS,
    default_block=DEFAULT_BLOCK,
)
