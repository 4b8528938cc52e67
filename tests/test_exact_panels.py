"""Exact block codes (skipsearch/kernels/lowbit/exact.py): a weight that is a GGUF's Q4_1 or Q8_0 blocks in fp32, or
a bf16 checkpoint's values, is held as those blocks (or as bf16) and gives back every bit; the products on them equal
the fp32 panel product bit for bit, on every compiled vector path; and the panel kernel's copy of such a model holds
its linears so and decodes what HF greedy decodes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from skipsearch.config import ConfigError
from skipsearch.kernels.lowbit.quant import pack_f32
from tests.conftest import lowbit_or_skip  # and conftest's isa fixture: each vector path

ROWS = (1, 2, 3, 5, 8, 9, 13)
SHAPES = ((33, 64), (64, 96), (96, 32), (7, 160))  # (N, K): N padded to whole panels, K whole blocks


def as_q4_1(w: torch.Tensor) -> torch.Tensor:
    """``w`` rounded as llama.cpp's Q4_1 quantizer rounds it, then read back in fp32 (as a GGUF's loader does)."""
    b = w.float().reshape(w.shape[0], -1, 32)
    lo, hi = b.amin(-1, keepdim=True), b.amax(-1, keepdim=True)
    d = (hi - lo) / 15
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = ((b - lo) * inv + 0.5).floor().clamp(max=15)
    return (q * d.half().float() + lo.half().float()).reshape(w.shape)


def as_q4_0(w: torch.Tensor, *, zeros: bool = True) -> torch.Tensor:
    """``w`` as gguf's own Q4_0 quantizer and dequantizer give it back in fp32, each zero made +0.0 as a GGUF model's
    conversion makes it (``zeros=False``: as gguf gives it, -0.0 where a block's d < 0)."""
    import gguf

    kind = gguf.GGMLQuantizationType.Q4_0
    back = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w.float().numpy(), kind), kind).copy())
    return back.reshape(w.shape) + 0.0 if zeros else back.reshape(w.shape)


def as_q8_0(w: torch.Tensor) -> torch.Tensor:
    """``w`` rounded as llama.cpp's Q8_0 quantizer rounds it, then read back in fp32."""
    b = w.float().reshape(w.shape[0], -1, 32)
    d = b.abs().amax(-1, keepdim=True) / 127
    q = (b * torch.where(d > 0, 1 / d, torch.zeros_like(d))).round() + 0.0  # integer codes: no -0.0
    return (q * d.half().float()).reshape(w.shape)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_the_fits_give_back_every_bit_and_refuse_what_they_do_not_hold():
    from skipsearch.kernels.lowbit.exact import fit_bf16, fit_q4_1, fit_q8_0

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(70, 128, generator=gen) * 0.05
    w4, w8 = as_q4_1(w), as_q8_0(w)
    q, d, m = fit_q4_1(w4)
    assert q.dtype is torch.uint8 and int(q.max()) <= 15 and d.dtype is m.dtype is torch.float16
    assert _same(q.float().reshape(70, 4, 32) * d.float()[..., None] + m.float()[..., None], w4.reshape(70, 4, 32))
    q8, d8 = fit_q8_0(w8)
    assert q8.dtype is torch.int8 and d8.dtype is torch.float16
    assert _same(q8.float().reshape(70, 4, 32) * d8.float()[..., None], w8.reshape(70, 4, 32))
    assert fit_q8_0(w4) is None  # Q4_1 values are no Q8_0 blocks (m is not 0)
    for other in (w, w.double(), w[:, :100]):  # plain fp32, another dtype, K not whole blocks
        assert fit_q4_1(other) is None and fit_q8_0(other) is None
    nudged = w4.clone()
    nudged[3, 40] = torch.nextafter(nudged[3, 40], torch.tensor(1.0))  # one weight one ulp off
    assert fit_q4_1(nudged) is None
    (w16,) = fit_bf16(w.bfloat16().float())
    assert w16.dtype is torch.bfloat16 and _same(w16.float(), w.bfloat16().float())
    assert fit_bf16(w) is None and fit_bf16(w[:, :100].bfloat16().float()) is None
    constant = torch.full((32, 64), 0.25)  # d = 0: every weight is m, every code 0
    q, d, m = fit_q4_1(constant)
    assert not q.any() and not d.float().any() and (m.float() == 0.25).all()


def test_a_q4_0_block_is_held_as_the_q4_1_block_it_equals_once_its_zeros_are_plus_zero():
    from skipsearch.kernels.lowbit.exact import fit_q4_0, fit_q4_1

    gen = torch.Generator().manual_seed(2)
    w = torch.randn(70, 128, generator=gen) * 0.05
    raw, w0 = as_q4_0(w, zeros=False), as_q4_0(w)
    minus = raw.view(torch.int32) == torch.tensor(-0.0).view(torch.int32)
    assert minus.any() and torch.equal(raw, w0)  # gguf's -0.0 where d < 0: the same values as +0.0
    assert fit_q4_0(raw) is None  # q 8 d - 8 d is +0.0: not those bits
    q, d, m = fit_q4_0(w0)
    assert q.dtype is torch.uint8 and int(q.max()) <= 15 and (d.float() < 0).any() and (d.float() > 0).any()
    assert torch.equal(m.float(), d.float() * -8)
    decoded = q.float().reshape(70, 4, 32) * d.float()[..., None] + m.float()[..., None]
    assert _same(decoded, w0.reshape(70, 4, 32))
    assert fit_q4_1(w0) is None  # m = -8 d is the block's extreme only for d < 0: not Q4_1's form
    for other in (w, as_q4_1(w), as_q8_0(w)):  # fp32, another block type
        assert fit_q4_0(other) is None
    nudged = w0.clone()
    nudged[5, 70] = torch.nextafter(nudged[5, 70], torch.tensor(1.0))
    assert fit_q4_0(nudged) is None


@pytest.mark.parametrize("with_bias", [False, True])
def test_the_block_ops_equal_the_fp32_panel_op_bit_for_bit(isa, with_bias):
    from skipsearch.kernels.lowbit.exact import B16PanelLinear, fit_bf16, fit_q4_1, fit_q8_0, pack_q4_1, pack_q8_0

    gen = torch.Generator().manual_seed(1)
    for n, k in SHAPES:
        w = torch.randn(n, k, generator=gen)
        bias = torch.randn(n, generator=gen) if with_bias else None
        w4, w8, w16 = as_q4_1(w), as_q8_0(w), w.bfloat16().float()
        codes4, codes8 = pack_q4_1(*fit_q4_1(w4)), pack_q8_0(*fit_q8_0(w8))
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            y4 = torch.ops.skipsearch.q4_1_panel_linear(x, *codes4, bias, n)
            y8 = torch.ops.skipsearch.q8_0_panel_linear(x, *codes8, bias, n)
            assert _same(y4, torch.ops.skipsearch.f32_panel_linear(x, pack_f32(w4), bias, n)), (n, k, m)
            assert _same(y8, torch.ops.skipsearch.f32_panel_linear(x, pack_f32(w8), bias, n)), (n, k, m)
            y16 = torch.ops.skipsearch.bf16_panel_linear(x, B16PanelLinear(fit_bf16(w16), None).packed, bias, n)
            assert _same(y16, torch.ops.skipsearch.f32_panel_linear(x, pack_f32(w16), bias, n)), (n, k, m)
    x = torch.randn(2, 3, 64, generator=gen)  # two leading dimensions
    assert torch.ops.skipsearch.q4_1_panel_linear(x, *pack_q4_1(*fit_q4_1(as_q4_1(torch.randn(40, 64)))), None,
                                                  40).shape == (2, 3, 40)


def test_the_block_ops_refuse_mismatched_operands():
    lowbit_or_skip()
    from skipsearch.kernels.lowbit.exact import fit_q4_1, pack_q4_1

    codes, dm = pack_q4_1(*fit_q4_1(as_q4_1(torch.randn(40, 64))))
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="input features"):
        torch.ops.skipsearch.q4_1_panel_linear(torch.randn(2, 32), codes, dm, None, 40)
    with pytest.raises(RuntimeError, match="float16"):
        torch.ops.skipsearch.q4_1_panel_linear(x, codes, dm.float(), None, 40)
    with pytest.raises(RuntimeError, match="codes must be packed"):
        torch.ops.skipsearch.q8_0_panel_linear(x, codes, dm, None, 40)


def test_a_linear_is_held_in_the_smallest_form_that_gives_back_its_weights():
    lowbit_or_skip()
    from skipsearch.kernels.lowbit.exact import B16PanelLinear, Q41PanelLinear, Q80PanelLinear, exact_panel_linear
    from skipsearch.kernels.lowbit.modules import F32PanelLinear

    torch.manual_seed(4)
    x = torch.randn(3, 64)
    for rounded, cls, nbytes in ((as_q4_1, Q41PanelLinear, 2 * (64 * 16 + 2 * 2 * 32 * 2)),
                                 (as_q4_0, Q41PanelLinear, 2 * (64 * 16 + 2 * 2 * 32 * 2)),
                                 (as_q8_0, Q80PanelLinear, 2 * (64 * 32 + 2 * 32 * 2)),
                                 (lambda w: w.bfloat16().float(), B16PanelLinear, 2 * 64 * 32 * 2),
                                 (lambda w: w, F32PanelLinear, 2 * 64 * 32 * 4)):
        linear = nn.Linear(64, 40)
        with torch.no_grad():
            linear.weight.copy_(rounded(linear.weight))
        held = exact_panel_linear(linear)
        assert type(held) is cls and held.weight_bytes == nbytes  # two panels of 32 columns, 40 padded to 64
        with torch.no_grad():
            assert _same(held(x), F32PanelLinear.from_linear(linear)(x))
            torch.testing.assert_close(held(x), linear(x), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    compiled = torch.compile(nn.Sequential(held, nn.ReLU()).eval(), fullgraph=True)  # no graph break
    with torch.no_grad():
        assert _same(compiled(x), torch.relu(held(x)))


def test_the_panel_copy_of_a_gguf_model_holds_its_blocks_and_computes_the_fp32_copys_bits(monkeypatch):
    """A model whose linears are Q4_1 blocks and whose head is Q8_0 blocks (as smollm2-135m's GGUF): the panel
    kernel's copy holds each in its blocks (siblings sharing one buffer, as fp32 panels do) and its forward, eagerly,
    gives the fp32 panels' logits bit for bit."""
    lowbit_or_skip()
    from skipsearch.kernels import panel
    from skipsearch.kernels.lowbit import exact
    from skipsearch.kernels.lowbit.modules import F32PanelLinear
    from tests.conftest import make_tiny_model

    sm = make_tiny_model(vocab_size=64, num_layers=2, seed=5)
    with torch.no_grad():
        for name, module in sm.hf.named_modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_((as_q8_0 if name == "lm_head" else as_q4_1)(module.weight))
    coded = panel.shared_copy(sm.hf, panels=True)
    kinds = {type(m).__name__ for m in coded.modules() if isinstance(m, (nn.Linear, exact.LowbitLinear))}
    assert kinds == {"Q41PanelLinear", "Q80PanelLinear"} and type(coded.lm_head).__name__ == "Q80PanelLinear"
    mlp = coded.model.layers[0].mlp
    assert mlp.gate_proj.columns is not None and mlp.gate_proj.siblings_codes is mlp.up_proj.siblings_codes
    monkeypatch.setattr(exact, "FORMATS", ())  # every linear as its fp32 panels
    plain = panel.shared_copy(sm.hf, panels=True)
    assert all(type(m) is F32PanelLinear for m in plain.modules() if isinstance(m, exact.LowbitLinear))
    ids = torch.tensor([[5, 9, 2, 17, 33, 4, 8]])
    with torch.no_grad():
        assert _same(coded(ids).logits, plain(ids).logits)


def test_the_panel_kernel_decodes_a_gguf_model_on_its_blocks_as_hf_greedy():
    """Compiled (one-token steps, and verify blocks whose siblings run as one product), the
    panel kernel on a model of Q4_1 / Q8_0 blocks runs the block products and decodes what HF greedy decodes."""
    import transformers

    from skipsearch.config import NO_EXIT, DraftConfig
    from skipsearch.engine.decoding import generate, hf_generate
    from skipsearch.kernels import Kernel, check_kernel
    from skipsearch.kernels.inductor import static_cache_supported
    from skipsearch.kernels.lowbit.exact import Q41PanelLinear, Q80PanelLinear
    from tests.conftest import make_tiny_model

    if not static_cache_supported():
        pytest.skip(f"the compiled kernels need transformers 5's StaticCache layers, not {transformers.__version__}")
    try:
        check_kernel(Kernel("panel"), "cpu")
    except ConfigError as exc:
        pytest.skip(str(exc))
    sm = make_tiny_model(vocab_size=64, num_layers=3, seed=6)
    with torch.no_grad():
        for name, module in sm.hf.named_modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_((as_q8_0 if name == "lm_head" else as_q4_1)(module.weight))
    sm.use_kernel("panel-c4", capacity=64)
    rows = sm._runner._rows_module._orig_mod
    assert type(rows.lm_head) is Q80PanelLinear and type(rows.model.layers[0].mlp.down_proj) is Q41PanelLinear
    skip = DraftConfig(skip_attn=(1,), skip_mlp=(2,), max_draft_tokens=6, exit=NO_EXIT)  # 7 tokens: a block, a rest
    for prompt in ([5, 9, 2], [7, 1, 1, 8, 3, 12, 40], [3] * 11 + [17, 4]):
        ref = hf_generate(sm, prompt, max_new_tokens=20)
        assert generate(sm, prompt, max_new_tokens=20).token_ids == ref
        assert generate(sm, prompt, config=skip, max_new_tokens=20).token_ids == ref


def test_the_panel_copy_of_a_bf16_checkpoint_holds_bf16_and_computes_the_fp32_copys_bits(monkeypatch):
    """A model whose fp32 weights are bf16 values (a bf16 checkpoint loaded in fp32): every linear held as bf16, half
    the fp32 panels' bytes, and its forward gives the fp32 panels' logits bit for bit."""
    lowbit_or_skip()
    from skipsearch.kernels import panel
    from skipsearch.kernels.lowbit import exact
    from tests.conftest import make_tiny_model

    sm = make_tiny_model(vocab_size=64, num_layers=2, seed=7)
    with torch.no_grad():
        for module in sm.hf.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(module.weight.bfloat16().float())
    coded = panel.shared_copy(sm.hf, panels=True)
    assert {type(m) for m in coded.modules() if isinstance(m, exact.LowbitLinear)} == {exact.B16PanelLinear}
    monkeypatch.setattr(exact, "FORMATS", ())
    plain = panel.shared_copy(sm.hf, panels=True)
    ids = torch.tensor([[5, 9, 2, 17, 33, 4, 8]])
    with torch.no_grad():
        assert _same(coded(ids).logits, plain(ids).logits)
