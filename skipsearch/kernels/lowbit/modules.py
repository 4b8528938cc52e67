"""``nn.Linear`` stand-ins that hold int8 or int4 weights, packed once, and run the low-bit kernels.

Each quantizes its linear's weight once (as the precision method's int8/int4 schemes do: ``quant.py``),
packs it and, at every call, runs ``skipsearch::int8_wo_linear`` or ``skipsearch::int4_wo_linear`` (fp32
activations, fp32 accumulation), or on a CPU with AVX-512 VNNI ``skipsearch::int8_dq_linear`` or
``skipsearch::int4_dq_linear`` (activations rounded to int8 per block, exact integer sums; ``csrc/dq.cpp``):
fp32 in and out either way. The ops are registered with shapes for torch.compile, and the
packed weights are plain tensors (buffers), so a compiled draft holds them in its graph with no graph break.
"""

from __future__ import annotations

import torch
from torch import nn

from skipsearch.kernels.lowbit.build import check_lowbit
from skipsearch.kernels.lowbit.quant import (
    GROUP,
    pack_f32,
    pack_int4,
    pack_int4_vnni,
    pack_int8,
    pack_int8_vnni,
    quantize_int4,
    quantize_int8,
)


class SiblingGroup:
    """Siblings' one product while a graph is traced: the input the first of them called ran it on and its output,
    which the others, called next on the same input, slice; once each has taken its columns both are cleared, so
    that nothing outlives the call (and the next trace starts from the same state)."""

    def __init__(self, members: int) -> None:
        self.members = members
        self.input = self.output = None
        self.left = 0  # siblings still to take their columns of ``output``


class LowbitLinear(nn.Module):
    """A stand-in holding packed low-bit (or panel fp32) weights as buffers, run by one of the C++ ops: each call
    is ``_run(x, *self._streamed(), bias, out_features)`` on fp32 activations, the result in the input's dtype."""

    in_features: int
    out_features: int
    STREAMED: tuple[str, ...] = ("packed",)  # the buffers a call streams, in the op's argument order
    # once its siblings share its storage (``siblings.share_storage``): its columns (start, stop) of their
    # product, and how many that product has
    columns: tuple[int, int, int] | None = None
    sibling_group: SiblingGroup | None = None  # what the siblings share while a compiled graph is traced


    @property
    def weight_bytes(self) -> int:
        """Bytes a call streams: the packed weight and its scales (the bias aside)."""
        return sum(t.numel() * t.element_size() for t in self._streamed())

    def _streamed(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, name) for name in self.STREAMED)

    @staticmethod
    def _run(x: torch.Tensor, *operands) -> torch.Tensor:
        raise NotImplementedError

    def _keep_bias(self, bias: torch.Tensor | None) -> None:
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x if x.dtype is torch.float32 else x.float()
        if self.columns is not None and torch.compiler.is_compiling():
            # compiled: its siblings' whole product, once for them all, sliced. The first of them called (q, gate)
            # makes the call; the others, called next on the same input (k and v, up), take their columns of it.
            # The graph's inputs hold the whole buffer once per sibling (AOT autograd keeps an unmutated duplicate
            # input as an input of its own), so identical calls would not merge by themselves.
            start, stop, total = self.columns
            group = self.sibling_group
            if not (group.left and group.input is x32):
                whole = tuple(getattr(self, f"siblings_{name}") for name in self.STREAMED)
                group.input, group.left = x32, group.members
                group.output = self._run(x32, *whole, self.siblings_bias, total)
            out = group.output[..., start:stop]
            group.left -= 1
            if not group.left:
                group.input = group.output = None
        else:
            out = self._run(x32, *self._streamed(), self.bias, self.out_features)
        return out if x.dtype is torch.float32 else out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def bias_of(linear: nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach().float().clone()


class Int8WoLinear(LowbitLinear):
    """int8 weights, one scale per output feature; fp32 activations (``skipsearch::int8_wo_linear``)."""

    _pack = staticmethod(pack_int8)  # [panels, K, 32] int8, and the scales [panels * 32] fp32
    STREAMED = ("packed", "scale")

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        check_lowbit()
        self.out_features, self.in_features = q.shape
        packed, packed_scale = self._pack(q, scale)
        self.register_buffer("packed", packed)
        self.register_buffer("scale", packed_scale)
        self._keep_bias(bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear):
        return cls(*quantize_int8(linear.weight), bias_of(linear))

    @staticmethod
    def _run(x, w, scale, bias, n):
        return torch.ops.skipsearch.int8_wo_linear(x, w, scale, bias, n)


class F32PanelLinear(LowbitLinear):
    """The layer's own fp32 weights, packed in panels (``skipsearch::f32_panel_linear``): the same product as
    ``nn.Linear`` up to the order of its sums, streaming each weight once for all rows. For a few rows (a verify
    block) on CPUs where the BLAS call runs a few rows at compute speed, not at memory speed."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        check_lowbit()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed", pack_f32(weight))  # [panels, K, 32] fp32
        self._keep_bias(bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> F32PanelLinear:
        return cls(linear.weight, bias_of(linear))

    @staticmethod
    def _run(x, w, bias, n):
        return torch.ops.skipsearch.f32_panel_linear(x, w, bias, n)


class Int4WoLinear(LowbitLinear):
    """int4 weights in groups of ``group_size`` inputs, one scale per output feature and group (zero point
    0, as the int4 scheme's symmetric mapping); fp32 activations (``skipsearch::int4_wo_linear``)."""

    _pack = staticmethod(pack_int4)  # [panels, K / 2, 32] uint8 (two weights a byte), scales [panels, G, 32] fp32
    STREAMED = ("packed", "scales")

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        check_lowbit()
        self.out_features, self.in_features = q.shape
        self.group_size = self.in_features // scales.shape[1]
        packed, packed_scales = self._pack(q, scales)
        self.register_buffer("packed", packed)
        self.register_buffer("scales", packed_scales)
        self._keep_bias(bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = GROUP):
        return cls(*quantize_int4(linear.weight, group_size), bias_of(linear))

    @staticmethod
    def _run(x, w, scales, bias, n):
        return torch.ops.skipsearch.int4_wo_linear(x, w, scales, bias, n)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}"


class Int8DqLinear(Int8WoLinear):
    """The int8 scheme's weights (one scale per output feature) times activations quantized to int8 per block of
    32 inputs at each call, on the CPU's VNNI dot products (``skipsearch::int8_dq_linear``, ``csrc/dq.cpp``): fp32
    in and out. The weights are ``Int8WoLinear``'s, laid out for the instruction; only the activations are rounded,
    as llama.cpp's Q8_0 rounds them."""

    BLOCK = 32  # inputs per activation block
    _pack = staticmethod(pack_int8_vnni)  # [panels, K / 4, 128] uint8, q + 128

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        if q.shape[1] % self.BLOCK:
            raise ValueError(f"int8 activations go in blocks of {self.BLOCK} inputs; this linear has {q.shape[1]}")
        super().__init__(q, scale, bias)

    @classmethod
    def fits(cls, linear: nn.Linear) -> bool:
        return linear.in_features % cls.BLOCK == 0

    @staticmethod
    def _run(x, w, scale, bias, n):
        return torch.ops.skipsearch.int8_dq_linear(x, w, scale, bias, n)


class Int4DqLinear(Int4WoLinear):
    """The int4 scheme's weights (one scale per output feature and group) times activations quantized to int8 per
    group at each call, on the CPU's VNNI dot products (``skipsearch::int4_dq_linear``, ``csrc/dq.cpp``): fp32 in
    and out, as llama.cpp's Q4_0 product takes Q8_0 activations."""

    _pack = staticmethod(pack_int4_vnni)  # [panels, K / 8, 128] uint8, two weights a byte; scales as Int4WoLinear's

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        if (q.shape[1] // scales.shape[1]) % 8:
            raise ValueError(f"int4 activations go in groups of a multiple of 8 inputs; got "
                             f"{q.shape[1] // scales.shape[1]}")
        super().__init__(q, scales, bias)

    @classmethod
    def fits(cls, linear: nn.Linear, group_size: int = GROUP) -> bool:
        return group_size % 8 == 0 and linear.in_features % group_size == 0

    @staticmethod
    def _run(x, w, scales, bias, n):
        return torch.ops.skipsearch.int4_dq_linear(x, w, scales, bias, n)
