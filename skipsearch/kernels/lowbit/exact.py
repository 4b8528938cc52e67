"""A layer's fp32 weights in the fewest bytes that give them back bit for bit: the panel kernel's weights.

A model converted from a GGUF holds, in fp32, the values of the GGUF's blocks: smollm2-135m (the default model) comes
from a Q4_1 file, so each of its linears holds, for every 32 inputs of an output row, at most 16 values d q + m (d
and m fp16, q in 0..15), and its tied LM head, from the file's Q8_0 embedding, the values d q (q in -128..127). In
fp32 a one-token step streams 540 MB of them; as the blocks they are, 96 MB.

``fit_q4_1`` and ``fit_q8_0`` find such blocks in a weight, where there are any, and check that decoding them gives
back every fp32 bit of it (a weight they do not fit exactly is left alone: None). ``exact_panel_linear`` then holds a
linear as the smallest form that fits (``Q41PanelLinear``, ``Q80PanelLinear``; ``B16PanelLinear`` for the fp32
weights of a bf16 checkpoint, which bf16 gives back exactly), else as its fp32 panels
(``F32PanelLinear``). Their products (``csrc/lowbit.cpp``: ``coded_panel``) decode each weight in registers and sum as
the fp32 panels' product does, in the same order, so their output equals ``f32_panel_linear``'s bit for bit: the
same model, the same numbers, fewer bytes a step. Nothing is rounded that the checkpoint did not already round.
"""

from __future__ import annotations

import torch
from torch import nn

from skipsearch.kernels.lowbit.build import check_lowbit
from skipsearch.kernels.lowbit.modules import F32PanelLinear, LowbitLinear, bias_of
from skipsearch.kernels.lowbit.quant import PANEL, panel_major, panels

BLOCK = 32  # inputs per block, as a GGUF's Q4_1 and Q8_0 blocks
ULPS = (0, -1, 1, -2, 2, -3, 3)  # the fp16 scales tried around (max - min) / 15 for a Q4_1 block, nearest first
MOSTLY = 0.5  # a Q4_1 fit gives up where the nearest scale fits fewer blocks than this share (not Q4_1 data)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: the fp32 values are the same bits (so -0.0 is not 0.0, and a NaN is nothing's)."""
    return a.view(torch.int32) == b.view(torch.int32)


def _blocks(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [N, K] as [N, K / 32, 32] fp32, or None where K is not a whole number of blocks."""
    w = weight.detach()
    if w.dim() != 2 or w.dtype != torch.float32 or w.shape[1] % BLOCK or not w.shape[1]:
        return None
    return w.reshape(w.shape[0], -1, BLOCK)


def fit_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q [N, K] int8, d [N, K / 32] fp16) with ``q * d`` equal to ``weight`` bit for bit, else None. A Q8_0 block's
    largest |w| is 127 d exactly (d q is exact in fp32: 11 bits by 8), so d is that over 127."""
    b = _blocks(weight)
    if b is None:
        return None
    dh = (b.abs().amax(-1, keepdim=True) / 127).half()
    d = dh.float()
    if not torch.isfinite(d).all():
        return None
    q = (b / torch.where(d > 0, d, 1)).round_().clamp_(-128, 127).add_(0.0)  # + 0.0: no -0.0 codes
    if not _same_bits(q * d, b).all():
        return None
    return q.to(torch.int8).reshape(weight.shape), dh.squeeze(-1)


def fit_q4_1(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(q [N, K] uint8 in 0..15, d [N, K / 32] fp16, m [N, K / 32] fp16) with ``q * d + m`` (d q exact, then one
    rounding, as the kernel's fma) equal to ``weight`` bit for bit, else None. A Q4_1 block's smallest weight is m
    (its q is 0) and its largest is about 15 d + m: d is the fp16 value nearest (max - min) / 15 that fits the whole
    block, tried up to 3 fp16 steps either side."""
    b = _blocks(weight)
    if b is None:
        return None
    m32 = b.amin(-1, keepdim=True)
    mh = m32.half()
    if not (torch.isfinite(mh).all() and _same_bits(mh.float(), m32).all()):
        return None
    nearest = ((b.amax(-1, keepdim=True) - m32) / 15).half().view(torch.int16)
    found = torch.zeros_like(m32, dtype=torch.bool)
    dh = torch.zeros_like(mh)
    diff = b - m32
    for ulps in ULPS:
        cand = (nearest + ulps).view(torch.float16)  # a negative or NaN candidate fits nothing (checked below)
        c = cand.float()
        q = (diff / torch.where(c > 0, c, 1)).round_().clamp_(0, 15)
        fits = _same_bits(q * c + m32, b).all(-1, keepdim=True) & (c >= 0) & ~found
        dh = torch.where(fits, cand, dh)
        found |= fits
        if found.all():
            break
        if ulps == 0 and found.float().mean() < MOSTLY:
            return None
    if not found.all():
        return None
    d = dh.float()
    q = (diff / torch.where(d > 0, d, 1)).round_().clamp_(0, 15)
    return q.to(torch.uint8).reshape(weight.shape), dh.squeeze(-1), mh.squeeze(-1)


def fit_q4_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A Q4_0 GGUF's blocks (w = d (q - 8), d fp16 of either sign, q in 0..15) in ``fit_q4_1``'s form: (q, d, m = -8 d)
    with ``q * d + m`` equal to ``weight`` bit for bit, else None. llama.cpp's Q4_0 maps a block's largest |w| to
    q = 0, so that weight is -8 d exactly (d q and 8 d are exact in fp32: 11 bits by 4). Where d < 0 gguf's
    dequantizer gives q = 8 as -0.0 and this decoding +0.0, so a GGUF model's zeros are made +0.0 when it is
    converted (``checkpoints.convert_gguf``): the same values, and then the same bits."""
    b = _blocks(weight)
    if b is None:
        return None
    ends = b.gather(-1, b.abs().argmax(-1, keepdim=True))  # the block's largest |w|, with its sign
    dh = (ends / -8).half()
    d = dh.float()
    if not _same_bits(d * -8, ends).all():  # -8 d is an fp16 scale's weight: not Q4_0 data where it is not
        return None
    q = (b / torch.where(d != 0, d, 1)).round_().add_(8).clamp_(0, 15)
    if not _same_bits(q * d + d * -8, b).all():
        return None
    return q.to(torch.uint8).reshape(weight.shape), dh.squeeze(-1), (dh * -8).squeeze(-1)


def pack_q4_1(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K] 0..15, d, m [N, G] fp16) -> (codes [panels, K, 16] uint8: byte i holds column i in its low nibble
    and column i + 16 in its high one; dm [panels, G, 2, 32] fp16: d, then m), as ``csrc/lowbit.cpp`` reads them."""
    u = panels(q, 0).transpose(1, 2)  # [P, K, 32]
    codes = (u[..., :PANEL // 2] | (u[..., PANEL // 2:] << 4)).contiguous()
    dm = torch.stack((panels(d, 0.0), panels(m, 0.0)), dim=2)  # [P, 32, 2, G]
    return codes, dm.permute(0, 3, 2, 1).contiguous()


def pack_q8_0(q: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K] int8, d [N, G] fp16) -> (codes [panels, K, 32] int8, d [panels, G, 32] fp16)."""
    return panel_major(q, 0), panel_major(d, 0.0)


class Q41PanelLinear(LowbitLinear):
    """A linear whose fp32 weights are a Q4_1 GGUF's blocks, held as those blocks (``skipsearch::q4_1_panel_linear``,
    5 bits a weight): ``f32_panel_linear``'s output bit for bit."""

    STREAMED = ("codes", "dm")

    def __init__(self, fit: tuple[torch.Tensor, torch.Tensor, torch.Tensor], bias: torch.Tensor | None) -> None:
        super().__init__()
        check_lowbit()
        self.out_features, self.in_features = fit[0].shape
        codes, dm = pack_q4_1(*fit)
        self.register_buffer("codes", codes)
        self.register_buffer("dm", dm)
        self._keep_bias(bias)

    @staticmethod
    def _run(x, codes, dm, bias, n):
        return torch.ops.skipsearch.q4_1_panel_linear(x, codes, dm, bias, n)


class Q80PanelLinear(LowbitLinear):
    """A linear whose fp32 weights are a Q8_0 GGUF's blocks, held as those blocks (``skipsearch::q8_0_panel_linear``,
    8.5 bits a weight): ``f32_panel_linear``'s output bit for bit."""

    STREAMED = ("codes", "d")

    def __init__(self, fit: tuple[torch.Tensor, torch.Tensor], bias: torch.Tensor | None) -> None:
        super().__init__()
        check_lowbit()
        self.out_features, self.in_features = fit[0].shape
        codes, d = pack_q8_0(*fit)
        self.register_buffer("codes", codes)
        self.register_buffer("d", d)
        self._keep_bias(bias)

    @staticmethod
    def _run(x, codes, d, bias, n):
        return torch.ops.skipsearch.q8_0_panel_linear(x, codes, d, bias, n)


def fit_bf16(weight: torch.Tensor) -> tuple[torch.Tensor] | None:
    """(w [N, K] bf16,) equal to ``weight`` bit for bit when widened, else None: the fp32 weights of a bf16
    checkpoint (most Hugging Face models), loaded in fp32."""
    b = _blocks(weight)
    if b is None:
        return None
    w = weight.detach().to(torch.bfloat16)
    return (w,) if _same_bits(w.float(), weight.detach()).all() else None


class B16PanelLinear(LowbitLinear):
    """A linear whose fp32 weights are bf16 values, held as bf16 (``skipsearch::bf16_panel_linear``, 16 bits a
    weight): ``f32_panel_linear``'s output bit for bit."""

    def __init__(self, fit: tuple[torch.Tensor], bias: torch.Tensor | None) -> None:
        super().__init__()
        check_lowbit()
        self.out_features, self.in_features = fit[0].shape
        self.register_buffer("packed", panel_major(fit[0], 0.0))  # [panels, K, 32] bf16
        self._keep_bias(bias)

    @staticmethod
    def _run(x, codes, bias, n):
        return torch.ops.skipsearch.bf16_panel_linear(x, codes, bias, n)


# smallest first; a Q4_0 block runs as the Q4_1 block (d, -8 d) it equals
FORMATS = ((fit_q4_1, Q41PanelLinear), (fit_q4_0, Q41PanelLinear), (fit_q8_0, Q80PanelLinear),
           (fit_bf16, B16PanelLinear))


def exact_panel_linear(linear: nn.Linear) -> LowbitLinear:
    """``linear`` as the smallest of ``FORMATS`` that gives back its fp32 weights bit for bit, else as its fp32
    panels: the panel kernel's stand-in for every linear."""
    for fit, cls in FORMATS:
        found = fit(linear.weight)
        if found is not None:
            return cls(found, bias_of(linear))
    return F32PanelLinear.from_linear(linear)
