"""The int8 products' arithmetic alone: one MLP's weights (1536 x 576, four copies, 3.5 MB: in L2 and L3) through
the weight-only product (``skipsearch::int8_wo_linear``, the int8 target's) and the one with int8 activations
(``int8_dq_linear``, the precision drafts' on VNNI CPUs), at 1-8 rows, 2 threads; then the same products over 120
copies (106 MB, from memory). Median of 20 rounds after 3 warm-ups, the two products alternating by row count.

    .venv/bin/python studies/int8-target/in_cache.py          (alone on the machine)
"""

from __future__ import annotations

import statistics
import time

import torch


def main() -> None:
    from skipsearch.kernels.lowbit import check_lowbit
    from skipsearch.kernels.lowbit.quant import pack_int8, pack_int8_vnni, quantize_int8

    check_lowbit()
    torch.set_num_threads(2)
    n, k = 1536, 576
    ops = {"wo": (torch.ops.skipsearch.int8_wo_linear, pack_int8),
           "dq": (torch.ops.skipsearch.int8_dq_linear, pack_int8_vnni)}

    def per_call_us(name: str, copies: int, rows: int) -> float:
        op, pack = ops[name]
        packs = [pack(*quantize_int8(torch.randn(n, k) * 0.02)) for _ in range(copies)]
        x = torch.randn(rows, k)

        def run() -> None:
            for w, s in packs:
                op(x, w, s, None, n)
        for _ in range(3):
            run()
        seconds = []
        for _ in range(20):
            t = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - t)
        return statistics.median(seconds) / copies * 1e6

    print("| copies (MB) | rows | weight-only, us a call (GB/s) | int8 activations, us a call (GB/s) |")
    print("|---|---|---|---|")
    for copies, rows_list in ((4, (1, 2, 4, 8)), (120, (1, 4))):
        for rows in rows_list:
            cells = []
            for name in ops:
                us = per_call_us(name, copies, rows)
                cells.append(f"{us:.1f} ({n * k / us / 1e3:.1f})")
            print(f"| {copies} ({copies * n * k / 1e6:.0f}) | {rows} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
