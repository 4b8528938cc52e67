"""Kernels: what runs the full model's forwards (plain steps and verifies), chosen per device and thread count.

A *kernel* is an implementation of the same fp32 (or bf16/fp16) forward, not another model: which one runs
changes the speed and, through rounding, nothing else that greedy decoding can see (checked, not assumed:
``skipsearch costs`` compares the argmax of every timed block with the eager kernel's, and the tests and
``bench`` compare every output with HF greedy).

- ``eager``: the HF modeling code in PyTorch eager mode over a ``DynamicCache``; matrix products go to
  whatever BLAS torch picks (MKL for fp32 on x86).
- ``inductor``: ``torch.compile`` of the whole model (TorchInductor with ``freezing`` and ``max_autotune``:
  weights frozen as constants, every linear offered to inductor's CPU GEMM templates and kept there where
  autotuning finds them faster) over a transformers ``StaticCache``. One graph of ``chunk`` tokens serves
  every forward of the full model that the decoder runs after the prompt: a forward over k tokens runs
  ceil(k / chunk) blocks, the last one padded, so plain steps, verifies of any length and the cost timing
  share it, and nothing recompiles while decoding (the shapes are fixed: the block and the cache's
  capacity). The prompt (any length) and every partial-model forward (a draft's) run eagerly on the same
  StaticCache, so drafts read and extend the full model's KV exactly as they do on a DynamicCache.

Why a block of ``chunk`` tokens and not one graph per verify length: each graph costs a minute or more of
compilation per thread count, and on the CPUs measured here a 4-token block costs about what a 1-token one
does while longer blocks fall off the templates' fast path (``studies/kernels-smollm2-cpu.md``).

Compilation happens once per process and thread count (the generated code has the thread count baked in).
Inductor's on-disk caches live under ``~/.cache/skipsearch/inductor/torch-<version>-<threads>t`` (C++
kernels and autotuning results are reused by the next process); the frozen fp32 graph itself is not cached
by torch 2.13 (its packed weights are MKL tensors, which its FX graph cache cannot pickle), so each process
pays the graph's tracing and lowering again: ``SkippableModel.kernel_report`` says how long.

No torch at import: the CLI validates ``--kernel`` before anything loads.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from skipsearch.config import ConfigError

KERNELS = ("eager", "inductor")
DEFAULT_CHUNK = 4
CHUNKS = (1, 2, 4, 8, 16)  # block sizes a compiled verify may use


@dataclass(frozen=True)
class Kernel:
    """A full-model forward implementation: ``eager``, or ``inductor`` in blocks of ``chunk`` tokens."""

    name: str = "eager"
    chunk: int = DEFAULT_CHUNK  # tokens per compiled block (inductor only)

    def __post_init__(self) -> None:
        if self.name not in KERNELS:
            raise ConfigError(f"unknown kernel {str(self.name)[:40]!r} (known: {', '.join(KERNELS)})")
        if self.chunk not in CHUNKS:
            raise ConfigError(f"kernel block must be one of {', '.join(map(str, CHUNKS))} tokens, got {self.chunk}")

    @property
    def compiled(self) -> bool:
        return self.name != "eager"

    @property
    def label(self) -> str:
        """How files and reports name it: ``eager`` or ``inductor-c4``."""
        return self.name if not self.compiled else f"{self.name}-c{self.chunk}"

    def __str__(self) -> str:
        return self.label


EAGER = Kernel()


def parse_kernel(text: str | Kernel | None) -> Kernel:
    """``eager``, ``inductor`` (block of DEFAULT_CHUNK) or ``inductor-c<N>``; one ConfigError line otherwise."""
    if isinstance(text, Kernel):
        return text
    if text is None or text == "":
        return EAGER
    m = re.fullmatch(r"([a-z]+)(?:-c(\d{1,3}))?", str(text).strip())
    if m is None:
        raise ConfigError(f"unknown kernel {str(text)[:40]!r} (known: eager, inductor, inductor-c<block>)")
    name, chunk = m.group(1), m.group(2)
    if chunk is not None and name == "eager":
        raise ConfigError("the eager kernel takes no block size")
    return Kernel(name, int(chunk) if chunk else DEFAULT_CHUNK)


def choose_kernel(option: str | None, recorded: str | None = None) -> Kernel:
    """The kernel a command runs: ``--kernel`` when given, else the one a profile records (``recorded``), else eager."""
    if option is not None and option != "":
        return parse_kernel(option)
    return parse_kernel(recorded) if recorded else EAGER


def cxx_compiler() -> str | None:
    """The C++ compiler inductor's CPU backend would call, if this machine has one (``CXX``, else g++/clang++)."""
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def check_kernel(kernel: Kernel, device: str, *, instead: str = "--kernel eager") -> None:
    """A one-line ConfigError unless ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``, ``mps``) can run
    ``kernel`` here; called before the model loads. ``instead`` is how the caller's user asks for eager."""
    if not kernel.compiled:
        return
    dev = "cuda" if device == "auto" else device.split(":")[0]  # auto: layers spread over the GPUs
    if dev != "cpu":
        raise ConfigError(f"kernel {kernel.label} is built and measured for CPUs only (no GPU was available to "
                          f"measure a compiled {dev} verify): use {instead} on {dev}")
    if cxx_compiler() is None:
        raise ConfigError(f"kernel {kernel.label} compiles C++ with inductor, and this machine has no C++ compiler "
                          f"(g++, clang++ or $CXX): install one, or use {instead}")
    if not static_cache_supported():
        import transformers

        raise ConfigError(f"kernel {kernel.label} needs a transformers whose StaticCache layers keep their own "
                          f"length (5.x); this is {transformers.__version__}: use {instead}")


def static_cache_supported() -> bool:
    """Whether the installed transformers' StaticCache layers track their length and crop by it, which the
    compiled kernel relies on to rewind a verify (StaticLayer.cumulative_length, transformers 5)."""
    try:
        from transformers.cache_utils import StaticLayer
    except ImportError:
        return False
    return "cumulative_length" in getattr(StaticLayer, "__annotations__", {}) and hasattr(StaticLayer, "crop")


def inductor_cache_dir(threads: int) -> Path:
    """Where inductor keeps its compiled C++ kernels and autotuning results for this torch and thread count."""
    import torch

    from skipsearch.checkpoints import cache_dir

    return cache_dir() / "inductor" / f"torch-{torch.__version__.replace('+', '-')}-{threads}t"


__all__ = ["CHUNKS", "DEFAULT_CHUNK", "EAGER", "KERNELS", "Kernel", "check_kernel", "choose_kernel", "cxx_compiler",
           "inductor_cache_dir", "parse_kernel", "static_cache_supported"]
