"""FractalLLM's compressed copy of the model: its decoder layers, final norm, LM head and embedding in 8 bits.

Quantization (Appendix C, 8-bit): ``int8-dynamic`` is torch's dynamic quantization (per-channel
int8 weights, activations quantized on the fly; CPU), ``int8-weight-only`` stores int8 weights with
per-row scales and dequantizes per call (any device), ``bnb-int8`` is bitsandbytes' LLM.int8 (CUDA,
when installed), ``none`` uses the full-precision modules themselves (an ablation; adds no memory).
``auto`` picks int8-dynamic on CPU, bnb-int8 on CUDA when importable, else int8-weight-only.
"""


from __future__ import annotations

import copy
import warnings
import weakref

import torch
from torch import nn

from skipsearch.methods.fractal.params import resolve_scheme
from skipsearch.model.skippable import SkippableModel


def _quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per row: (int8 weights, scales in the weight's dtype)."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # [rows]
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale.to(weight.dtype)


class Int8Linear(nn.Module):
    """Weight-only int8 (symmetric, one scale per output row), dequantized at each call."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        qweight, scale = _quantize_rows(linear.weight)  # [out, in], [out]
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.qweight.to(x.dtype) * self.scale.to(x.dtype)[:, None]  # [out, in]
        return nn.functional.linear(x, weight, self.bias)


class Int8Embedding(nn.Module):
    """Weight-only int8 embedding table (one scale per token row)."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        qweight, scale = _quantize_rows(embedding.weight)  # [V, H], [V]
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.qweight[ids].to(self.scale.dtype) * self.scale[ids].unsqueeze(-1)  # [..., H]


def _quantize_linears(module: nn.Module, scheme: str) -> nn.Module:
    """A quantized copy of ``module``: every nn.Linear inside becomes 8-bit; the original is untouched."""
    module = copy.deepcopy(module)
    if scheme == "int8-dynamic":
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        with warnings.catch_warnings():  # torch marks torch.ao.quantization deprecated; it is what runs here
            warnings.simplefilter("ignore")
            if isinstance(module, nn.Linear):
                return quantize_dynamic(nn.Sequential(module), {nn.Linear: per_channel_dynamic_qconfig},
                                        dtype=torch.qint8)[0]
            return quantize_dynamic(module, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                                    inplace=True)
    make = Int8Linear if scheme == "int8-weight-only" else _bnb_linear
    if isinstance(module, nn.Linear):
        return make(module)
    for name, child in list(module.named_modules()):
        if isinstance(child, nn.Linear):
            parent_name, _, attr = name.rpartition(".")
            setattr(module.get_submodule(parent_name) if parent_name else module, attr, make(child))
    return module


def _bnb_linear(linear: nn.Linear) -> nn.Module:
    """bitsandbytes LLM.int8 linear (quantizes when moved to the GPU). Not exercised by the CPU tests."""
    import bitsandbytes as bnb

    device = linear.weight.device
    out = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              has_fp16_weights=False, threshold=6.0)
    out.weight = bnb.nn.Int8Params(linear.weight.detach().cpu().clone(), requires_grad=False,
                                   has_fp16_weights=False)
    if linear.bias is not None:
        out.bias = nn.Parameter(linear.bias.detach().cpu().clone(), requires_grad=False)
    return out.to(device)


def _module_bytes(module: nn.Module) -> int:
    """Bytes held by a module's own tensors, quantized and packed weights included."""
    total = 0
    for m in module.modules():
        packed = getattr(m, "_packed_params", None)
        if packed is not None and hasattr(packed, "_weight_bias"):
            weight, bias = packed._weight_bias()
            total += weight.int_repr().numel() * weight.int_repr().element_size()
            if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
                total += weight.q_per_channel_scales().numel() * 8 + weight.q_per_channel_zero_points().numel() * 8
            total += 0 if bias is None else bias.numel() * bias.element_size()
        for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)):
            total += t.numel() * t.element_size()
    return total


class CompressedModel:
    """The 8-bit copy a fractal draft runs through: decoder layers, final norm, LM head, embedding.

    Real state (quantized modules), hence a class. The full-precision model is never modified;
    each compressed layer keeps its original's ``layer_idx``, so it reads that layer's prefix KV.
    """

    def __init__(self, sm: SkippableModel, scheme: str) -> None:
        self.scheme = resolve_scheme(scheme, sm.device)
        if self.scheme == "none":  # the ablation: the draft's "compressed" model is the model itself
            self.layers, self.norm, self.lm_head, self.embedding = sm.layers, sm.final_norm, sm.lm_head, sm.embedding
            self.nbytes = 0
            return
        with torch.no_grad():
            self.layers = nn.ModuleList(_quantize_linears(layer, self.scheme) for layer in sm.layers).eval()
            self.norm = copy.deepcopy(sm.final_norm)  # RMSNorm weights stay in full precision (H values)
            self.lm_head = _quantize_linears(sm.lm_head, self.scheme).eval()
            self.embedding = Int8Embedding(sm.embedding).to(sm.device)
        self.nbytes = sum(_module_bytes(m) for m in (self.layers, self.norm, self.lm_head, self.embedding))


_COMPRESSED: weakref.WeakKeyDictionary[SkippableModel, dict[str, CompressedModel]] = weakref.WeakKeyDictionary()


def compressed_model(sm: SkippableModel, scheme: str = "auto") -> CompressedModel:
    """The compressed copy of ``sm`` for ``scheme``, built once per model and scheme."""
    scheme = resolve_scheme(scheme, sm.device)
    per_model = _COMPRESSED.setdefault(sm, {})
    if scheme not in per_model:
        per_model[scheme] = CompressedModel(sm, scheme)
    return per_model[scheme]


def model_bytes(sm: SkippableModel) -> int:
    """Bytes of the full-precision model's parameters and buffers (tied weights counted once)."""
    seen, total = set(), 0
    for t in (*sm.hf.parameters(), *sm.hf.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total
