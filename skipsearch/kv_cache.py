"""KV-cache helpers under the adapter and the kernels: cropping a cache, reading its lengths, a read-only view of
its prefix (``PrefixKV``) and the positions, rotary embeddings and mask a draft pass shares (``LayerFrame``).

They work on transformers' ``Cache`` objects through their layers (``keys``/``values`` of a DynamicCache layer,
a StaticCache layer's own length and ``crop``), so they serve both the adapter's DynamicCache and the compiled
kernel's StaticCache. The rules the decoder relies on are in model/skippable.py's docstring.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


def is_static(layer) -> bool:
    """A StaticCache layer (transformers 5): fixed tensors, and a length it keeps as a tensor."""
    return isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)


def crop(cache, length: int) -> None:
    """Cut every layer's KV back to ``length`` positions (rejected or draft-only entries go). A static
    layer keeps its tensors and rewinds its length, through its own ``crop``; the stale entries past it
    are masked by position and overwritten by the next forward."""
    static = [layer for layer in cache.layers if is_static(layer)]
    if static:
        lengths = [layer.cumulative_length if layer.is_initialized else layer.cumulative_length.new_zeros(())
                   for layer in static]
        one_device = len({t.device for t in lengths}) == 1  # else a model spread over GPUs: a read per layer
        # read back at once where they can be: a read per layer cost 0.15 ms of every compiled step on a CPU
        held = torch.stack(lengths).tolist() if one_device else [int(t) for t in lengths]
        for layer, n in zip(static, held, strict=True):
            if n > length:
                layer.crop(length - n)
    for layer in cache.layers:
        if is_static(layer):
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


# -- the batched engine's cache: one slot per position, per row -------------------------------------------------
@functools.cache
def _row_layer_class():
    """``RowLayer``: a transformers ``StaticLayer`` that writes each row's tokens at that row's own positions (made
    on first use, so importing this module does not import transformers' cache code)."""
    from transformers.cache_utils import StaticLayer

    class RowLayer(StaticLayer):
        """A static layer of [B, heads, capacity, head_dim] in which slot s of row b holds row b's token at
        position s: ``update`` scatters the new KV to the ``position_ids`` [B, T] the modeling code passes its
        attention (every supported model passes them through to ``cache.update``). It keeps no length: what
        a row may attend to is decided by the mask (``row_mask``), never by the layer."""

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            positions = (kwargs.get("kwargs") or {}).get("position_ids", kwargs.get("position_ids"))
            if positions is None:
                raise RuntimeError("a row cache needs the forward's position_ids passed to cache.update; this "
                                   "model's attention does not pass them")
            at = positions.view(positions.shape[0], 1, -1, 1)  # [B, 1, T, 1]
            self.keys.scatter_(2, at.expand(-1, self.num_heads, -1, self.k_head_dim), key_states)
            self.values.scatter_(2, at.expand(-1, self.num_heads, -1, self.v_head_dim), value_states)
            return self.keys, self.values

    RowLayer.__qualname__ = "RowLayer"  # ``skipsearch.kv_cache.RowLayer`` (``__getattr__``): a precompiled call
    return RowLayer  # names the class of what it reads, and a later process finds it there


def __getattr__(name: str):
    if name == "RowLayer":
        return _row_layer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def row_cache(config, *, rows: int, capacity: int, dtype: torch.dtype, device: torch.device):
    """The batched engine's KV cache: a transformers ``StaticCache`` of ``rows`` x ``capacity`` slots in which every
    row writes its token at position p to slot p (``RowLayer``). So rows of different prompt lengths and different
    acceptance need no bookkeeping of slots: a row attends to the slots up to each query's own position
    (``row_mask``); a rejected draft's slot, a prompt's pad and a finished row's dummies lie past the row's
    position, masked, until the row's next real token at that position overwrites them. The shapes are fixed (a
    compiled batched graph reads the same tensors every step) and the memory is ``rows x capacity`` slots, however
    many drafts were rejected. The mask ignores sliding windows: a config with a window shorter than ``capacity``
    is refused (ValueError)."""
    from transformers import StaticCache

    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and 0 < window < capacity and getattr(config, "use_sliding_window", True):
        raise ValueError(f"batched decoding attends to every earlier position, and this model slides a window of "
                         f"{window} (< {capacity} positions): decode it with --batch-size 1")
    cache = StaticCache(config=config, max_cache_len=capacity)
    layer = _row_layer_class()
    cache.layers = [layer(max_cache_len=capacity) for _ in cache.layers]
    return guard_addresses(allocate(cache, config, rows=rows, dtype=dtype, device=device))


def static_cache(config, *, capacity: int, dtype: torch.dtype, device: torch.device):
    """A transformers ``StaticCache`` of ``capacity`` positions for one sequence, its tensors allocated now
    (``allocate``)."""
    from transformers import StaticCache

    return allocate(StaticCache(config=config, max_cache_len=capacity), config, rows=1, dtype=dtype, device=device)


def allocate(cache, config, *, rows: int, dtype: torch.dtype, device: torch.device):
    """``cache``'s tensors allocated now, for ``rows`` rows of ``config``'s key/value heads, and ``cache`` returned.
    transformers allocates a static cache in its first forward, which may be a compiled one: a compiled graph then
    reads tensors it made itself, and under CUDA graphs they live in the graphs' memory pool, which the next replay
    overwrites."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache.early_initialization(rows, heads, head_dim, dtype, device)
    return cache


def guard_addresses(cache):
    """Make dynamo guard on which tensors a compiled graph reads as ``cache``, and return it. transformers marks a
    StaticCache's tensors as static addresses without a guard, so a graph compiled on one cache would run on any
    other cache of the same shapes, reading and writing the first one's tensors: a second compiled kernel built in
    the same process (the same kernel after an eager spell, another of the same block) gave wrong logits or an
    out-of-bounds abort. With the guard, a new cache compiles its own graphs."""
    for tensor in _addressed(cache):
        torch._dynamo.mark_static_address(tensor, guard=True)
    return cache


def _addressed(cache) -> list[torch.Tensor]:
    """The tensors of ``cache`` a compiled graph reads by address: each layer's keys, values and length."""
    return [t for layer in cache.layers for name in ("keys", "values", "cumulative_length")
            if isinstance(t := getattr(layer, name, None), torch.Tensor)]


@contextlib.contextmanager
def unguarded(cache) -> Iterator[None]:
    """``guard_addresses`` undone while held: a precompiled call (``kernels/precompiled.py``) is traced with the
    cache's tensors as plain inputs, since a guarded address is baked into the graph as that very tensor, which a
    later process that loads the call does not have (it crashed there)."""
    marked = [t for t in _addressed(cache) if getattr(t, "_dynamo_static_input_type", None) == "guarded"]
    for tensor in marked:
        tensor._dynamo_static_input_type = "unguarded"
    try:
        yield
    finally:
        for tensor in marked:
            tensor._dynamo_static_input_type = "guarded"


def row_capacity(cache) -> int:
    """Slots per row of a ``row_cache``."""
    return int(cache.layers[0].max_cache_len)


def row_mask(positions: torch.Tensor, capacity: int) -> torch.Tensor:
    """The attention mask of a forward on a ``row_cache``: query (b, t), at position ``positions[b, t]``, attends
    to slots 0 .. positions[b, t] of its own row. [B, 1, T, capacity] bool, True = attend."""
    slots = torch.arange(capacity, device=positions.device)
    return (slots.view(1, 1, 1, -1) <= positions[:, None, :, None])


def cache_parameter(forward: Callable) -> str:
    """The name under which ``forward`` takes the KV cache: ``cache`` where the installed transformers has it
    (``past_key_values`` is then a deprecated alias, removed in 5.40), else ``past_key_values``."""
    try:
        params = inspect.signature(forward).parameters  # follows the deprecation decorators' __wrapped__
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


__all__ = ["LayerFrame", "PrefixKV", "allocate", "cache_lengths", "cache_parameter", "crop", "is_static", "row_cache",
           "row_capacity", "row_mask", "static_cache"]
