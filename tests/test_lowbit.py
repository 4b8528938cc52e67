"""The low-bit weight-only kernels (skipsearch.kernels.lowbit): each op, on every vector path this build has,
against a reference product; the quantization against torchao's (the precision method's int8/int4 schemes);
the modules, a compiled graph with no break, a model's draft copy, and a failed build's one-line refusal.

Tolerance: an fp32 sum of K products errs by at most about K * eps * sum_k |x_k w_k| (eps = 2^-24 per
rounding, 2^-23 here to cover the fp32 inputs' conversions too), so each output is checked against the fp64
product of the same dequantized weights within 2 K eps32 (|x| @ |W|^T) + 1e-7.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import lowbit_or_skip, tiny_llama
from torch import nn

from skipsearch.config import ConfigError
from skipsearch.kernels.lowbit import build, check_lowbit, use_isa
from skipsearch.kernels.lowbit.quant import (
    dequantize_int4,
    dequantize_int8,
    pack_f32,
    pack_int4,
    pack_int8,
    quantize_int4,
    quantize_int8,
)

ROOT = Path(__file__).resolve().parent.parent
ROWS = (1, 2, 3, 4, 7, 8, 16)
# (N, K): N odd, N below one panel of 32 and one past it; K not a multiple of 16 or 8 lanes (40, 33)
SHAPES8 = ((33, 40), (1, 33), (65, 96), (32, 17))
SHAPES4 = ((33, 40, 8), (1, 64, 32), (65, 96, 32), (31, 18, 2))  # (N, K, group)


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``y`` equals x @ w^T (+ bias), computed in fp64 from the same fp32 operands, within the stated bound."""
    ref = x.double() @ w.double().T + (0 if bias is None else bias.double())
    bound = 2 * x.shape[-1] * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().T) + 1e-7
    assert y.dtype is torch.float32 and y.shape == ref.shape
    err = (y.double() - ref).abs()
    assert (err <= bound).all(), f"max error {err.max().item():.3g}, bound there {bound.flatten()[err.argmax()]:.3g}"


@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_op_matches_the_reference_product(isa, with_bias):
    gen = torch.Generator().manual_seed(0)
    for n, k in SHAPES8:
        q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
        scale = torch.rand(n, generator=gen) * 0.01 + 1e-4
        bias = torch.randn(n, generator=gen) if with_bias else None
        w, s = pack_int8(q, scale)
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            y = torch.ops.skipsearch.int8_wo_linear(x, w, s, bias, n)
            _check(y, x, dequantize_int8(q, scale), bias)


def test_each_row_of_an_int8_block_has_the_bits_of_that_row_alone(isa):
    """A verify block's rows are one-token steps' rows, bit for bit, on a unit that sums each row in k order
    whatever chunk of rows it runs in (AVX2, scalar); K 200 is several prefetch distances. AVX-512 keeps a second
    accumulator set below 4 rows."""
    if isa == "avx512":
        pytest.skip("avx512 sums 1-3 rows in two sets (even and odd k), 4-8 in one")
    gen = torch.Generator().manual_seed(4)
    for n, k in (*SHAPES8, (40, 200)):
        q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
        w, s = pack_int8(q, torch.rand(n, generator=gen) * 0.01 + 1e-4)
        x = torch.randn(13, k, generator=gen)  # 13: a K = 12 draft's verify, a group of 8 rows and one of 5
        block = torch.ops.skipsearch.int8_wo_linear(x, w, s, None, n)
        for m in range(13):
            assert torch.equal(block[m], torch.ops.skipsearch.int8_wo_linear(x[m:m + 1], w, s, None, n)[0]), (n, k, m)


@pytest.mark.parametrize("with_bias", [False, True])
def test_int4_op_matches_the_reference_product(isa, with_bias):
    gen = torch.Generator().manual_seed(1)
    for n, k, group in SHAPES4:
        q = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
        scales = torch.rand(n, k // group, generator=gen) * 0.1 + 1e-3
        bias = torch.randn(n, generator=gen) if with_bias else None
        w, s = pack_int4(q, scales)
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            y = torch.ops.skipsearch.int4_wo_linear(x, w, s, bias, n)
            _check(y, x, dequantize_int4(q, scales), bias)


@pytest.mark.parametrize("with_bias", [False, True])
def test_the_fp32_panel_op_matches_the_reference_product(isa, with_bias):
    gen = torch.Generator().manual_seed(2)
    for n, k in SHAPES8:
        w = torch.randn(n, k, generator=gen)
        bias = torch.randn(n, generator=gen) if with_bias else None
        packed = pack_f32(w)
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            _check(torch.ops.skipsearch.f32_panel_linear(x, packed, bias, n), x, w, bias)


def test_the_fp32_panel_linear_is_its_linear_and_compiles_in_one_graph():
    lowbit_or_skip()
    from skipsearch.kernels.lowbit.modules import F32PanelLinear

    torch.manual_seed(5)
    linear = nn.Linear(64, 40)
    panel = F32PanelLinear.from_linear(linear)
    assert panel.weight_bytes == 2 * 32 * 64 * 4  # two panels of 32 columns (40 padded to 64), fp32
    x = torch.randn(2, 3, 64)
    torch._dynamo.reset()
    compiled = torch.compile(nn.Sequential(panel, nn.ReLU()).eval(), fullgraph=True)  # a graph break would raise
    with torch.no_grad():
        y = panel(x)
        torch.testing.assert_close(y, linear(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(x), torch.relu(y), rtol=0, atol=0)


def test_extreme_codes_and_leading_dimensions(isa):
    """Every weight at -128/127 (int8) and -8/7 (int4), the nibbles' edges, and x with two leading dimensions."""
    n, k = 40, 64
    x = torch.randn(2, 3, k)
    for lo, hi, op, pack, deq in (
        (-128, 127, torch.ops.skipsearch.int8_wo_linear, pack_int8, dequantize_int8),
        (-8, 7, torch.ops.skipsearch.int4_wo_linear, pack_int4, dequantize_int4),
    ):
        q = torch.where(torch.rand(n, k) < 0.5, lo, hi).to(torch.int8)
        scale = torch.full((n,), 0.5) if pack is pack_int8 else torch.full((n, k // 32), 0.5)
        y = op(x, *pack(q, scale), None, n)
        assert y.shape == (2, 3, n)
        _check(y.reshape(6, n), x.reshape(6, k), deq(q, scale), None)


def test_the_ops_refuse_mismatched_operands():
    lowbit_or_skip()
    q, scale = quantize_int8(torch.randn(40, 64))
    w, s = pack_int8(q, scale)
    with pytest.raises(RuntimeError, match="input features"):
        torch.ops.skipsearch.int8_wo_linear(torch.randn(1, 63), w, s, None, 40)
    with pytest.raises(RuntimeError, match="panels"):
        torch.ops.skipsearch.int8_wo_linear(torch.randn(1, 64), w, s, None, 65)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.skipsearch.int8_wo_linear(torch.randn(1, 64, dtype=torch.float64), w, s, None, 40)
    with pytest.raises(RuntimeError, match="input features"):
        torch.ops.skipsearch.f32_panel_linear(torch.randn(1, 63), pack_f32(torch.randn(40, 64)), None, 40)
    with pytest.raises(RuntimeError, match="packed"):
        torch.ops.skipsearch.f32_panel_linear(torch.randn(1, 64), w, None, 40)  # int8 panels are not fp32 ones
    with pytest.raises(RuntimeError, match="no nope path"):
        use_isa("nope")


def _torchao():
    pytest.importorskip("torchao")
    import logging

    logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    return quantize_, Int8WeightOnlyConfig(), IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))


def test_quantization_is_the_precision_schemes_bit_for_bit():
    """The int8/int4 schemes quantize with torchao today: the same codes and scales, so the same draft."""
    quantize_, int8_config, int4_config = _torchao()
    torch.manual_seed(2)
    weight = torch.randn(48, 96) * 0.05
    weight[3] = 0.0  # an all-zero row: scale clamped to eps
    weight[5, :32] = torch.linspace(-1, 1, 32)  # ties at the rounding boundary
    for config, ours in ((int8_config, quantize_int8(weight)), (int4_config, quantize_int4(weight, 32))):
        linear = nn.Linear(96, 48, bias=False)
        with torch.no_grad():
            linear.weight.copy_(weight)
        module = nn.Sequential(linear)
        quantize_(module, config)
        theirs = module[0].weight
        assert int(theirs.zero_point.abs().max()) == 0  # symmetric: no zero point to implement
        assert torch.equal(theirs.qdata, ours[0])
        assert torch.equal(theirs.scale.reshape(ours[1].shape), ours[1])


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_modules_equal_the_reference_of_their_quantization_and_torchaos_draft(scheme):
    lowbit_or_skip()
    from skipsearch.kernels.lowbit import Int4WoLinear, Int8WoLinear

    torch.manual_seed(3)
    for bias in (False, True):
        linear = nn.Linear(96, 45, bias=bias)
        if scheme == "int8":
            module, w = Int8WoLinear.from_linear(linear), dequantize_int8(*quantize_int8(linear.weight))
        else:
            module, w = Int4WoLinear.from_linear(linear, 32), dequantize_int4(*quantize_int4(linear.weight, 32))
        assert module.weight_bytes == (96 * 64 + 64 * 4 if scheme == "int8" else 48 * 64 + 3 * 64 * 4)
        for m in ROWS:
            x = torch.randn(m, 96)
            with torch.no_grad():
                _check(module(x), x, w, None if linear.bias is None else linear.bias.detach())
    if importlib.util.find_spec("torchao") is not None:  # and the same draft as the scheme's torchao kernel
        quantize_, int8_config, int4_config = _torchao()
        reference = nn.Sequential(nn.Linear(96, 45))
        reference[0].load_state_dict(linear.state_dict())
        quantize_(reference, int8_config if scheme == "int8" else int4_config)
        x = torch.randn(4, 96)
        with torch.no_grad():
            torch.testing.assert_close(module(x), reference(x), rtol=1e-5, atol=1e-5)


def test_torch_compile_keeps_both_ops_in_one_graph():
    lowbit_or_skip()
    from skipsearch.kernels.lowbit import Int4WoLinear, Int8WoLinear

    torch.manual_seed(4)
    module = nn.Sequential(Int8WoLinear.from_linear(nn.Linear(64, 48)), nn.ReLU(),
                           Int4WoLinear.from_linear(nn.Linear(48, 33), 16)).eval()
    x = torch.randn(3, 64)
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True)  # a graph break would raise
    with torch.no_grad():
        eager, out = module(x), compiled(x)
    torch.testing.assert_close(out, eager, rtol=0, atol=0)


def test_a_model_draft_copy_swaps_decoder_linears_and_keeps_embeddings(monkeypatch):
    """On the weight-only products (the int8-activation ones, where a CPU has VNNI, are tests/test_dq.py's)."""
    lowbit_or_skip()
    from skipsearch.kernels.lowbit import Int4WoLinear, Int8WoLinear, convert, lowbit_linears, lowbit_model

    monkeypatch.setattr(convert, "int8_activations", lambda: False)

    model = tiny_llama()
    ids = torch.tensor([[1, 5, 9, 3]])
    for scheme, cls in (("int8", Int8WoLinear), ("int4", Int4WoLinear)):
        for quant_head in (False, True):
            draft = lowbit_model(model, scheme, quant_head=quant_head)
            linears = [m for m in draft.modules() if isinstance(m, nn.Linear)]
            assert linears == ([] if quant_head else [draft.lm_head])
            assert sum(isinstance(m, cls) for m in draft.modules()) == 7 * 4 + quant_head
            assert draft.model.embed_tokens is not model.model.embed_tokens
            assert isinstance(model.model.layers[0].mlp.down_proj, nn.Linear)  # the model is left as it was
            reference = copy.deepcopy(model)  # the same model with each converted weight dequantized, in fp32
            with torch.no_grad():
                for m in reference.modules():
                    if isinstance(m, nn.Linear) and (quant_head or m is not reference.lm_head):
                        m.weight.copy_(dequantize_int8(*quantize_int8(m.weight)) if scheme == "int8"
                                       else dequantize_int4(*quantize_int4(m.weight)))
                torch.testing.assert_close(draft(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-5)
    mlp = lowbit_linears(model.model.layers[0].mlp, "int8")
    assert isinstance(mlp.gate_proj, Int8WoLinear) and isinstance(model.model.layers[0].mlp.gate_proj, nn.Linear)
    for module in (mlp, model.model.layers[0].mlp):
        with pytest.raises(ValueError, match="int8 and int4"):
            lowbit_linears(module, "fp8")


def test_a_failed_build_is_one_config_error_line(tmp_path):
    """A compiler that fails (here /bin/false, in a fresh cache): one ConfigError line, and again on a second call."""
    code = ("from skipsearch.config import ConfigError\nfrom skipsearch.kernels.lowbit import check_lowbit\n"
            "for _ in range(2):\n    try:\n        check_lowbit()\n    except ConfigError as e:\n        print(e)\n")
    env = {**os.environ, "CXX": "/bin/false", "SKIPSEARCH_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1], out.stdout
    assert lines[0].startswith("the int8/int4 weight-only CPU kernels cannot be built here: /bin/false failed: ")


def test_refusals_without_a_build(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "_STATE", {})
    monkeypatch.setattr(build.platform, "machine", lambda: "aarch64")
    with pytest.raises(ConfigError, match="x86-64 CPUs, and this one is aarch64"):
        check_lowbit()
    monkeypatch.setattr(build, "_STATE", {})
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(ConfigError, match=r"no C\+\+ compiler"):
        check_lowbit()
    monkeypatch.setattr(build, "_STATE", {})  # a cache that cannot hold the build: a file where its folder goes
    monkeypatch.setenv("CXX", sys.executable)  # a program that exists: the folder is refused before any compile
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(build, "build_dir", lambda: tmp_path / "a-file" / "build")
    with pytest.raises(ConfigError, match="cannot write its build folder .*: Not a directory; set SKIPSEARCH_CACHE"):
        check_lowbit()
    log = "Error building extension 'x':\n[1/2] c++ -c lowbit.cpp\nlowbit.cpp:3:1: error: 'foo' does not name a type\n"
    assert build.first_error(log) == "lowbit.cpp:3:1: error: 'foo' does not name a type"
    assert build.first_error("ninja\nFAILED: lowbit.o\n") == "FAILED: lowbit.o"


def test_importing_the_package_loads_no_torch():
    code = "import sys, skipsearch.kernels.lowbit as k; assert 'torch' not in sys.modules; assert k.__all__"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                   timeout=120)


def test_the_build_directory_is_keyed_by_cpu_and_compiler(monkeypatch):
    first = build.build_dir()
    monkeypatch.setattr(build, "cpu_flags", lambda: "some other cpu")
    assert build.build_dir() != first and build.build_dir().parent == first.parent
    monkeypatch.setenv("CXX", "clang++")
    assert len({first, build.build_dir()}) == 2
