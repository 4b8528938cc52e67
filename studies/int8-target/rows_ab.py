"""The int8 target's products at the rows a verify block runs, on one vector unit: what a step's products cost at
1, 2, 4, 8 and 13 rows, relative to one row.

    .venv/bin/python studies/int8-target/rows_ab.py --isa avx2 [--threads 2 --rounds 15]

One step's products as the compiled step calls them (q, k, v as one product; gate and up as one; o, down; the LM
head) through ``skipsearch::int8_wo_linear`` (``--weights fp32``: the fp32 panels' ``f32_panel_linear``, the ``panel``
kernel's), smollm2-135m's shapes, random weights, each layer's its own tensors
(a step streams them all from memory). Each row count is one call of ``harness.time_interleaved`` (the project's
one timer: every row count once a round, order rotated, medians). ``--isa`` picks the compiled vector unit
(``lowbit.use_isa``), so an AVX-512 machine can time its AVX2 path too; ``--weights dq8`` or ``dq4`` times the
precision drafts' int8 and int4 products with int8 activations instead (``skipsearch::int8_dq_linear``,
``int4_dq_linear``: VNNI where the CPU has it, whatever ``--isa`` says). Prints one JSON line. Run it from two trees
(``rows_ab.sh`` beside it) to compare two builds of the kernel.
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--isa", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 13])
    p.add_argument("--label", default="")
    p.add_argument("--weights", choices=("int8", "fp32", "dq8", "dq4"), default="int8",
                   help="the int8 target's products, the fp32 panels the panel kernel runs, or the precision drafts' "
                        "int8 / int4 products with int8 activations")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from skipsearch.engine.harness import time_interleaved
    from skipsearch.kernels.lowbit import check_lowbit, isas, use_isa
    from skipsearch.kernels.lowbit.quant import (
        pack_f32,
        pack_int4_vnni,
        pack_int8,
        pack_int8_vnni,
        quantize_int4,
        quantize_int8,
    )

    check_lowbit()
    if a.isa:
        use_isa(a.isa)
    hidden, mlp, kv, vocab, layers = 576, 1536, 192, 49152, 30
    shapes = [(hidden + 2 * kv, hidden), (hidden, hidden), (2 * mlp, hidden), (hidden, mlp)] * layers
    shapes.append((vocab, hidden))
    torch.manual_seed(0)
    ops = torch.ops.skipsearch
    op, pack = {"int8": (ops.int8_wo_linear, lambda w: pack_int8(*quantize_int8(w))),
                "fp32": (lambda x, w, s, b, n: ops.f32_panel_linear(x, w, b, n), lambda w: (pack_f32(w), None)),
                "dq8": (ops.int8_dq_linear, lambda w: pack_int8_vnni(*quantize_int8(w))),
                "dq4": (ops.int4_dq_linear, lambda w: pack_int4_vnni(*quantize_int4(w, 32)))}[a.weights]
    weights = [(*pack(torch.randn(n, k) * 0.02), n, k) for n, k in shapes]
    xs = {m: {k: torch.randn(m, k) for k in (hidden, mlp)} for m in a.rows}

    def step(m: int):
        def run() -> None:
            with torch.inference_mode():
                for w, s, n, k in weights:
                    op(xs[m][k], w, s, None, n)
        return run

    med = {m: t.median * 1000 for m, t in time_interleaved({m: step(m) for m in a.rows}, rounds=a.rounds).items()}
    print(json.dumps({"label": a.label, "isa": a.isa or isas()[0], "weights": a.weights, "threads": a.threads,
                      "ms": {str(m): round(v, 3) for m, v in med.items()},
                      "vs_one_row": {str(m): round(v / med[a.rows[0]], 3) for m, v in med.items()}}))


if __name__ == "__main__":
    main()
