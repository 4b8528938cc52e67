"""The draft's reduced-precision copy of the model: per-layer attention and MLP stand-ins and an LM head.

Built once per model and scheme and kept (a search evaluates many candidates of one scheme). Its low-bit weights
live in one block of huge pages, in the order a draft reads them (``kernels/lowbit/arena.py``). Only the
decoder sublayers and the head are copied; embeddings, norms and the KV cache are the model's own, so
the draft reads the full model's context KV, as a layer-skip draft does, and keeps no cache of its own.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from torch import nn

from skipsearch.config import ConfigError
from skipsearch.kernels.lowbit.arena import pack
from skipsearch.methods.precision.linears import check_scheme, quantize_module, weight_bytes
from skipsearch.methods.precision.params import device_scheme


@dataclass
class QuantizedCopy:
    scheme: str
    attn: tuple[nn.Module, ...]  # layer i's attention in the scheme
    mlp: tuple[nn.Module, ...]  # layer i's MLP in the scheme
    head: nn.Module  # the LM head in the scheme
    bytes: int  # memory the copy adds
    full_bytes: int  # what the same sublayers and head take in the model's own dtype
    heads: dict = field(default_factory=dict)  # (quantized?, subset sha256) -> a trimmed draft head, built once

    def stand_ins(self, attn_layers, mlp_layers) -> dict[str, dict[int, nn.Module]]:
        """``SkippableModel.substituted`` keyword arguments for these quantized layers."""
        return {"attn": {i: self.attn[i] for i in attn_layers}, "mlp": {i: self.mlp[i] for i in mlp_layers}}


def draft_head(sm, qcopy: QuantizedCopy, params) -> nn.Module | None:
    """The head ``params`` (PrecisionParams) draft with: the scheme's copy of the LM head or the model's own
    (None), trimmed to ``params``' token subset when it has one (built once per copy and subset)."""
    subset = params.head_subset
    if subset.token_ids is None:
        return qcopy.head if params.quant_head else None
    key = (params.quant_head, subset.vocab_sha256)
    if key not in qcopy.heads:
        import torch

        ids = subset.token_ids
        vocab = sm.vocab_size
        if ids[-1] >= vocab:
            raise ConfigError(f"method_params.vocab_ids has token {ids[-1]}, but the model's vocabulary has "
                              f"{vocab} tokens (0..{vocab - 1})")
        convert = (lambda linear: quantize_module(linear, qcopy.scheme)) if params.quant_head else None
        qcopy.heads[key] = sm.subset_head(torch.tensor(ids), convert=convert)
    return qcopy.heads[key]


_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {scheme: QuantizedCopy}


def quantized_copy(sm, scheme: str) -> QuantizedCopy:
    """``sm``'s copy in ``scheme``, built on first use (a one-line ConfigError if the device has no kernel)."""
    copies = _COPIES.setdefault(sm, {})
    if scheme not in copies:
        check_scheme(scheme, sm.device)
        attn = tuple(quantize_module(layer.self_attn, scheme) for layer in sm.layers)
        mlp = tuple(quantize_module(layer.mlp, scheme) for layer in sm.layers)
        head = quantize_module(sm.lm_head, scheme)
        pack([*(m for pair in zip(attn, mlp, strict=True) for m in pair), head])  # one block, the draft's order
        parts = [*attn, *mlp, head]
        full = sum(weight_bytes(layer.self_attn) + weight_bytes(layer.mlp) for layer in sm.layers)
        copies[scheme] = QuantizedCopy(scheme, attn, mlp, head, sum(map(weight_bytes, parts)),
                                       full + weight_bytes(sm.lm_head))
    return copies[scheme]


_ASSISTANTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (HF model, scheme)


def assistant_copy(sm):
    """The whole HF model with every decoder Linear and the head in the device's draft scheme (a second
    model: its own embeddings, its own KV cache, as HF's assisted generation needs)."""
    if sm not in _ASSISTANTS:
        scheme = device_scheme(sm.device)
        check_scheme(scheme, sm.device)
        assistant = quantize_module(sm.hf, scheme).eval()
        pack([assistant])
        _ASSISTANTS[sm] = (assistant, scheme)
    return _ASSISTANTS[sm]
