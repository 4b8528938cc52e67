"""Where a model goes and whether it fits: ``--device auto`` / ``--dtype auto``, and the memory check.

Both work from the checkpoint's config alone, before any weight is read, so a model that cannot
fit is refused in a second rather than OOM-killed half way through a 70B load.

- ``device auto``: CUDA when it is available (several visible GPUs: accelerate spreads the layers
  over all of them), else the CPU.
- ``dtype auto``: fp32 on the CPU, where half precision is slow and inexact; on a GPU the
  checkpoint's own dtype (its config's ``dtype``, formerly ``torch_dtype``), or a profile's when
  decoding with one, since its skip set was searched in that dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from skipsearch.checkpoints import ModelError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

DEFAULT_MAX_TOKENS = 4096  # KV cache sized for this many positions when the caller does not say
# Activations, the CUDA context and allocator slack, on top of weights and KV cache. Decoding one
# sequence keeps activations small; what this misses is the fragmentation of a nearly full device.
HEADROOM = 1.05
GIB = 1 << 30


@dataclass(frozen=True)
class Placement:
    """The device and dtype a model loads to, and why."""

    device: str  # "cpu", "cuda", "cuda:N", "mps", or "auto": accelerate spreads the layers over every visible GPU
    dtype: str  # a key of DTYPES
    reason: str  # one line: what was asked for and what decided it
    gpus: int = 0  # GPUs that hold the weights

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def describe(self) -> str:
        return f"{self.device} in {self.dtype} ({self.reason})"


def _gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def checkpoint_dtype(config) -> str | None:
    """The dtype a checkpoint's config declares (``dtype``; ``torch_dtype`` before transformers 4.56)."""
    value = getattr(config, "dtype", None) or getattr(config, "__dict__", {}).get("torch_dtype")
    return None if value is None else str(value).removeprefix("torch.")


def choose_placement(device: str = "auto", dtype: str = "auto", *, checkpoint: str | None = None,
                     profile: str | None = None) -> Placement:
    """Resolve ``device`` and ``dtype`` (either may be ``auto``). ``checkpoint``: the dtype the
    checkpoint declares; ``profile``: the dtype of a profile being decoded with, preferred by
    ``dtype auto`` on a GPU."""
    if dtype != "auto" and dtype not in DTYPES:
        raise ModelError(f"unknown dtype '{dtype}': use auto or one of {', '.join(DTYPES)}")
    n = _gpu_count()
    if device == "auto":
        if n > 1:
            device_why, resolved = f"device auto: {n} CUDA GPUs, layers spread over them", "auto"
        elif n == 1:
            device_why, resolved = "device auto: CUDA available", "cuda"
        else:
            device_why, resolved = "device auto: no CUDA device", "cpu"
    elif device in ("cpu", "mps") or device == "cuda" or device.startswith("cuda:"):
        resolved, device_why = device, f"device {device} as asked"
        if device.startswith("cuda"):
            index = device.partition(":")[2]
            if n == 0:
                raise ModelError(f"device '{device}' requested but CUDA is not available on this machine")
            if index and (not index.isdigit() or int(index) >= n):
                raise ModelError(f"device '{device}' requested but this machine has {n} CUDA device(s): cuda:0..")
    else:
        raise ModelError(f"unknown device '{device}': use auto, cpu, cuda, cuda:N or mps")
    gpus = n if resolved == "auto" else int(resolved.startswith("cuda"))

    if dtype != "auto":
        chosen, dtype_why = dtype, f"dtype {dtype} as asked"
    elif resolved == "cpu":
        chosen, dtype_why = "float32", "dtype auto: float32 on CPU"
    elif profile in DTYPES:
        chosen, dtype_why = profile, f"dtype auto: the profile's {profile}"
    elif checkpoint in DTYPES:
        chosen, dtype_why = checkpoint, f"dtype auto: the checkpoint's {checkpoint}"
    else:
        bf16 = resolved != "mps" and torch.cuda.is_bf16_supported()
        chosen = "bfloat16" if bf16 else "float16"
        dtype_why = f"dtype auto: the checkpoint declares {checkpoint or 'no dtype'}, {chosen} on this GPU"
    return Placement(resolved, chosen, f"{device_why}; {dtype_why}", gpus)


# -- the memory check ------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryNeed:
    """What a model needs in one dtype, from its config: weights plus the KV cache of one sequence."""

    dtype: str
    parameters: int
    weights: int  # bytes
    kv_cache: int  # bytes for max_tokens positions
    max_tokens: int
    draft: int = 0  # bytes of a draft's own copy of the weights (a precision draft's quantized sublayers and head)

    @property
    def total(self) -> int:
        return math.ceil((self.weights + self.kv_cache + self.draft) * HEADROOM)

    def describe(self) -> str:
        draft = f" + draft copy {self.draft / GIB:.1f} GiB" if self.draft else ""
        return (f"about {self.total / GIB:.1f} GiB in {self.dtype} (weights {self.weights / GIB:.1f} GiB + KV cache "
                f"{self.kv_cache / GIB:.1f} GiB for {self.max_tokens} tokens{draft}, +{HEADROOM - 1:.0%})")


def count_parameters(config) -> int:
    """Parameters of a Llama-style stack (llama, mistral, qwen2) in closed form, from its config."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or h // heads
    qkv_bias = config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
    o_bias = config.model_type != "qwen2" and bool(getattr(config, "attention_bias", False))
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h  # q, k, v, o
    attn += (heads * hd + 2 * kv * hd) * qkv_bias + h * o_bias
    mlp = 3 * h * inter + (2 * inter + h) * bool(getattr(config, "mlp_bias", False))  # gate, up, down
    embeddings = config.vocab_size * h * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return embeddings + layers * (attn + mlp + 2 * h) + h  # 2 norms per layer, 1 final norm


def estimate_memory(config, dtype: str, *, max_tokens: int = DEFAULT_MAX_TOKENS,
                    draft_bits: int | None = None) -> MemoryNeed:
    """Weights in ``dtype`` plus the KV cache of one sequence of ``max_tokens`` (prompt + new tokens), plus,
    with ``draft_bits``, a draft copy of the decoder layers and the LM head at that many bits per weight."""
    size = _BYTES[dtype]
    params = count_parameters(config)
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_cache = 2 * config.num_hidden_layers * kv * hd * size * max_tokens  # keys and values
    embedding = config.vocab_size * config.hidden_size
    copied = params - (embedding if getattr(config, "tie_word_embeddings", False) else 2 * embedding) + embedding
    draft = copied * draft_bits // 8 if draft_bits else 0  # decoder layers and head; embeddings and norms are shared
    return MemoryNeed(dtype, params, params * size, kv_cache, max_tokens, draft)


def free_memory(device: str) -> tuple[int, str] | None:
    """Bytes free where ``device`` puts the weights, and a phrase saying what they are; None
    where this cannot be known (mps, or a system without /proc/meminfo)."""
    if device == "cpu":
        ram = _mem_available()
        return None if ram is None else (ram, "available in RAM")
    if device == "auto":
        n = _gpu_count()
        return sum(torch.cuda.mem_get_info(i)[0] for i in range(n)), f"free on {n} GPUs together"
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or torch.cuda.current_device())
        return torch.cuda.mem_get_info(index)[0], f"free on cuda:{index}"
    return None


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


def check_memory(config, placement: Placement, *, max_tokens: int = DEFAULT_MAX_TOKENS,
                 label: str = "model", draft_bits: int | None = None) -> MemoryNeed:
    """Refuse, in one line, a model that cannot fit where ``placement`` puts it: both figures and
    what would fit instead (a smaller dtype, or ``--device auto`` over several GPUs)."""
    need = estimate_memory(config, placement.dtype, max_tokens=max_tokens, draft_bits=draft_bits)
    free = free_memory(placement.device)
    if free is None or need.total <= free[0]:
        return need
    options = []
    halves = [d for d in ("bfloat16", "float16") if _BYTES[d] < _BYTES[placement.dtype]]
    half = estimate_memory(config, halves[0], max_tokens=max_tokens, draft_bits=draft_bits) if halves else None
    if half is not None and half.total <= free[0]:
        options.append(f"--dtype {' or '.join(halves)} ({half.total / GIB:.1f} GiB)")
    n = _gpu_count()
    if n > 1 and placement.device != "auto":
        all_gpus = free_memory("auto")[0]
        for candidate in filter(None, (need, half)):
            if candidate.total <= all_gpus:
                dtype = "" if candidate is need else f" --dtype {candidate.dtype}"
                options.append(f"--device auto{dtype} over {n} GPUs ({all_gpus / GIB:.1f} GiB free)")
                break
    if options:
        fits = f"it would fit with {' or '.join(options)}"
    else:
        fits = "nothing on this machine fits it" + (f" (in {half.dtype}: {half.total / GIB:.1f} GiB)" if half else "")
    raise ModelError(f"{label} needs {need.describe()}, but only {free[0] / GIB:.1f} GiB is {free[1]}: {fits}")
