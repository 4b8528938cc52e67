"""Parts of a model's decoder stack run on their own, for drafters that work between layers (CLaSp's layer-by-layer
search, FractalLLM's compressed layers, a subset LM head): ``StackParts``, which ``SkippableModel`` inherits. Each
runs the HF model's own modules; none writes a cache it does not crop back."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from skipsearch.config import DraftConfig
from skipsearch.kv_cache import LayerFrame, PrefixKV
from skipsearch.model.stand_ins import SubsetHead


class StackParts:
    """The stack's parts on a ``SkippableModel`` (its ``hf``, ``layers``, ``device``, ``dtype``, ``forward``,
    ``drafting``, ``cache_kwargs`` and ``cache_lengths``): single layers, the residual stream, the head."""

    @torch.inference_mode()
    def run_layer(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor, cache, *,
                  skip: str | None = None) -> torch.Tensor:
        """Run decoder layer ``layer`` on Q independent states ``hidden`` [Q, H] at ``positions`` [Q].

        Each state attends to the cached KV of the positions before its own and to its own KV, as a
        draft token does, and never to the other Q-1 states: a mask over [cache | Q] lets them share
        one call and one cache instead of Q copies (CLaSp's "sequence parallel", §3.6). What the call
        appends to ``cache`` is cropped off again. ``skip`` ("attn" or "mlp") runs the layer with
        that sublayer skipped. Sliding-window attention is not applied here.
        """
        q = hidden.shape[0]
        pos = positions.to(self.device).view(1, q)  # [1, Q]
        before = self.cache_lengths(cache)[layer] if cache is not None and layer < len(cache.layers) else 0
        see_cache = torch.arange(before, device=self.device).unsqueeze(0) < pos.view(q, 1)  # [Q, C]
        see_self = torch.eye(q, dtype=torch.bool, device=self.device)  # [Q, Q]
        mask = torch.cat([see_cache, see_self], dim=1)[None, None]  # [1, 1, Q, C+Q]; True = attend
        h = hidden.to(self.device, self.dtype).unsqueeze(0)  # [1, Q, H]
        rope = self.hf.model.rotary_emb(h, position_ids=pos)
        if skip not in (None, "attn", "mlp"):
            raise ValueError(f"skip must be None, 'attn' or 'mlp', got {skip!r}")
        swap = {"attn": DraftConfig(skip_attn=(layer,)), "mlp": DraftConfig(skip_mlp=(layer,))}.get(skip)
        with self.drafting(swap) if swap is not None else contextlib.nullcontext():
            out = self.layers[layer](h, attention_mask=mask, position_ids=pos, **self.cache_kwargs(cache, layer=True),
                                     use_cache=cache is not None, position_embeddings=rope)
        if cache is not None and layer < len(cache.layers):
            entry = cache.layers[layer]
            if getattr(entry, "keys", None) is not None and entry.keys.dim() == 4:
                entry.keys, entry.values = entry.keys[..., :before, :], entry.values[..., :before, :]
        return (out[0] if isinstance(out, tuple) else out)[0]  # [Q, H]

    @torch.inference_mode()
    def hidden_states(self, token_ids: torch.Tensor, *, start: int = 0, cache=None) -> tuple[torch.Tensor, ...]:
        """Hidden states after each layer for ``token_ids``: L+1 tensors [T, H] (embeddings first)."""
        ids = token_ids.view(1, -1).to(self.device)
        positions = torch.arange(start, start + ids.shape[1], device=self.device).unsqueeze(0)
        out = self.hf.model(
            input_ids=ids, position_ids=positions, **self.cache_kwargs(cache), use_cache=cache is not None,
            output_hidden_states=True,
        )
        return tuple(h[0] for h in out.hidden_states)

    # -- running parts of the stack (for drafters that work between layers, e.g. FractalLLM) -------------
    @property
    def embedding(self) -> nn.Module:
        return self.hf.get_input_embeddings()

    @property
    def final_norm(self) -> nn.Module:
        return self.hf.model.norm

    @property
    def lm_head(self) -> nn.Module:
        return self.hf.get_output_embeddings()

    def subset_head(self, ids: torch.Tensor, *, convert: Callable[[nn.Linear], nn.Module] | None = None) -> nn.Module:
        """A draft head that computes logits for token ``ids`` [V'] only (``SubsetHead``); run it with
        ``draft_head``. It copies those rows of the LM head, so build it once and keep it. ``convert`` turns
        the rows' Linear into a stand-in (a reduced-precision copy) before it is kept."""
        head = self.lm_head
        if isinstance(head, SubsetHead):
            raise RuntimeError("subset_head() needs the full LM head: call it outside draft_head()")
        ids = ids.to(head.weight.device, torch.long)
        with torch.no_grad():
            weight = head.weight.index_select(0, ids).contiguous()  # [V', H]
            bias = head.bias.index_select(0, ids) if getattr(head, "bias", None) is not None else None
            proj = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device,
                             dtype=weight.dtype)
            proj.weight = nn.Parameter(weight, requires_grad=False)
            if bias is not None:
                proj.bias = nn.Parameter(bias, requires_grad=False)
        return SubsetHead(convert(proj) if convert is not None else proj, ids, head.weight.shape[0])

    @contextlib.contextmanager
    def draft_head(self, head: nn.Module | None) -> Iterator[None]:
        """Run the model with ``head`` in place of its LM head (None: the full head); always puts the
        full head back. The final norm still runs before it, so ``forward`` feeds it normed states."""
        if head is None:
            yield
            return
        full = self.hf.get_output_embeddings()
        try:
            self._partial += 1
            self.hf.set_output_embeddings(head)
            yield
        finally:
            self.hf.set_output_embeddings(full)
            self._partial -= 1

    def frame(self, *, start: int, length: int) -> LayerFrame:
        """Rotary embeddings and the causal mask for windows of up to ``length`` tokens at positions
        ``start``.., which attend to the ``start`` earlier positions held in a KV view (none when
        ``start`` is 0). Built once per draft pass; ``LayerFrame.take`` slices it per window."""
        positions = torch.arange(start, start + length, device=self.device).unsqueeze(0)  # [1, length]
        probe = torch.empty(0, device=self.device, dtype=self.dtype)  # rotary reads only its dtype and device
        cos, sin = self.hf.model.rotary_emb(probe, positions)  # [1, length, head_dim] each
        keys = torch.arange(start + length, device=self.device)  # [start + length]
        mask = keys.unsqueeze(0) <= positions.view(-1, 1)  # [length, start + length]: True = attend
        return LayerFrame(start, cos, sin, mask[None, None])

    @torch.inference_mode()
    def run_layers(
        self, hidden: torch.Tensor, layers, *, frame: LayerFrame, context: PrefixKV | None = None
    ) -> torch.Tensor:
        """Run ``hidden`` [T, H] through ``layers`` (this model's decoder layers, or copies of them that
        keep their ``layer_idx``) at the frame's positions; attention also reads ``context``'s KV.

        Nothing is written to any cache: ``context`` is a read-only view (see ``PrefixKV``).
        """
        T = hidden.shape[0]
        position_embeddings, mask = frame.take(T)
        h = hidden.unsqueeze(0)  # [1, T, H]
        kv = self.cache_kwargs(context, layer=True)
        for layer in layers:
            h = layer(h, attention_mask=mask, position_embeddings=position_embeddings, **kv,
                      use_cache=context is not None)
            h = h[0] if isinstance(h, tuple) else h  # older transformers return (hidden, ...)
        return h[0]

    @staticmethod
    def prefix_kv(cache, length: int) -> PrefixKV:
        return PrefixKV(cache, length)
