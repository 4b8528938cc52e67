"""Sibling products as one call: the stand-ins that read the same input (a layer's query, key and value
projections; its gate and up projections) run one product over their weights together in a compiled graph, as
serving engines fuse them (one QKV product, one gate-up product), without touching the model's code.

When linears are swapped for stand-ins (``convert.swap_linears``), the children of one parent named as siblings
(``SIBLINGS``) that are stand-ins of one kind, with the same inputs (and int4 group) and whole panels of outputs,
keep each of their packed tensors (weights, scales, biases) in one buffer, back to back (``share_storage``): each
module holds its own slice, and the whole buffers too. Eagerly each still runs its own product, on its slice.
Compiled, the first of them called runs the whole product on its input and each keeps its columns of it: the others,
called next on the same input, take theirs from that one call, whatever their order. Only named siblings are
grouped: a stand-in that reads another input (an attention's output projection beside q, k, v) would make a call
nothing merges, and pay for the whole product alone.

Why: each product call pays a fixed price (its activations quantized again, a parallel region opened and joined,
an output allocated, the weight stream started anew). Measured on the AVX-512 Xeon in
``studies/sibling-products-cpu.md``. The outputs are the same: each output column comes from the same weights and
the same (quantized) input row, by the same loop, whichever call it is in.
"""

from __future__ import annotations

import torch
from torch import nn

from skipsearch.kernels.lowbit.modules import LowbitLinear, SiblingGroup
from skipsearch.kernels.lowbit.quant import PANEL

# the child names that read one input, per family (HF's Llama, Mistral, Qwen2, Gemma, Phi-3 and others name them
# so): each tuple's members found in one parent are grouped, in this order
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _key(m: nn.Module) -> tuple | None:
    """What stand-ins must share to run as one product, or None for a module that cannot."""
    if not isinstance(m, LowbitLinear) or m.out_features % PANEL or m.columns is not None:
        return None
    return type(m), m.in_features, getattr(m, "group_size", None), m.bias is None


def share_storage(mods: list[LowbitLinear]) -> None:
    """Put each packed tensor of ``mods`` (one kind, one input size, whole panels) in one buffer, back to back:
    each module keeps a view of its own slice, and the whole buffer (``siblings_<name>``) and its columns for its
    compiled calls."""
    names = (*mods[0].STREAMED, "bias")
    total = sum(m.out_features for m in mods)
    for name in names:
        parts = [getattr(m, name) for m in mods]
        whole = None if parts[0] is None else torch.cat(parts)
        at = 0
        for m, part in zip(mods, parts, strict=True):
            if whole is not None:
                setattr(m, name, whole[at:at + part.shape[0]])
                at += part.shape[0]
            m.register_buffer(f"siblings_{name}", whole, persistent=False)
    start, group = 0, SiblingGroup(len(mods))
    for m in mods:
        m.columns = (start, start + m.out_features, total)
        m.sibling_group = group
        start += m.out_features


def share_siblings(module: nn.Module) -> None:
    """For every module under ``module`` (itself included): its children named as siblings (``SIBLINGS``) that
    are stand-ins of one kind and input (``_key``) share their storage (``share_storage``)."""
    for parent in module.modules():
        for names in SIBLINGS:
            mods = [getattr(parent, name, None) for name in names]
            keys = {_key(m) for m in mods}
            if len(keys) == 1 and None not in keys:
                share_storage(mods)
