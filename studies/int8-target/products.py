"""Where the int8 target's step goes: its products alone against the whole step.

    .venv/bin/python studies/int8-target/products.py [--threads 2]

Times one step's products on one row, as the compiled step calls them (q, k, v as one product; gate and up as one;
o, down; the LM head), for the int8 target (``skipsearch::int8_wo_linear``) and the fp32 one
(``skipsearch::f32_panel_linear``), with smollm2-135m's shapes (30 layers, hidden 576, MLP 1536, 3 key/value heads
of 64, vocabulary 49152) and random weights (a product's time does not depend on the values). Each layer's weights
are distinct tensors, so a step streams them all from memory as the model's does. Median of 20 steps. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from skipsearch.kernels.lowbit import check_lowbit, isas
    from skipsearch.kernels.lowbit.quant import pack_f32, pack_int8, quantize_int8

    check_lowbit()
    hidden, mlp, kv, vocab, layers = 576, 1536, 192, 49152, 30
    shapes = [(hidden + 2 * kv, hidden), (hidden, hidden), (2 * mlp, hidden), (hidden, mlp)] * layers
    shapes.append((vocab, hidden))
    torch.manual_seed(0)
    int8, f32 = [], []
    for n, k in shapes:
        w = torch.randn(n, k) * 0.02
        int8.append((*pack_int8(*quantize_int8(w)), n, k))
        f32.append((pack_f32(w), n, k))
    x = {k: torch.randn(1, k) for k in (hidden, mlp)}

    def step_int8():
        for w, s, n, k in int8:
            torch.ops.skipsearch.int8_wo_linear(x[k], w, s, None, n)

    def step_f32():
        for w, n, k in f32:
            torch.ops.skipsearch.f32_panel_linear(x[k], w, None, n)

    out = {"threads": a.threads, "isa": isas()[0], "calls_per_step": len(shapes)}
    for name, fn, nbytes in (("int8", step_int8, sum(w.numel() + s.numel() * 4 for w, s, _, _ in int8)),
                             ("fp32", step_f32, sum(w.numel() * 4 for w, _, _ in f32))):
        fn()
        runs = []
        for _ in range(20):
            t = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t)
        ms = statistics.median(runs) * 1000
        out[name] = {"streamed_mb": round(nbytes / 1e6, 1), "products_ms": round(ms, 2),
                     "gb_s": round(nbytes / ms / 1e6, 1)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
