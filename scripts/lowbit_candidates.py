"""Low-bit weight-only kernels against fp32, on every linear of a model: whole-model ms, GB/s of weights, ratio.

For each linear of the model's config (per layer q, k, v, o, gate and up stacked as the precision draft
stacks them, down; and the LM head), random weights of that shape are held by each candidate, and one
product of M rows goes through all of them in turn, as a draft step does: the whole-model sum of its linears.
Every layer has its own weights, so a step streams all of them from memory, as decoding does.

Candidates: fp32 ``F.linear`` (MKL); MKL's product packed per batch size, as inductor's freezing runs an fp32
linear; this project's fp32 panel product (``skipsearch::f32_panel_linear``, the ``panel`` kernel's) and its
``skipsearch::int8_wo_linear`` and ``int4_wo_linear``
(fp32 activations; ``skipsearch.kernels.lowbit``), and its ``skipsearch::int8_dq_linear`` and ``int4_dq_linear``
(activations quantized to int8 per block, VNNI dot products where the CPU has them: ``csrc/dq.cpp``);
``aten._weight_int8pack_mm`` and
``aten._weight_int4pack_mm_for_cpu`` (group 32) with bf16 activations, the kernel alone (the casts a draft
of an fp32 model adds are left out); fbgemm's fp16-weight GEMM (the fp16 scheme's kernel).

Timing goes through the project's one timer (``skipsearch.engine.timing``): a warm-up round, then ``--repeats``
rounds in which every candidate runs once, interleaved, so that all see the same machine; the median is
kept. Ratios are to fp32 at the same rows and threads. GB/s counts the weight bytes each candidate holds
(packed weights, scales, zero points), not activations. The last column checks each candidate's outputs
against fp32's (relative error, the largest over the linears): quantization error, and a wrong set-up.

Usage: python scripts/lowbit_candidates.py --threads 1 2 --rows 1 8          (smollm2-135m's shapes)
       python scripts/lowbit_candidates.py --quick                           (tiny shapes: does it run)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from skipsearch.config import ConfigError
from skipsearch.engine import timing
from skipsearch.hardware import probe


@dataclass(frozen=True)
class Shapes:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    def linears(self, *, fuse_mlp: bool = True) -> list[tuple[int, int]]:
        """(out, in) of every linear a step runs, in order."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        mlp = [(2 * self.intermediate, self.hidden)] if fuse_mlp else [(self.intermediate, self.hidden)] * 2
        layer = [(q, self.hidden), (kv, self.hidden), (kv, self.hidden), (self.hidden, q), *mlp,
                 (self.hidden, self.intermediate)]
        return layer * self.layers + [(self.vocab, self.hidden)]


QUICK = Shapes(hidden=64, intermediate=160, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=256)  # N % 16: int4pack


def model_shapes(name: str) -> Shapes:
    from skipsearch.checkpoints import find_checkpoint
    from skipsearch.model.loader import read_config

    c = read_config(find_checkpoint(name))
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return Shapes(c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
                  c.num_key_value_heads, head_dim, c.vocab_size)


@dataclass
class Candidate:
    name: str
    calls: list[Callable[[dict[int, torch.Tensor]], torch.Tensor]]  # one per linear: inputs by width -> output
    bytes: int
    act: torch.dtype  # activation dtype it takes


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def build_candidates(weights: list[torch.Tensor]) -> tuple[list[Candidate], list[str]]:
    """Every candidate this machine can build, and one line for each it cannot."""
    from skipsearch.kernels.lowbit.quant import pack_int4, pack_int8, quantize_int4, quantize_int8

    out, refused = [], []

    def add(name: str, act: torch.dtype, make: Callable[[torch.Tensor], tuple[Callable, int]]) -> None:
        try:
            made = [make(w) for w in weights]
        except (ConfigError, RuntimeError) as exc:  # reported, not fatal
            refused.append(f"{name}: {str(exc).splitlines()[0][:200]}")
            return
        out.append(Candidate(name, [c for c, _ in made], sum(b for _, b in made), act))

    add("fp32 F.linear (MKL)", torch.float32,
        lambda w: ((lambda xs, w=w: F.linear(xs[w.shape[1]], w)), _nbytes(w)))

    def mkl_packed(w):  # what inductor's freezing runs for an fp32 linear on a CPU (packed per batch size)
        packed: dict[int, torch.Tensor] = {}

        def call(xs, w=w):
            x = xs[w.shape[1]]
            m = x.shape[0]
            if m not in packed:
                packed[m] = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
            return torch.ops.mkl._mkl_linear(x, packed[m], w, None, m)
        return call, _nbytes(w)

    def panel32(w):
        from skipsearch.kernels.lowbit import check_lowbit
        from skipsearch.kernels.lowbit.quant import pack_f32

        check_lowbit()
        p, n = pack_f32(w), w.shape[0]
        return (lambda xs: torch.ops.skipsearch.f32_panel_linear(xs[p.shape[1]], p, None, n)), _nbytes(p)

    if torch.backends.mkl.is_available():
        add("fp32 MKL packed per batch size (inductor's frozen linear)", torch.float32, mkl_packed)
    add("fp32 panels, ours (skipsearch::f32_panel_linear)", torch.float32, panel32)

    def ours8(w):
        from skipsearch.kernels.lowbit import check_lowbit

        check_lowbit()
        p, s = pack_int8(*quantize_int8(w))
        n = w.shape[0]
        return (lambda xs: torch.ops.skipsearch.int8_wo_linear(xs[p.shape[1]], p, s, None, n)), _nbytes(p, s)

    def ours4(w):
        from skipsearch.kernels.lowbit import check_lowbit

        check_lowbit()
        p, s = pack_int4(*quantize_int4(w, 32))
        n, k = w.shape
        return (lambda xs: torch.ops.skipsearch.int4_wo_linear(xs[k], p, s, None, n)), _nbytes(p, s)

    def ours8dq(w):
        from skipsearch.kernels.lowbit import check_lowbit
        from skipsearch.kernels.lowbit.quant import pack_int8_vnni

        check_lowbit()
        p, s = pack_int8_vnni(*quantize_int8(w))
        n, k = w.shape
        return (lambda xs: torch.ops.skipsearch.int8_dq_linear(xs[k], p, s, None, n)), _nbytes(p, s)

    def ours4dq(w):
        from skipsearch.kernels.lowbit import check_lowbit
        from skipsearch.kernels.lowbit.quant import pack_int4_vnni

        check_lowbit()
        p, s = pack_int4_vnni(*quantize_int4(w, 32))
        n, k = w.shape
        return (lambda xs: torch.ops.skipsearch.int4_dq_linear(xs[k], p, s, None, n)), _nbytes(p, s)

    def aten8(w):
        q, s = quantize_int8(w)
        s = s.to(torch.bfloat16)
        return (lambda xs: torch.ops.aten._weight_int8pack_mm(xs[q.shape[1]], q, s)), _nbytes(q, s)

    def aten4(w):
        q, s = quantize_int4(w, 32)  # (u - 8) * scale + zero, zero 0: the same symmetric weights
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu((q.to(torch.int32) + 8).contiguous(), 1)
        sz = torch.stack([s.T, torch.zeros_like(s.T)], dim=-1).to(torch.bfloat16).contiguous()  # [K/32, N, 2]
        k = w.shape[1]
        return (lambda xs: torch.ops.aten._weight_int4pack_mm_for_cpu(xs[k], packed, 32, sz)), _nbytes(packed, sz)

    def fp16(w):
        packed = torch.fbgemm_pack_gemm_matrix_fp16(w)
        k = w.shape[1]
        return (lambda xs: torch.fbgemm_linear_fp16_weight_fp32_activation(xs[k], packed, None)), 2 * w.numel()

    add("int8 weight-only, ours (skipsearch::int8_wo_linear)", torch.float32, ours8)
    add("int4 group-32, ours (skipsearch::int4_wo_linear)", torch.float32, ours4)
    add("int8, int8 activations per 32, ours (skipsearch::int8_dq_linear)", torch.float32, ours8dq)
    add("int4 group-32, int8 activations per group, ours (skipsearch::int4_dq_linear)", torch.float32, ours4dq)
    add("int8 aten._weight_int8pack_mm, bf16 activations", torch.bfloat16, aten8)
    add("int4 group-32 aten._weight_int4pack_mm_for_cpu, bf16 activations", torch.bfloat16, aten4)
    add("fp16 weights, fbgemm (the fp16 scheme)", torch.float32, fp16)
    return out, refused


def measure(cands: list[Candidate], widths: set[int], rows: int, repeats: int) -> dict[str, tuple[float, float]]:
    """name -> (median seconds of a whole-model step, largest relative error against fp32's outputs)."""
    xs32 = {k: torch.randn(rows, k) for k in widths}
    inputs = {c.name: {k: x.to(c.act) for k, x in xs32.items()} for c in cands}
    steps = {c.name: (lambda c=c: [call(inputs[c.name]) for call in c.calls]) for c in cands}
    ref = steps[cands[0].name]()
    errors = {}
    for c in cands:
        outs = steps[c.name]()
        errors[c.name] = max(float((o.float() - r).norm() / r.norm().clamp(min=1e-30))
                             for o, r in zip(outs, ref, strict=True))
        timing.time_call(steps[c.name], repeats=1, warmup=1)  # warm-up round
    seconds: dict[str, list[float]] = {c.name: [] for c in cands}
    for _ in range(repeats):  # interleaved: each round runs every candidate once
        for c in cands:
            t, _ = timing.time_call(steps[c.name], repeats=1, warmup=0)
            seconds[c.name].append(t.median)
    return {name: (statistics.median(s), errors[name]) for name, s in seconds.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="whose linear shapes (its config only; no weights)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--no-fuse-mlp", action="store_true", help="gate and up as two linears, not one stacked")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and 3 repeats: checks that it runs")
    a = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*fbgemm.*deprecated")  # torch's notice on every fbgemm fp16 call
    shapes = QUICK if a.quick else model_shapes(a.model)
    repeats = 3 if a.quick else a.repeats
    dims = shapes.linears(fuse_mlp=not a.no_fuse_mlp)
    torch.manual_seed(0)
    weights = [torch.randn(n, k) * 0.02 for n, k in dims]
    with torch.inference_mode():
        cands, refused = build_candidates(weights)
        try:
            from skipsearch.kernels.lowbit import dq_paths, isas

            path = f"{isas()[0]}, int8 activations on {dq_paths()[0]}"
        except ConfigError:
            path = "not built"
        print(f"# {'tiny shapes (--quick)' if a.quick else a.model}: {len(dims)} linears, "
              f"{sum(n * k for n, k in dims) / 1e6:.1f} M weights; {probe('cpu').describe()}; "
              f"torch {torch.__version__}; python {platform.python_version()}; our kernels' path: {path}; "
              f"median of {repeats} interleaved rounds")
        for line in refused:
            print(f"# not built: {line}")
        print("\n| threads | rows | kernel | ms | weight GB/s | vs fp32 | rel. error vs fp32 |")
        print("|---|---|---|---|---|---|---|")
        widths = {k for _, k in dims}
        for threads in a.threads:
            torch.set_num_threads(threads)
            for rows in a.rows:
                got = measure(cands, widths, rows, repeats)
                base = got[cands[0].name][0]
                for c in cands:
                    sec, err = got[c.name]
                    print(f"| {threads} | {rows} | {c.name} | {sec * 1e3:.3f} | {c.bytes / sec / 1e9:.1f} | "
                          f"{sec / base:.3f} | {err:.2g} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
