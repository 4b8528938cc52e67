"""``layer-skip``'s drafter: the engine's ``LayerSkipDrafter`` (engine.decoding builds it for ``generate(config=...)``),
with FR-Spec's trimmed draft head built once per model and subset."""

from __future__ import annotations

import weakref

import torch

from skipsearch.engine.decoding import LayerSkipDrafter
from skipsearch.methods.base import ParamsError
from skipsearch.methods.layer_skip.params import LayerSkipParams

# -- the trimmed head, built once per model and subset ------------------------------------------------
_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {sha256: head}
_HEADS_KEPT = 8  # per model: a search tries a few sizes; each head is a V' x H copy of the LM head's rows


def subset_head(sm, params: LayerSkipParams):
    """The trimmed draft head ``params`` describe, for ``sm`` (None: the full head); built once and kept."""
    ids = params.token_ids
    if ids is None:
        return None
    vocab = sm.vocab_size
    if ids[-1] >= vocab:
        raise ParamsError(f"{params.method}: method_params.vocab_ids has token {ids[-1]}, but the model's "
                          f"vocabulary has {vocab} tokens (0..{vocab - 1})")
    heads = _HEADS.setdefault(sm, {})
    head = heads.get(params.vocab_sha256)
    if head is None:
        while len(heads) >= _HEADS_KEPT:
            heads.pop(next(iter(heads)))
        head = heads[params.vocab_sha256] = sm.subset_head(torch.tensor(ids))
    return head


__all__ = ["LayerSkipDrafter", "subset_head"]
