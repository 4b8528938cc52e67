"""The int8-activation products (``skipsearch::int8_dq_linear``, ``int4_dq_linear``: ``kernels/lowbit/csrc/dq.cpp``):
each path this build has (AVX-512 VNNI, plain C++) against a reference computed here from the same quantized
activations, the paths against each other bit for bit, refusals, the modules and the scheme's choice of them.

The reference quantizes each row's blocks as the op documents (s = max|x| / 127, round half to even of x * (1 / s),
clamped to [-127, 127]), sums the integer products exactly (int64) and applies the scales in fp64. The op's only
roundings are one fp32 FMA per block and the epilogue's scale and bias, so each output is checked within
2 (blocks + 2) eps32 times the sum of its blocks' magnitudes, + 1e-6.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from skipsearch.config import ConfigError
from skipsearch.kernels.lowbit import build, check_lowbit
from skipsearch.kernels.lowbit.quant import pack_int4_vnni, pack_int8_vnni, quantize_int4, quantize_int8

ROWS = (1, 2, 5, 6, 7, 8, 13)  # one pass of up to 6 rows, and 7 -> 4 + 3, 13 -> 5 + 4 + 4
SHAPES8 = ((33, 64), (1, 32), (65, 96), (32, 576))  # (N, K): N below one panel of 32, one past it, odd
SHAPES4 = ((33, 64, 32), (1, 32, 8), (65, 96, 16), (31, 576, 32))  # (N, K, group)


def _built_or_skip() -> None:
    try:
        check_lowbit()
    except ConfigError as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=["avx512-vnni", "scalar"])
def path(request):
    """Run the test on one compiled path (skipped where this build has none), then restore the default."""
    _built_or_skip()
    if request.param not in build.dq_paths():
        pytest.skip(f"this build has no {request.param} path (it has {', '.join(build.dq_paths())})")
    before = build.use_dq_path(request.param)
    yield request.param
    build.use_dq_path(before)


def _quantized(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq [M, K / block, block] int64, s [M, K / block, 1] fp32), as the op quantizes."""
    xb = x.reshape(x.shape[0], -1, block)
    s = xb.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(s > 0, 1 / s, torch.zeros_like(s))
    return torch.round(xb * inv).clamp(-127, 127).long(), s


def _check(y: torch.Tensor, terms: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> None:
    """``terms`` [M, N, blocks] fp64: each block's scaled exact sum; y = sum over blocks (* scale) (+ bias)."""
    ref = terms.sum(-1) * (1 if scale is None else scale.double()) + (0 if bias is None else bias.double())
    mag = terms.abs().sum(-1) * (1 if scale is None else scale.double().abs())
    bound = 2 * (terms.shape[-1] + 2) * torch.finfo(torch.float32).eps * mag + 1e-6
    assert y.dtype is torch.float32 and y.shape == ref.shape
    err = (y.double() - ref).abs()
    assert (err <= bound).all(), f"max error {err.max().item():.3g}"


def _int8_terms(x, q, block=32):
    xq, s = _quantized(x, block)  # [M, B, block], [M, B, 1]
    qb = q.long().reshape(q.shape[0], -1, block)  # [N, B, block]
    d = torch.einsum("mbk,nbk->mnb", xq, qb)  # exact integer sums
    return d.double() * s.double().squeeze(-1)[:, None, :]


def _int4_terms(x, q, scales, group):
    xq, s = _quantized(x, group)
    qb = q.long().reshape(q.shape[0], -1, group)
    d = torch.einsum("mgk,ngk->mng", xq, qb)
    return d.double() * s.double().squeeze(-1)[:, None, :] * scales.double()[None]


@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_dq_op_matches_the_reference(path, with_bias):
    gen = torch.Generator().manual_seed(0)
    for n, k in SHAPES8:
        q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
        scale = torch.rand(n, generator=gen) * 0.01 + 1e-4
        bias = torch.randn(n, generator=gen) if with_bias else None
        w, s = pack_int8_vnni(q, scale)
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            y = torch.ops.skipsearch.int8_dq_linear(x, w, s, bias, n)
            _check(y, _int8_terms(x, q), scale, bias)


@pytest.mark.parametrize("with_bias", [False, True])
def test_int4_dq_op_matches_the_reference(path, with_bias):
    gen = torch.Generator().manual_seed(1)
    for n, k, group in SHAPES4:
        q = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
        scales = torch.rand(n, k // group, generator=gen) * 0.1 + 1e-3
        bias = torch.randn(n, generator=gen) if with_bias else None
        w, s = pack_int4_vnni(q, scales)
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            y = torch.ops.skipsearch.int4_dq_linear(x, w, s, bias, n)
            _check(y, _int4_terms(x, q, scales, group), None, bias)


def test_the_vnni_path_equals_plain_cpp_bit_for_bit():
    _built_or_skip()
    if "avx512-vnni" not in build.dq_paths():
        pytest.skip("this CPU has no AVX-512 VNNI")
    gen = torch.Generator().manual_seed(2)
    q8 = torch.randint(-128, 128, (70, 576), generator=gen, dtype=torch.int8)
    q4 = torch.randint(-8, 8, (70, 576), generator=gen, dtype=torch.int8)
    w8, s8 = pack_int8_vnni(q8, torch.rand(70, generator=gen) + 0.01)
    w4, s4 = pack_int4_vnni(q4, torch.rand(70, 18, generator=gen) + 0.01)
    x = torch.randn(9, 576, generator=gen) * torch.logspace(-3, 2, 576)  # blocks of very different sizes
    x[3, 64:96] = 0  # an all-zero block: scale 0, no contribution
    outs = {}
    for name in ("avx512-vnni", "scalar"):
        before = build.use_dq_path(name)
        try:
            outs[name] = (torch.ops.skipsearch.int8_dq_linear(x, w8, s8, None, 70),
                          torch.ops.skipsearch.int4_dq_linear(x, w4, s4, None, 70))
        finally:
            build.use_dq_path(before)
    assert all(torch.equal(a, b) for a, b in zip(outs["avx512-vnni"], outs["scalar"], strict=True))


def test_extreme_codes_and_leading_dimensions(path):
    """Codes at both ends (u8 255 and 0 against +-127 activations: the largest integer sums) and a [2, 3, K] input."""
    n, k = 40, 64
    q = torch.full((n, k), 127, dtype=torch.int8)
    q[::2] = -128
    scale = torch.full((n,), 0.5)
    w, s = pack_int8_vnni(q, scale)
    x = torch.ones(2, 3, k)
    x[1] = -1
    y = torch.ops.skipsearch.int8_dq_linear(x, w, s, None, n)
    assert y.shape == (2, 3, n)
    ref = x.reshape(-1, k).double() @ (q.double() * 0.5).T  # +-1 quantizes exactly (127 * 1 / 127)
    assert torch.allclose(y.reshape(-1, n).double(), ref, rtol=1e-6)


def test_the_ops_refuse_mismatched_operands():
    _built_or_skip()
    q = torch.zeros(8, 64, dtype=torch.int8)
    w8, s8 = pack_int8_vnni(q, torch.ones(8))
    w4, s4 = pack_int4_vnni(q, torch.ones(8, 2))
    ops = torch.ops.skipsearch
    with pytest.raises(RuntimeError, match="input features"):
        ops.int8_dq_linear(torch.randn(1, 32), w8, s8, None, 8)
    with pytest.raises(RuntimeError, match="blocks of 32"):
        ops.int8_dq_linear(torch.randn(1, 48), pack_int8_vnni(torch.zeros(8, 48, dtype=torch.int8), torch.ones(8))[0],
                           s8, None, 8)
    with pytest.raises(RuntimeError, match="float32 CPU"):
        ops.int8_dq_linear(torch.randn(1, 64, dtype=torch.float64), w8, s8, None, 8)
    with pytest.raises(RuntimeError, match="panels"):
        ops.int8_dq_linear(torch.randn(1, 64), w8, s8, None, 40)
    with pytest.raises(RuntimeError, match="bias"):
        ops.int4_dq_linear(torch.randn(1, 64), w4, s4, torch.zeros(3), 8)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        ops.int4_dq_linear(torch.randn(1, 64), w4, torch.ones(1, 16, 32), None, 8)
    with pytest.raises(RuntimeError, match="no avx9 path"):
        build.use_dq_path("avx9")


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_the_modules_run_the_schemes_weights_and_compile_in_one_graph(scheme):
    _built_or_skip()
    from skipsearch.kernels.lowbit import Int4DqLinear, Int8DqLinear

    torch.manual_seed(3)
    linear = nn.Linear(96, 50)
    x = torch.randn(4, 96)
    if scheme == "int8":
        module = Int8DqLinear.from_linear(linear)
        q, scale = quantize_int8(linear.weight)
        terms, colscale = _int8_terms(x, q), scale
    else:
        module = Int4DqLinear.from_linear(linear, 32)
        q, scales = quantize_int4(linear.weight, 32)
        terms, colscale = _int4_terms(x, q, scales, 32), None
    with torch.no_grad():
        _check(module(x), terms, colscale, linear.bias.detach())
        compiled = torch.compile(module, fullgraph=True, dynamic=False)
        assert torch.equal(compiled(x), module(x))
    from skipsearch.kernels.lowbit import Int4WoLinear, Int8WoLinear

    weight_only = Int8WoLinear.from_linear(linear) if scheme == "int8" else Int4WoLinear.from_linear(linear, 32)
    assert module.weight_bytes == weight_only.weight_bytes  # the same weights and scales, laid out for VNNI


def test_the_schemes_take_int8_activations_where_the_cpu_has_vnni(monkeypatch):
    _built_or_skip()
    from skipsearch.kernels.lowbit import Int4DqLinear, Int4WoLinear, Int8DqLinear, Int8WoLinear, convert

    fits, odd = nn.Linear(64, 16), nn.Linear(40, 16)  # 40 inputs: not blocks of 32, not groups of 32
    vnni = build.has_vnni()
    kind = lambda *args, **kw: type(convert.lowbit_linear(*args, **kw))  # noqa: E731 (the Dq classes subclass Wo)
    assert kind(fits, "int8") is (Int8DqLinear if vnni else Int8WoLinear)
    assert kind(fits, "int4") is (Int4DqLinear if vnni else Int4WoLinear)
    assert kind(odd, "int8") is Int8WoLinear
    assert kind(odd, "int4", group_size=8) is (Int4DqLinear if vnni else Int4WoLinear)
    with pytest.raises(ValueError, match="blocks of 32"):
        Int8DqLinear.from_linear(odd)
    monkeypatch.setattr(convert, "int8_activations", lambda: False)
    assert kind(fits, "int8") is Int8WoLinear
    assert kind(fits, "int4") is Int4WoLinear
