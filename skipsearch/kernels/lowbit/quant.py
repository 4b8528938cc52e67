"""Quantizing a weight as the precision method's int8 and int4 schemes do, and packing it for the kernels.

The numbers are torchao's (0.14 and later), which the ``int8`` and ``int4`` schemes use today, so that a
draft run by these kernels holds the same weights and accepts as often:
- int8 (``Int8WeightOnlyConfig``): symmetric, one scale per output row, s = max|w| / 127.5, q in [-128, 127];
- int4 (``IntxWeightOnlyConfig(torch.int4, PerGroup(32))``): symmetric, one scale per row and group of 32
  inputs, s = max|w| / 7.5, q in [-8, 7]; the zero point is 0 (torchao's symmetric mapping), so none is stored.
int8 clamps s to fp32's eps and int4 to its smallest normal number (torchao's defaults differ: it matters
only for an all-zero row or group), and both round w * (1 / s) half to even. ``tests/test_lowbit.py``
compares q and s with torchao's own, bit for bit, where torchao is installed.

Packed layout (see ``csrc/lowbit.cpp``): output columns in panels of 32, k-major inside a panel.
"""

from __future__ import annotations

import torch

PANEL = 32  # output columns per panel, as csrc/lowbit.cpp's P
GROUP = 32  # the int4 scheme's group size on CPU


def _symmetric(w: torch.Tensor, qmin: int, qmax: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's symmetric affine quantization of the rows of ``w`` ([..., G]): (q int8, scale [..., 1])."""
    absmax = torch.maximum(-torch.clamp(w.amin(dim=-1, keepdim=True), max=0),
                           torch.clamp(w.amax(dim=-1, keepdim=True), min=0))
    scale = torch.clamp(absmax / (float(qmax - qmin) / 2), min=eps)
    q = (w * (1.0 / scale)).round_().clamp_(qmin, qmax).to(torch.int8)  # in place: one fp32 temporary, not three
    return q, scale


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] -> (q [N, K] int8, scale [N] fp32), one scale per output row."""
    q, scale = _symmetric(weight.detach().float(), -128, 127, torch.finfo(torch.float32).eps)
    return q, scale.squeeze(-1)


def quantize_int4(weight: torch.Tensor, group_size: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] -> (q [N, K] int8 in [-8, 7], scales [N, K / group_size] fp32)."""
    n, k = weight.shape
    if group_size < 2 or group_size % 2 or k % group_size:
        raise ValueError(f"int4 groups must be even and divide the {k} inputs; got {group_size}")
    w = weight.detach().float().reshape(n, k // group_size, group_size)
    q, scale = _symmetric(w, -8, 7, torch.finfo(torch.float32).smallest_normal)
    return q.reshape(n, k), scale.squeeze(-1)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp32 weights an int8 kernel multiplies by: q * s, [N, K]."""
    return q.float() * scale[:, None]


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 weights an int4 kernel multiplies by: q * s of the element's group, [N, K]."""
    n, k = q.shape
    groups = scales.shape[1]
    return (q.float().reshape(n, groups, k // groups) * scales[..., None]).reshape(n, k)


def panels(t: torch.Tensor, fill: float | int) -> torch.Tensor:
    """[N, ...] -> [ceil(N / 32), 32, ...], the last panel filled with ``fill``."""
    n = t.shape[0]
    pad = -n % PANEL
    if pad:
        t = torch.cat([t, t.new_full((pad, *t.shape[1:]), fill)])
    return t.reshape(-1, PANEL, *t.shape[1:])


def panel_major(t: torch.Tensor, fill: float | int) -> torch.Tensor:
    """[N, K] -> [panels, K, 32]: each panel's 32 output columns side by side for every k (``panels`` then
    k-major), the layout every product of ``csrc/lowbit.cpp`` streams."""
    return panels(t, fill).transpose(1, 2).contiguous()


def pack_int8(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K], scale [N]) -> (w [panels, K, 32] int8, scale [panels * 32] fp32)."""
    w = panel_major(q, 0)  # [P, K, 32]
    return w, panels(scale.float(), 0.0).reshape(-1).contiguous()


def pack_f32(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] -> [panels, K, 32] fp32, as the int8 layout with the weights themselves (no scale)."""
    return panel_major(weight.detach().float(), 0.0)


def pack_int4(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K] in [-8, 7], scales [N, G]) -> (w [panels, K / 2, 32] uint8: the low nibble holds even k and
    the high one odd k, each q + 8; scales [panels, G, 32] fp32)."""
    u = (panels(q, 0).to(torch.int16) + 8).to(torch.uint8).transpose(1, 2)  # [P, K, 32], 0..15
    w = (u[:, 0::2] | (u[:, 1::2] << 4)).contiguous()  # [P, K/2, 32]
    return w, panel_major(scales.float(), 1.0)  # [P, G, 32]


def pack_int8_vnni(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K], scale [N]) -> (w [panels, K / 4, 128] uint8, scale [panels * 32] fp32) for ``int8_dq_linear``
    (``csrc/dq.cpp``): step t of a panel holds columns 0..31, each as its four inputs 4t..4t+3, stored q + 128."""
    u = (panels(q, 0).to(torch.int16) + 128).to(torch.uint8)  # [P, 32, K]
    p, _, k = u.shape
    w = u.reshape(p, PANEL, k // 4, 4).permute(0, 2, 1, 3).reshape(p, k // 4, 4 * PANEL).contiguous()
    return w, panels(scale.float(), 0.0).reshape(-1).contiguous()


def pack_int4_vnni(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K] in [-8, 7], scales [N, G]) -> (w [panels, K / 8, 128] uint8, scales [panels, G, 32] fp32) for
    ``int4_dq_linear`` (``csrc/dq.cpp``): step t of a panel holds columns 0..31, each as four bytes whose low
    nibbles are inputs 8t..8t+3 and high nibbles 8t+4..8t+7, each q + 8."""
    u = (panels(q, 0).to(torch.int16) + 8).to(torch.uint8)  # [P, 32, K], 0..15
    p, _, k = u.shape
    u = u.reshape(p, PANEL, k // 8, 2, 4)
    w = (u[:, :, :, 0] | (u[:, :, :, 1] << 4)).permute(0, 2, 1, 3).reshape(p, k // 8, 4 * PANEL).contiguous()
    return w, panel_major(scales.float(), 1.0)
