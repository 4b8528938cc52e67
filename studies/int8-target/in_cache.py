"""The int8 products' arithmetic alone: one MLP's weights (1536 x 576, four copies, 3.5 MB: in L3) through the
weight-only product (``skipsearch::int8_wo_linear``, the int8 target's) and the one with int8 activations
(``int8_dq_linear``, the precision drafts' on VNNI CPUs), at 1-8 rows, 2 threads; then the same products over 120
copies (106 MB, from memory). Both products of a row count are timed together by the project's one harness
(``harness.time_interleaved``: 20 rounds, round robin, medians).

    .venv/bin/python studies/int8-target/in_cache.py          (alone on the machine)
"""

from __future__ import annotations

import torch


def calls(op, packs: list, x: torch.Tensor, n: int):
    """One pass of ``op`` over every copy's packed weights."""
    def run() -> None:
        for w, s in packs:
            op(x, w, s, None, n)
    return run


def main() -> None:
    from skipsearch.engine.harness import time_interleaved
    from skipsearch.kernels.lowbit import check_lowbit
    from skipsearch.kernels.lowbit.quant import pack_int8, pack_int8_vnni, quantize_int8

    check_lowbit()
    torch.set_num_threads(2)
    n, k = 1536, 576
    ops = {"wo": (torch.ops.skipsearch.int8_wo_linear, pack_int8),
           "dq": (torch.ops.skipsearch.int8_dq_linear, pack_int8_vnni)}

    print("| copies (MB) | rows | weight-only, us a call (GB/s) | int8 activations, us a call (GB/s) |")
    print("|---|---|---|---|")
    for copies, rows_list in ((4, (1, 2, 4, 8)), (120, (1, 4))):
        qs = [quantize_int8(torch.randn(n, k) * 0.02) for _ in range(copies)]
        packed = {name: [pack(*q) for q in qs] for name, (_, pack) in ops.items()}
        for rows in rows_list:
            x = torch.randn(rows, k)
            timed = time_interleaved({name: calls(op, packed[name], x, n) for name, (op, _) in ops.items()},
                                     rounds=20, warmup=3)
            us = {name: t.median / copies * 1e6 for name, t in timed.items()}
            cells = [f"{us[name]:.1f} ({n * k / us[name] / 1e3:.1f})" for name in ops]
            print(f"| {copies} ({copies * n * k / 1e6:.0f}) | {rows} | {cells[0]} | {cells[1]} |")

if __name__ == "__main__":
    main()
