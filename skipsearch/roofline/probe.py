"""A short probe of this CPU for its roofline: memory bandwidth from large tensor copies, matrix throughput from
one large matrix product, and the cost of launching one small operation, all through the one timer
(``harness.time_interleaved``: interleaved rounds, medians after a warm-up).

It takes about a second at the default sizes. The figures are what this machine achieves now, at the torch
thread count set, so another process on the same cores lowers them: probe on a quiet machine, as for ``costs``.
"""

from __future__ import annotations

from dataclasses import dataclass

# A copy of 256 MiB reads and writes far more than any cache holds; a 1024 x 1024 product is long enough to
# reach a core's matrix rate and short enough to keep the probe near a second.
COPY_BYTES = 256 << 20
MATMUL_N = 1024


@dataclass(frozen=True)
class CpuFigures:
    bandwidth_gb_s: float  # bytes read + written per second by a large copy, 10^9
    tflops: float  # a square matrix product's FLOPs per second in ``dtype``, 10^12
    launch_us: float  # one tiny operation, start to end (the framework's per-operation cost)
    dtype: str
    threads: int
    repeats: int


def probe_cpu(*, dtype: str = "float32", repeats: int = 9, copy_bytes: int = COPY_BYTES,
              matmul_n: int = MATMUL_N) -> CpuFigures:
    """Measure this CPU's figures for a roofline (see the module docstring)."""
    import torch

    from skipsearch.engine.harness import time_interleaved

    dt = getattr(torch, dtype)
    src = torch.ones(max(copy_bytes // 4, 1), dtype=torch.float32)  # [N]
    dst = torch.empty_like(src)
    a = torch.ones(matmul_n, matmul_n, dtype=dt)  # [n, n]
    b = torch.ones(matmul_n, matmul_n, dtype=dt)
    one = torch.ones(1)

    def copy() -> None:
        dst.copy_(src)

    def matmul() -> None:
        torch.mm(a, b)

    def tiny() -> None:
        torch.add(one, one)

    med = {name: t.median for name, t in time_interleaved({"copy": copy, "matmul": matmul, "tiny": tiny},
                                                           rounds=repeats, device="cpu", warmup=2).items()}
    return CpuFigures(bandwidth_gb_s=2 * src.numel() * 4 / med["copy"] / 1e9,
                      tflops=2 * matmul_n**3 / med["matmul"] / 1e12, launch_us=med["tiny"] * 1e6, dtype=dtype,
                      threads=torch.get_num_threads(), repeats=repeats)


__all__ = ["COPY_BYTES", "MATMUL_N", "CpuFigures", "probe_cpu"]
