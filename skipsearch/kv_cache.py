"""KV-cache helpers under the adapter and the kernels: cropping a cache, reading its lengths, a read-only view of
its prefix (``PrefixKV``) and the positions, rotary embeddings and mask a draft pass shares (``LayerFrame``).

They work on transformers' ``Cache`` objects through their layers (``keys``/``values`` of a DynamicCache layer,
a StaticCache layer's own length and ``crop``), so they serve both the adapter's DynamicCache and the compiled
kernel's StaticCache. The rules the decoder relies on are in models.py's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def is_static(layer) -> bool:
    """A StaticCache layer (transformers 5): fixed tensors, and a length it keeps as a tensor."""
    return isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)


def crop(cache, length: int) -> None:
    """Cut every layer's KV back to ``length`` positions (rejected or draft-only entries go). A static
    layer keeps its tensors and rewinds its length, through its own ``crop``; the stale entries past it
    are masked by position and overwritten by the next forward."""
    for layer in cache.layers:
        if is_static(layer):
            held = int(layer.get_seq_length())
            if held > length:
                layer.crop(length - held)
            continue
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.dim() == 4 and keys.shape[-2] > length:
            layer.keys = keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def cache_lengths(cache) -> tuple[int, ...]:
    """Per-layer KV length, for tests and assertions."""
    out = []
    for layer in cache.layers:
        if is_static(layer):
            out.append(int(layer.get_seq_length()))
            continue
        keys = getattr(layer, "keys", None)
        out.append(0 if keys is None or keys.dim() != 4 else int(keys.shape[-2]))
    return tuple(out)


@dataclass(frozen=True)
class LayerFrame:
    """Positions, rotary embeddings and causal mask shared by the windows of one draft pass.

    A window's first T rows are the frame's first T positions, and row i attends to keys
    0..context+i whatever T is, so every window is a top-left slice of the one frame.
    """

    context: int  # positions before the window, held in the KV view it attends to
    cos: torch.Tensor  # [1, length, head_dim]
    sin: torch.Tensor  # [1, length, head_dim]
    mask: torch.Tensor  # [1, 1, length, context + length], bool, True = attend

    def take(self, T: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        if T > self.cos.shape[1]:
            raise ValueError(f"a window of {T} tokens does not fit a frame of {self.cos.shape[1]}")
        return (self.cos[:, :T], self.sin[:, :T]), self.mask[..., :T, : self.context + T]


class PrefixKV:
    """The first ``length`` positions of a KV cache, read-only, in the role of a cache.

    Attention calls ``update(key, value, layer_idx)`` and attends to what it returns; here that is
    the prefix followed by the window's own KV, which is then forgotten. So layers (or compressed
    copies of them) can run on top of the committed prefix any number of times without writing
    to, or needing a crop of, the real cache.
    """

    def __init__(self, cache, length: int) -> None:
        self.length = length
        self._kv: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        for layer in cache.layers:
            keys = getattr(layer, "keys", None)
            if keys is None or keys.dim() != 4 or length == 0:
                self._kv.append(None)
                continue
            if keys.shape[-2] < length:
                raise ValueError(f"the cache holds {keys.shape[-2]} positions, fewer than the prefix's {length}")
            self._kv.append((keys[..., :length, :], layer.values[..., :length, :]))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        kv = self._kv[layer_idx]
        if kv is None:
            return key_states, value_states
        return torch.cat([kv[0], key_states], dim=-2), torch.cat([kv[1], value_states], dim=-2)


__all__ = ["LayerFrame", "PrefixKV", "cache_lengths", "crop", "is_static"]
