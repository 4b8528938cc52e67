"""Model loading and the skippable adapter: the only module that touches transformers internals.

``load_model(name)`` accepts the embedded default model (``smollm2-135m``), a local Hugging Face
directory, an alias of a well-known checkpoint (``llama-2-13b``) or a hub id, both found in the
local Hugging Face cache (checkpoints.py), and returns a ``SkippableModel``. Device and dtype
default to ``auto`` and are checked against free memory before any weight is read (placement.py).

The adapter can skip the attention and/or the MLP of any decoder layer while drafting. It does so
by swapping the sublayer module for one that adds nothing to the residual stream, inside a context
manager that always puts the original modules back; the modeling code itself is never forked.

KV-cache rules the decoder relies on (see decoding.py):
- prefill and verification run the full model, so they write full-model KV for every layer;
- a draft step writes KV only in layers whose attention runs (skipped attention never calls
  ``cache.update``), so layer caches may briefly differ in length while drafting;
- ``crop(cache, n)`` cuts every layer back to ``n`` positions, whatever its length.
Positions are always passed explicitly (``position_ids``), never read off a layer's cache
length, because layer 0's cache may be shorter than the others' in the middle of a draft.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from skipsearch.checkpoints import (
    ALIASES,
    EMBEDDED,
    Checkpoint,
    ModelError,
    ModelInfo,
    cache_dir,
    ensure_embedded,
    find_checkpoint,
    list_models,
    state_fingerprint,
    weights_fingerprint,
)
from skipsearch.config import ConfigError, DraftConfig
from skipsearch.kernels import EAGER, Kernel, check_kernel, inductor_cache_dir, parse_kernel
from skipsearch.notices import route_library_logs
from skipsearch.placement import (
    DEFAULT_MAX_TOKENS,
    DTYPES,
    Placement,
    check_memory,
    checkpoint_dtype,
    choose_placement,
)

# Loading, placing and naming models live in checkpoints.py and placement.py; their public names
# are re-exported here so that ``from skipsearch.models import ...`` stays the one place to look.
__all__ = ["ALIASES", "DEFAULT_MAX_TOKENS", "DEFAULT_MODEL", "DTYPES", "EMBEDDED", "Checkpoint", "ModelError",
           "ModelInfo", "Placement", "SkippableModel", "arch_fingerprint", "cache_dir", "choose_placement",
           "ensure_embedded", "find_checkpoint", "list_models", "load_model", "read_config", "weights_fingerprint"]

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"

# Decoder stacks whose layers are (input_layernorm, self_attn, post_attention_layernorm, mlp)
# around two residual adds. Skipping a sublayer there means adding zero to the residual.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


class _SkippedSublayer(nn.Module):
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


class _SkippedLayer(nn.Module):
    """Stands in for a decoder layer whose attention and MLP are both skipped (norms too)."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return hidden_states


class _SubsetHead(nn.Module):
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


class SkippableModel:
    """A causal LM whose decoder sublayers can be skipped while drafting.

    Holds real state (the HF model, its tokenizer, the swap stand-ins), hence a class.
    """

    def __init__(self, model: nn.Module, tokenizer, *, name: str, placement: Placement | None = None,
                 weights_fingerprint: str | None = None) -> None:
        model_type = getattr(model.config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelError(
                f"model '{name}' has architecture '{model_type}'; skipsearch supports Llama-style decoder stacks: "
                + ", ".join(SUPPORTED_MODEL_TYPES)
            )
        self.hf = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.placement = placement  # how load_model chose device and dtype; None for a model built in memory
        self._weights_fingerprint = weights_fingerprint  # from the checkpoint's files, when it has any
        self.layers: nn.ModuleList = model.model.layers
        self.num_layers = len(self.layers)
        # transformers renamed the forwards' ``past_key_values`` to ``cache`` (5.24 takes both; the old name
        # goes in 5.40): decided once here, the name this install's model and decoder layers take.
        self._cache_name = _cache_parameter(type(model).forward)
        self._layer_cache_name = _cache_parameter(type(self.layers[0]).forward) if self.num_layers else self._cache_name
        self._skip_attn = _SkippedSublayer(returns_pair=True)
        self._skip_mlp = _SkippedSublayer(returns_pair=False)
        self._skip_layer = _SkippedLayer()
        self._drafting = False
        self._partial = 0  # open substituted() / draft_head() / eager() contexts: not the full model's kernel then
        self._compile_draft = False  # inside compiled_draft(): one-token partial forwards may run compiled
        self._eager_only = 0  # open eager() contexts
        self._compiled: _CompiledBlocks | None = None  # the inductor kernel, once use_kernel() built it

    # -- facts about the model ------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.hf.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.get_input_embeddings().weight.dtype

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        ids = self.hf.generation_config.eos_token_id
        if ids is None and self.tokenizer is not None:
            ids = self.tokenizer.eos_token_id
        if ids is None:
            return ()
        return tuple(ids) if isinstance(ids, (list, tuple)) else (int(ids),)

    @property
    def fingerprint(self) -> str:
        """The architecture fingerprint (architecture and ``--model`` string) that schema-1 profiles hold."""
        return arch_fingerprint(self.hf.config, self.name)

    @property
    def weights_fingerprint(self) -> str:
        """A fingerprint of the weights themselves (checkpoints.weights_fingerprint): read from the
        checkpoint's safetensors files, else hashed once from the model in memory."""
        if self._weights_fingerprint is None:
            self._weights_fingerprint = state_fingerprint(self.hf)
        return self._weights_fingerprint

    # -- the draft context ----------------------------------------------------------------
    @contextlib.contextmanager
    def drafting(self, config: DraftConfig) -> Iterator[None]:
        """Run the model with ``config``'s sublayers skipped; always restores the full model."""
        config.check_layers(self.num_layers)
        if self._drafting:
            raise RuntimeError("drafting() contexts do not nest")
        swapped: list[tuple[nn.Module, str, nn.Module]] = []  # (parent, attribute, original)
        both = set(config.skip_attn) & set(config.skip_mlp)
        try:
            self._drafting = True
            for i in both:
                swapped.append((self.layers, str(i), self.layers[i]))
                self.layers[i] = self._skip_layer
            for i in config.skip_attn:
                if i not in both:
                    swapped.append((self.layers[i], "self_attn", self.layers[i].self_attn))
                    self.layers[i].self_attn = self._skip_attn
            for i in config.skip_mlp:
                if i not in both:
                    swapped.append((self.layers[i], "mlp", self.layers[i].mlp))
                    self.layers[i].mlp = self._skip_mlp
            yield
        finally:
            for parent, attr, original in reversed(swapped):
                if isinstance(parent, nn.ModuleList):
                    parent[int(attr)] = original
                else:
                    setattr(parent, attr, original)
            self._drafting = False

    @contextlib.contextmanager
    def substituted(self, *, attn: Mapping[int, nn.Module] | None = None,
                    mlp: Mapping[int, nn.Module] | None = None) -> Iterator[None]:
        """Run the model with stand-ins for some sublayers: ``attn[i]`` for layer i's attention,
        ``mlp[i]`` for its MLP (e.g. reduced-precision copies of them, for a precision draft).

        A stand-in takes the original's inputs and keeps its ``layer_idx``, so a copied attention
        reads and extends the same KV cache. Always puts the originals back. It composes with
        ``drafting`` inside it (a sublayer that ``drafting`` skips need not have a stand-in)."""
        swapped: list[tuple[nn.Module, str, nn.Module]] = []  # (layer, attribute, original)
        try:
            self._partial += 1
            for attr, table in (("self_attn", attn or {}), ("mlp", mlp or {})):
                for i, module in table.items():
                    layer = self.layers[i]
                    swapped.append((layer, attr, getattr(layer, attr)))
                    setattr(layer, attr, module)
            yield
        finally:
            for layer, attr, original in reversed(swapped):
                setattr(layer, attr, original)
            self._partial -= 1

    # -- forward passes -------------------------------------------------------------------
    def cache_kwargs(self, cache, *, layer: bool = False) -> dict[str, object]:
        """``{name: cache}`` for a call of the HF model (or, with ``layer``, of one decoder layer), under
        the KV-cache argument name the installed transformers takes. Code outside this module that
        calls ``sm.hf`` or a layer with a cache passes it this way, never by a literal name."""
        return {self._layer_cache_name if layer else self._cache_name: cache}

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.hf.config)

    # -- kernels: what runs the full model's forwards (skipsearch.kernels) --------------------------
    @property
    def kernel(self) -> Kernel:
        """The kernel the full model's forwards on ``decode_cache()`` run through (eager unless ``use_kernel``)."""
        return self._compiled.kernel if self._compiled is not None else EAGER

    @property
    def kernel_report(self) -> KernelReport | None:
        """How the compiled kernel was built (None for eager): its compile time and graph count."""
        return self._compiled.report() if self._compiled is not None else None

    def use_kernel(self, kernel: Kernel | str, *, capacity: int) -> None:
        """Run the full model's forwards on ``decode_cache()`` through ``kernel`` from now on, for sequences of up
        to ``capacity`` positions (longest prompt + max_new_tokens). A compiled kernel is built and compiled
        here, once per process (a minute or more: it is reported by ``kernel_report``); the caller checks
        ``kernels.check_kernel`` before loading the model, so this only fails on a broken install."""
        kernel = parse_kernel(kernel)
        if not kernel.compiled:
            self._compiled = None
            return
        check_kernel(kernel, self.device.type)
        current = self._compiled
        if current is not None and current.kernel == kernel and current.capacity >= capacity + kernel.chunk:
            return
        self._compiled = _CompiledBlocks(self, kernel, capacity=capacity + kernel.chunk)

    def decode_cache(self, positions: int | None = None):
        """The KV cache one sequence decodes in: with a compiled kernel its StaticCache, rewound to empty
        (``positions``, prompt + max_new_tokens, must fit its capacity: one ConfigError line otherwise);
        else a fresh DynamicCache, as ``new_cache``."""
        if self._compiled is None:
            return self.new_cache()
        return self._compiled.fresh_cache(positions)

    @contextlib.contextmanager
    def eager(self) -> Iterator[None]:
        """Run every forward in this context eagerly, even on the compiled kernel's cache (the cost model's
        per-sublayer arithmetic compares the full model with partial ones in one kernel)."""
        self._partial += 1
        self._eager_only += 1
        try:
            yield
        finally:
            self._partial -= 1
            self._eager_only -= 1

    @contextlib.contextmanager
    def compiled_draft(self) -> Iterator[None]:
        """Let one-token forwards in this context run compiled, on the compiled kernel's cache, with the model as
        it stands (the sublayers and head a draft swapped in): inductor compiles one graph per distinct draft
        model, on its first step, and reuses it after. For drafts whose model is fixed for a whole decode (a
        precision draft's copy), not for searches that try many skip sets (each would compile). Without a
        compiled kernel it changes nothing."""
        before = self._compile_draft
        self._compile_draft = True
        try:
            yield
        finally:
            self._compile_draft = before

    def _runs_compiled(self, cache, start: int, tokens: int) -> str | None:
        """Which compiled graph runs this forward, if any: "full" (the kernel's blocks: the full model, after the
        prompt) or "draft" (a one-token step of a draft model inside ``compiled_draft``)."""
        if self._compiled is None or cache is not self._compiled.cache or start == 0:
            return None
        full_model = not self._drafting and not self._partial
        if full_model:
            return "full"
        if self._compile_draft and tokens == 1 and not self._eager_only:
            return "draft"
        return None

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, *, start: int, cache, last_only: bool = False) -> torch.Tensor:
        """Run ``token_ids`` ([T] or [1, T]) at positions start..start+T-1 and extend ``cache``.

        Returns logits [T, V] (or [1, V] with ``last_only``, which skips the LM head elsewhere).
        On the compiled kernel's cache the full model runs its compiled blocks (the prompt, at ``start`` 0,
        and every partial model run eagerly).
        """
        ids = token_ids.view(1, -1).to(self.device)  # [1, T]
        graph = self._runs_compiled(cache, start, ids.shape[1])
        if graph == "full":
            logits = self._compiled.forward(ids[0], start)  # [T, V]
            return logits[-1:] if last_only else logits
        if graph == "draft":
            return self._compiled.forward_one(ids[0], start)  # [1, V]
        positions = torch.arange(start, start + ids.shape[1], device=self.device).unsqueeze(0)  # [1, T]
        out = self.hf(
            input_ids=ids,
            position_ids=positions,
            **self.cache_kwargs(cache),
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        return out.logits[0].float()  # [T, V]

    @torch.inference_mode()
    def forward_hidden(self, token_ids: torch.Tensor, *, start: int, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` that also returns the residual stream: logits [T, V] and hidden [L+1, T, H].

        ``hidden[0]`` is what enters layer 0 (the embeddings), ``hidden[i + 1]`` what leaves layer i,
        *before* the final norm (HF's ``output_hidden_states`` puts the normed state last instead).
        Read with forward hooks that live only for this call, so no other forward pays for them.
        """
        captured: list[torch.Tensor] = []

        def keep(module, args, output) -> None:
            captured.append((output[0] if isinstance(output, tuple) else output)[0])  # [T, H]

        modules = [self.hf.get_input_embeddings(), *self.layers]
        handles = [m.register_forward_hook(keep) for m in modules]
        try:
            logits = self.forward(token_ids, start=start, cache=cache)
        finally:
            for h in handles:
                h.remove()
        return logits, torch.stack(captured)  # [T, V], [L+1, T, H]

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
        """A draft head that computes logits for token ``ids`` [V'] only (``_SubsetHead``); run it with
        ``draft_head``. It copies those rows of the LM head, so build it once and keep it. ``convert`` turns
        the rows' Linear into a stand-in (a reduced-precision copy) before it is kept."""
        head = self.lm_head
        if isinstance(head, _SubsetHead):
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
        return _SubsetHead(convert(proj) if convert is not None else proj, ids, head.weight.shape[0])

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

    @staticmethod
    def crop(cache, length: int) -> None:
        """Cut every layer's KV back to ``length`` positions (rejected or draft-only entries go). A static
        layer keeps its tensors and rewinds its length, through its own ``crop``; the stale entries past it
        are masked by position and overwritten by the next forward."""
        for layer in cache.layers:
            if _is_static(layer):
                held = int(layer.get_seq_length())
                if held > length:
                    layer.crop(length - held)
                continue
            keys = getattr(layer, "keys", None)
            if keys is not None and keys.dim() == 4 and keys.shape[-2] > length:
                layer.keys = keys[..., :length, :]
                layer.values = layer.values[..., :length, :]

    @staticmethod
    def cache_lengths(cache) -> tuple[int, ...]:
        """Per-layer KV length, for tests and assertions."""
        out = []
        for layer in cache.layers:
            if _is_static(layer):
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


def _cache_parameter(forward: Callable) -> str:
    """The name under which ``forward`` takes the KV cache: ``cache`` where the installed transformers has it
    (``past_key_values`` is then a deprecated alias, removed in 5.40), else ``past_key_values``."""
    try:
        params = inspect.signature(forward).parameters  # follows the deprecation decorators' __wrapped__
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _is_static(layer) -> bool:
    """A StaticCache layer (transformers 5): fixed tensors, and a length it keeps as a tensor."""
    return isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)


@dataclass(frozen=True)
class KernelReport:
    """How a compiled kernel was built, for people and for the files that record timings taken with it."""

    kernel: str  # its label, e.g. inductor-c4
    threads: int  # torch threads its generated code was compiled for
    capacity: int  # positions its StaticCache holds
    compile_seconds: float  # building and compiling the block graph (and its warm-up calls)
    graphs: int  # graphs compiled so far; it stays at 1 while decoding (no recompilation)
    cache_dir: str  # inductor's on-disk cache for this torch and thread count


# inductor's settings for the kernel: frozen weights, CPU GEMM templates autotuned against the BLAS call, and
# no autotuning tables printed on the user's terminal
_SETTINGS = {"freezing": True, "max_autotune": True, "autotune_num_choices_displayed": 0,
             "max_autotune_report_choices_stats": False}


@contextlib.contextmanager
def inductor_settings() -> Iterator[None]:
    """The compiled kernel's inductor settings, for anything else compiled beside it (e.g. bench's HF peer)."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(_SETTINGS):
        yield


class _CompiledBlocks:
    """The inductor kernel: the whole HF model compiled for one block of ``kernel.chunk`` tokens on one
    StaticCache of ``capacity`` positions (freezing + max-autotune), run block by block.

    Holds real state (the compiled module, the cache, the counters), hence a class. It is the only place
    that compiles; the adapter routes full-model forwards on ``cache`` here."""

    def __init__(self, sm: SkippableModel, kernel: Kernel, *, capacity: int) -> None:
        import os

        import torch._dynamo
        from torch._dynamo.utils import counters
        from transformers import StaticCache

        self.kernel, self.capacity, self._sm = kernel, capacity, sm
        self._counters = counters
        threads = torch.get_num_threads()
        self._cache_dir = inductor_cache_dir(threads)
        self._cache_dir.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self._cache_dir)  # read by inductor when it compiles
        self.cache = StaticCache(config=sm.hf.config, max_cache_len=capacity)
        config = sm.hf.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache.early_initialization(1, heads, head_dim, sm.dtype, sm.device)
        # one graph per module and block shape; a model and its copies (a draft) must not evict each other
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self._module = torch.compile(sm.hf, dynamic=False)
        graphs_before = counters["stats"]["unique_graphs"]
        t0 = time.perf_counter()
        with torch.inference_mode():
            pad = torch.zeros(kernel.chunk, dtype=torch.long, device=sm.device)
            for _ in range(2):  # the first call compiles; the second checks the graph is reused
                SkippableModel.crop(self.cache, 0)
                self.forward(pad, 1)
        SkippableModel.crop(self.cache, 0)
        self._seconds = time.perf_counter() - t0
        self._graphs_before, self._threads = graphs_before, threads

    def report(self) -> KernelReport:
        return KernelReport(self.kernel.label, self._threads, self.capacity, round(self._seconds, 1),
                            int(self._counters["stats"]["unique_graphs"] - self._graphs_before), str(self._cache_dir))

    def fresh_cache(self, positions: int | None):
        if positions is not None and positions + self.kernel.chunk > self.capacity:
            raise ConfigError(f"{positions} positions (prompt + max_new_tokens) do not fit kernel "
                              f"{self.kernel.label}'s cache of {self.capacity - self.kernel.chunk}: build it for "
                              "longer sequences, or use --kernel eager")
        SkippableModel.crop(self.cache, 0)
        return self.cache

    def forward_one(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """One token ``ids`` [1] at ``start`` through the model as it stands (a draft's): logits [1, V]."""
        SkippableModel.crop(self.cache, start)
        return self._logits(ids.view(1, 1), torch.tensor([[start]], device=ids.device))[0].float()  # [1, V]

    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """The full model over ``ids`` [T] at positions start.., in blocks: logits [T, V]; the cache ends at
        start + T (a padded block's extra positions are rewound)."""
        C, T = self.kernel.chunk, ids.shape[0]
        if start + T + C > self.capacity:
            raise ConfigError(f"position {start + T} is past kernel {self.kernel.label}'s cache of "
                              f"{self.capacity - C} positions")
        out = []
        for b in range(0, T, C):
            block = ids[b:b + C]  # [<=C]
            n = block.shape[0]
            if n < C:  # padding: its KV lands past the sequence, masked by position and rewound below
                block = torch.cat([block, block.new_zeros(C - n)])
            pos = torch.arange(start + b, start + b + C, device=ids.device).unsqueeze(0)  # [1, C]
            SkippableModel.crop(self.cache, start + b)
            out.append(self._logits(block.unsqueeze(0), pos)[0, :n])
        SkippableModel.crop(self.cache, start + T)
        return torch.cat(out).float()  # [T, V]

    def _logits(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The compiled module over ``ids`` [1, T] at ``positions`` [1, T] on the kernel's cache: logits [1, T, V]."""
        with inductor_settings():
            return self._module(input_ids=ids, position_ids=positions, **self._sm.cache_kwargs(self.cache),
                                use_cache=True).logits


# -- loading ---------------------------------------------------------------------------------
def arch_fingerprint(config, name: str) -> str:
    """A short hash of the architecture and the ``--model`` string: what schema-1 profiles recorded
    as ``model.fingerprint``. Unchanged, so that their fingerprints still match."""
    arch = {
        "model_type": config.model_type,
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None),
        "vocab_size": config.vocab_size,
        "name": name,
    }
    return hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()[:16]


def read_config(checkpoint: Checkpoint):
    """The checkpoint's config, without its weights; refuses an architecture the adapter cannot skip in."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(checkpoint.path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load model '{checkpoint.name}': {_first_line(exc)}") from None
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            f"model '{checkpoint.name}' has architecture '{getattr(config, 'model_type', '?')}'; "
            f"skipsearch supports Llama-style decoder stacks: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def quiet_optional_kernels() -> None:
    """transformers imports torchao when it is installed; on a machine without CUDA (or without its newest
    kernels) torchao logs a line per optional extension it cannot load, and torch a deprecation line per enum
    torchao registers: none of it is the user's concern. Errors still show."""
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)


def load_model(name: str | Checkpoint = DEFAULT_MODEL, *, device: str = "auto", dtype: str = "auto",
               profile_dtype: str | None = None, max_tokens: int = DEFAULT_MAX_TOKENS,
               draft_bits: int | None = None) -> SkippableModel:
    """Load ``name`` (embedded model, directory, alias or hub id; see ``find_checkpoint``) as a SkippableModel.

    ``device`` and ``dtype`` may be ``auto`` (placement.choose_placement): CUDA when available, spread
    over several GPUs with accelerate's device_map; the checkpoint's dtype on a GPU (``profile_dtype``,
    a profile's, takes precedence), fp32 on the CPU. The choice is logged in one line. Before any
    weight is read, the model's memory (weights plus the KV cache of ``max_tokens`` positions: the
    longest prompt plus max_new_tokens) is checked against what is free there.
    """
    choose_placement(device, dtype)  # a bad --device or --dtype fails before a first-use conversion
    quiet_optional_kernels()
    checkpoint = name if isinstance(name, Checkpoint) else find_checkpoint(name)
    config = read_config(checkpoint)
    placement = choose_placement(device, dtype, checkpoint=checkpoint_dtype(config), profile=profile_dtype)
    check_memory(config, placement, max_tokens=max_tokens, label=f"model '{checkpoint.name}'", draft_bits=draft_bits)
    log.info("loading %s on %s", checkpoint.name, placement.describe())
    model, tokenizer = _from_pretrained(checkpoint, placement)
    return SkippableModel(model, tokenizer, name=checkpoint.name, placement=placement,
                          weights_fingerprint=weights_fingerprint(checkpoint.path))


def _from_pretrained(checkpoint: Checkpoint, placement: Placement):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    route_library_logs()  # transformers' logged deprecations as the CLI routes its warnings (skipsearch.notices)
    kwargs = {"dtype": placement.torch_dtype, "attn_implementation": "sdpa"}
    if placement.device == "auto":
        kwargs["device_map"] = "auto"  # accelerate splits the layers across the GPUs
    elif placement.device.startswith("cuda"):
        kwargs["device_map"] = {"": placement.device}  # straight onto the GPU, never a whole copy in host RAM
    try:
        model = AutoModelForCausalLM.from_pretrained(checkpoint.path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(checkpoint.path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load model '{checkpoint.name}': {_first_line(exc)}") from None
    if placement.device == "mps":
        model = model.to("mps")
    return model, tokenizer


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
