"""A model's decoder ``nn.Linear`` layers swapped for low-bit stand-ins: a draft copy for the precision method.

Embeddings, norms and everything that is not an ``nn.Linear`` stay as they are; the LM head is converted only
when asked (it is ~20% of a small model's weights, and its argmax decides every drafted token).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from torch import nn

from skipsearch.kernels.lowbit.build import has_vnni
from skipsearch.kernels.lowbit.modules import Int4DqLinear, Int4WoLinear, Int8DqLinear, Int8WoLinear
from skipsearch.kernels.lowbit.quant import GROUP
from skipsearch.kernels.lowbit.siblings import share_siblings

SCHEMES = ("int8", "int4")


def int8_activations() -> bool:
    """Whether the schemes' products take int8 activations here: where the CPU has AVX-512 VNNI, the products of
    ``csrc/dq.cpp`` (one dot-product instruction for 64 weights) stream the weights faster than the weight-only ones,
    which widen every weight to fp32 (``studies/vnni-draft-cpu.md``). Elsewhere the weight-only products run."""
    return has_vnni()


def lowbit_linear(linear: nn.Linear, scheme: str, *, group_size: int = GROUP) -> nn.Module:
    """``linear`` as the ``scheme`` stand-in (int8 or int4): on int8 activations (Int8DqLinear, Int4DqLinear)
    where ``int8_activations()`` and the linear's inputs fit their blocks, else weight-only (Int8WoLinear,
    Int4WoLinear). The weights are the same either way."""
    if scheme == "int8":
        if int8_activations() and Int8DqLinear.fits(linear):
            return Int8DqLinear.from_linear(linear)
        return Int8WoLinear.from_linear(linear)
    if scheme == "int4":
        if int8_activations() and Int4DqLinear.fits(linear, group_size):
            return Int4DqLinear.from_linear(linear, group_size)
        return Int4WoLinear.from_linear(linear, group_size)
    raise ValueError(f"the lowbit kernels run {' and '.join(SCHEMES)}, not {scheme!r:.40}")


def swap_linears(module: nn.Module, make: Callable[[nn.Linear], nn.Module], keep: nn.Module | None = None) -> None:
    """Swap, in place, every ``nn.Linear`` under ``module`` (not ``module`` itself) but ``keep`` for ``make(it)``;
    stand-ins that read the same input (a layer's q, k, v; its gate and up) then keep their packed weights back to
    back, so a compiled graph runs them as one product (``siblings.py``)."""
    for name, child in list(module.named_modules()):
        if isinstance(child, nn.Linear) and child is not keep:
            parent_name, _, attr = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            setattr(parent, attr, make(child))
    share_siblings(module)


def _swap(module: nn.Module, scheme: str, group_size: int, keep: nn.Module | None = None) -> nn.Module:
    """Swap, in place, every ``nn.Linear`` under ``module`` but ``keep`` for its ``scheme`` stand-in."""
    if scheme not in SCHEMES:
        raise ValueError(f"the lowbit kernels run {' and '.join(SCHEMES)}, not {scheme!r:.40}")
    if isinstance(module, nn.Linear):
        return lowbit_linear(module, scheme, group_size=group_size)
    swap_linears(module, lambda linear: lowbit_linear(linear, scheme, group_size=group_size), keep)
    return module


def lowbit_linears(module: nn.Module, scheme: str, *, group_size: int = GROUP) -> nn.Module:
    """A copy of ``module`` (an attention, an MLP, a head) with every ``nn.Linear`` in ``scheme``."""
    return _swap(module if isinstance(module, nn.Linear) else copy.deepcopy(module), scheme, group_size)


def lowbit_model(model: nn.Module, scheme: str, *, quant_head: bool = False, group_size: int = GROUP) -> nn.Module:
    """A copy of a causal LM whose decoder Linears run the ``scheme`` kernel, and its LM head (HF's
    ``get_output_embeddings()``) too when ``quant_head``. Embeddings are never converted."""
    out = copy.deepcopy(model)
    head = None if quant_head else out.get_output_embeddings()
    return _swap(out, scheme, group_size, keep=head)


def fp32_linears(module: nn.Module) -> nn.Module:
    """``module`` with every ``Int8WoLinear`` (an int8 target's linears: model/target.py) as an ``nn.Linear`` of the
    fp32 weights its product multiplies by (q * s, exact), a copy where it holds any, else ``module`` itself: what
    a draft that copies the model's weights (a precision draft's int4 copy, say) quantizes from, so that a draft
    of the int8 target is a copy of the int8 target."""
    import torch

    def dequantized(m: Int8WoLinear) -> nn.Linear:
        q = m.packed.transpose(1, 2).reshape(-1, m.in_features)[: m.out_features]  # [N, K] int8
        out = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
        with torch.no_grad():
            out.weight.copy_(q.float() * m.scale[: m.out_features, None])
            if m.bias is not None:
                out.bias.copy_(m.bias)
        return out.eval().requires_grad_(False)

    if type(module) is Int8WoLinear:
        return dequantized(module)
    if not any(type(m) is Int8WoLinear for m in module.modules()):
        return module
    out = copy.deepcopy(module)
    for name, child in list(out.named_modules()):
        if type(child) is Int8WoLinear:
            parent_name, _, attr = name.rpartition(".")
            setattr(out.get_submodule(parent_name) if parent_name else out, attr, dequantized(child))
    return out
