"""``nn.Linear`` stand-ins that hold int8 or int4 weights, packed once, and run the low-bit kernels.

Each quantizes its linear's weight once (as the precision method's int8/int4 schemes do: ``quant.py``),
packs it and, at every call, runs ``skipsearch::int8_wo_linear`` or ``skipsearch::int4_wo_linear``: fp32
activations in and out, fp32 accumulation. The ops are registered with shapes for torch.compile, and the
packed weights are plain tensors (buffers), so a compiled draft holds them in its graph with no graph break.
"""

from __future__ import annotations

import torch
from torch import nn

from skipsearch.kernels.lowbit.build import check_lowbit
from skipsearch.kernels.lowbit.quant import GROUP, pack_f32, pack_int4, pack_int8, quantize_int4, quantize_int8


class _LowbitLinear(nn.Module):
    in_features: int
    out_features: int

    @property
    def weight_bytes(self) -> int:
        """Bytes a call streams: the packed weight and its scales (the bias aside)."""
        return sum(t.numel() * t.element_size() for t in self._streamed())

    def _streamed(self) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int8WoLinear(_LowbitLinear):
    """int8 weights, one scale per output feature; fp32 activations (``skipsearch::int8_wo_linear``)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        check_lowbit()
        self.out_features, self.in_features = q.shape
        packed, packed_scale = pack_int8(q, scale)
        self.register_buffer("packed", packed)  # [panels, K, 32] int8
        self.register_buffer("scale", packed_scale)  # [panels * 32] fp32
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8WoLinear:
        q, scale = quantize_int8(linear.weight)
        return cls(q, scale, None if linear.bias is None else linear.bias.detach().float().clone())

    def _streamed(self) -> tuple[torch.Tensor, ...]:
        return self.packed, self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x if x.dtype is torch.float32 else x.float()
        out = torch.ops.skipsearch.int8_wo_linear(x32, self.packed, self.scale, self.bias, self.out_features)
        return out if x.dtype is torch.float32 else out.to(x.dtype)


class F32PanelLinear(_LowbitLinear):
    """The layer's own fp32 weights, packed in panels (``skipsearch::f32_panel_linear``): the same product as
    ``nn.Linear`` up to the order of its sums, streaming each weight once for all rows. For a few rows (a verify
    block) on CPUs where the BLAS call runs a few rows at compute speed, not at memory speed."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        check_lowbit()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed", pack_f32(weight))  # [panels, K, 32] fp32
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> F32PanelLinear:
        return cls(linear.weight, None if linear.bias is None else linear.bias.detach().float().clone())

    def _streamed(self) -> tuple[torch.Tensor, ...]:
        return (self.packed,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x if x.dtype is torch.float32 else x.float()
        out = torch.ops.skipsearch.f32_panel_linear(x32, self.packed, self.bias, self.out_features)
        return out if x.dtype is torch.float32 else out.to(x.dtype)


class Int4WoLinear(_LowbitLinear):
    """int4 weights in groups of ``group_size`` inputs, one scale per output feature and group (zero point
    0, as the int4 scheme's symmetric mapping); fp32 activations (``skipsearch::int4_wo_linear``)."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        check_lowbit()
        self.out_features, self.in_features = q.shape
        self.group_size = self.in_features // scales.shape[1]
        packed, packed_scales = pack_int4(q, scales)
        self.register_buffer("packed", packed)  # [panels, K / 2, 32] uint8, two weights a byte
        self.register_buffer("scales", packed_scales)  # [panels, K / group_size, 32] fp32
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = GROUP) -> Int4WoLinear:
        q, scales = quantize_int4(linear.weight, group_size)
        return cls(q, scales, None if linear.bias is None else linear.bias.detach().float().clone())

    def _streamed(self) -> tuple[torch.Tensor, ...]:
        return self.packed, self.scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x if x.dtype is torch.float32 else x.float()
        out = torch.ops.skipsearch.int4_wo_linear(x32, self.packed, self.scales, self.bias, self.out_features)
        return out if x.dtype is torch.float32 else out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}"
