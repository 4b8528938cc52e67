"""The host's read bandwidth, sampled about every 2 s for a minute: the median of 10 sums of a 256 MB tensor at 2
threads. Alone on the machine.

    .venv/bin/python studies/search-gap/bandwidth_swing.py
"""

from __future__ import annotations

import statistics
import time

import torch


def main() -> None:
    torch.set_num_threads(2)
    a = torch.randn(256 * 1024 * 1024 // 4)
    t0 = time.time()
    while time.time() - t0 < 60:
        xs = []
        for _ in range(10):
            t = time.perf_counter()
            a.sum()
            xs.append(time.perf_counter() - t)
        print(f"{time.time() - t0:5.1f} s  {0.256 / statistics.median(xs):.1f} GB/s", flush=True)
        time.sleep(2)


if __name__ == "__main__":
    main()
