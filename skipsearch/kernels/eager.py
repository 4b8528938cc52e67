"""``eager``: the HF modeling code in PyTorch eager mode over a ``DynamicCache``; matrix products go to whatever BLAS
torch picks (MKL for fp32 on x86). It runs on every device and builds nothing: the adapter's own forwards are it."""

from __future__ import annotations

from skipsearch.kernels.base import KernelSpec

KERNEL = KernelSpec(
    name="eager",
    summary="HF's modeling code in PyTorch eager mode over a DynamicCache, on any device",
    compiled=False,
    build=lambda sm, kernel, capacity: None,  # no runner: SkippableModel.forward runs the HF model itself
)
