"""The modules the adapter swaps in while drafting (models.SkippableModel): a skipped sublayer, a skipped layer,
and a draft LM head over part of the vocabulary. Each keeps the shape of what it replaces, so the HF modeling
code runs around it unchanged."""

from __future__ import annotations

import torch
from torch import nn


class SkippedSublayer(nn.Module):
    """Stands in for a skipped attention or MLP: contributes zero to the residual stream.

    Returning a 0-dim zero keeps the cost to one broadcast add; attention returns a
    (output, weights) pair, the MLP a tensor, and this mirrors whichever it replaces.
    Because it never calls ``cache.update``, a skipped attention appends no KV.
    """

    def __init__(self, returns_pair: bool) -> None:
        super().__init__()
        self.returns_pair = returns_pair

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        zero = hidden_states.new_zeros(())
        return (zero, None) if self.returns_pair else zero


class SkippedLayer(nn.Module):
    """Stands in for a decoder layer whose attention and MLP are both skipped (norms too)."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return hidden_states


class SubsetHead(nn.Module):
    """A draft LM head over part of the vocabulary (FR-Spec's trimmed head): logits for ``ids`` only.

    ``weight`` [V', H] holds the full head's rows for ``ids`` (a copy, so that one matrix product
    reads V' rows instead of V). Every other token gets -inf, so the logits keep the full head's
    shape [..., V]: argmax and softmax see the subset alone, and the q a sampled draft reports is
    zero outside it, which keeps rejection sampling exact.
    """

    def __init__(self, proj: nn.Module, ids: torch.Tensor, vocab: int) -> None:
        super().__init__()
        # proj: the head's rows for ``ids`` as a Linear, or a reduced-precision stand-in for one (precision drafts)
        self.proj, self.ids, self.vocab = proj, ids, vocab

    @property
    def weight(self) -> torch.Tensor | None:
        return getattr(self.proj, "weight", None)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # .to: a model spread over devices may hand the head its input from another one
        sub = self.proj(hidden_states.to(self.ids.device))  # [..., V']
        out = sub.new_full((*sub.shape[:-1], self.vocab), float("-inf"))  # [..., V]
        return out.index_copy_(-1, self.ids, sub)


__all__ = ["SkippedLayer", "SkippedSublayer", "SubsetHead"]
