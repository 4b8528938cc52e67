"""The skippable adapter: the only module that touches transformers' modeling internals.

``SkippableModel`` wraps a loaded HF causal LM (``loader.load_model`` builds one from a checkpoint; tests build
one in memory). It can skip the attention and/or the MLP of any decoder layer while drafting. It does so
by swapping the sublayer module for one that adds nothing to the residual stream, inside a context
manager that always puts the original modules back; the modeling code itself is never forked. What runs the
full model's forwards is a kernel (skipsearch.kernels): eager, or a compiled one that ``use_kernel`` builds.

KV-cache rules the decoder relies on (see decoding.py; the helpers are in kv_cache.py):
- prefill and verification run the full model, so they write full-model KV for every layer;
- a draft step writes KV only in layers whose attention runs (skipped attention never calls
  ``cache.update``), so layer caches may briefly differ in length while drafting;
- ``crop(cache, n)`` cuts every layer back to ``n`` positions, whatever its length.
Positions are always passed explicitly (``position_ids``), never read off a layer's cache
length, because layer 0's cache may be shorter than the others' in the middle of a draft.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import nn

from skipsearch import kv_cache
from skipsearch.checkpoints import ModelError, arch_fingerprint, state_fingerprint
from skipsearch.config import ConfigError, DraftConfig
from skipsearch.kernels import (
    EAGER,
    Kernel,
    KernelReport,
    KernelRunner,
    check_kernel,
    graphs,
    parse_kernel,
    precompiled,
)
from skipsearch.model.placement import Placement
from skipsearch.model.stack import StackParts
from skipsearch.model.stand_ins import SkippedLayer, SkippedSublayer
from skipsearch.notices import long_step

_log = logging.getLogger(__name__)

__all__ = ["SUPPORTED_MODEL_TYPES", "SkippableModel"]

# Decoder stacks whose layers are (input_layernorm, self_attn, post_attention_layernorm, mlp)
# around two residual adds. Skipping a sublayer there means adding zero to the residual.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# The longest prompt that runs through a compiled kernel's own copy of the model (``panel``'s: its products and its
# attention, which builds an additive bias of the prompt's rows by the cache's positions, 4 bytes each). A
# prompt's forward there took 0.4-0.96 of the model's own (MKL's products, SDPA) from 16 to 3,000 tokens
# (studies/prompt-cpu.md); a longer one runs on the model itself.
PROMPT_ROWS = 1024


class SkippableModel(StackParts):
    """A causal LM whose decoder sublayers can be skipped while drafting.

    Holds real state (the HF model, its tokenizer, the swap stand-ins), hence a class.
    """

    def __init__(self, model: nn.Module, tokenizer, *, name: str, placement: Placement | None = None,
                 weights_fingerprint: str | None = None, precision: str = "native") -> None:
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
        # the target's precision (model/target.py): "native", or "int8" once load_model swapped every linear for
        # its int8 copy; the weights fingerprint stays the checkpoint's, the profile records both
        self.target_precision = precision
        self.layers: nn.ModuleList = model.model.layers
        self.num_layers = len(self.layers)
        # transformers renamed the forwards' ``past_key_values`` to ``cache`` (5.24 takes both; the old name
        # goes in 5.40): decided once here, the name this install's model and decoder layers take.
        self._cache_name = kv_cache.cache_parameter(type(model).forward)
        self._layer_cache_name = (kv_cache.cache_parameter(type(self.layers[0]).forward) if self.num_layers
                                  else self._cache_name)
        self._skip_attn = SkippedSublayer(returns_pair=True)
        self._skip_mlp = SkippedSublayer(returns_pair=False)
        self._skip_layer = SkippedLayer()
        self._drafting = False
        self._partial = 0  # open substituted() / draft_head() / eager() contexts: not the full model's kernel then
        self._compile_draft = False  # inside compiled_draft(): one-token partial forwards may run compiled
        self._eager_only = 0  # open eager() contexts
        self._runner: KernelRunner | None = None  # a compiled kernel's, once use_kernel() built it

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
    def vocab_size(self) -> int:
        """The LM head's outputs (an int8 target's head keeps no ``weight``: its ``out_features``)."""
        head = self.lm_head
        return int(getattr(head, "out_features", None) or head.weight.shape[0])

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
            layers = self.layers._modules  # the layers by index, without nn.Module's slow attribute protocol
            for attr, table in (("self_attn", attn or {}), ("mlp", mlp or {})):
                for i, module in table.items():
                    layer = layers[str(i)]
                    swapped.append((layer, attr, layer._modules[attr]))
                    layer._modules[attr] = module  # a submodule swapped for a submodule: all setattr would do
            yield
        finally:
            for layer, attr, original in reversed(swapped):
                layer._modules[attr] = original
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
        return self._runner.kernel if self._runner is not None else EAGER

    @property
    def kernel_report(self) -> KernelReport | None:
        """How the compiled kernel was built (None for eager): its compile time and graph count."""
        return self._runner.report() if self._runner is not None else None

    def use_kernel(self, kernel: Kernel | str, *, capacity: int, warm: Callable[[], None] | None = None) -> None:
        """Run the full model's forwards on ``decode_cache()`` through ``kernel`` from now on, for sequences of up
        to ``capacity`` positions (longest prompt + max_new_tokens). A compiled kernel is built and compiled
        here, once per process (a minute or more: it is reported by ``kernel_report``); the caller checks
        ``kernels.check_kernel`` before loading the model, so this only fails on a broken install. ``warm`` (a
        draft's graph to build) runs where the kernel is compiled: while its own graphs may still be building beside
        this process, which ``KernelRunner.settle`` then waits for."""
        kernel = parse_kernel(kernel)
        if self._runner is not None and self._runner.fits(kernel, capacity):
            if warm is not None:
                warm()
            return
        check_kernel(kernel, self.device.type)
        # a step of a minute or more: the CLI shows it on stderr with the seconds it is taking (its "step" marks)
        step = graphs.building(kernel.label, keeps=kernel.spec.keeps_graphs) if kernel.compiled else ""
        loads = kernel.compiled and kernel.spec.keeps_graphs and graphs.last_build(kernel.label) is not None
        if kernel.compiled:
            _log.info("%s ...", step, extra={"step": "start"})
        before = precompiled.COUNTS.copy()
        self._runner = kernel.spec.build(self, kernel, capacity)  # None: eager, this adapter's own forwards
        if self._runner is not None:
            if warm is not None:
                warm()  # where it fails, the block's first call waits for its build; none outlives the process
            self._runner.settle()
            seconds = self._runner.report().compile_seconds
            # a step that said it loads kept graphs says so where it built some instead (minutes, not seconds)
            built = precompiled.built_note(before) if loads else ""
            _log.info("%s ... %.0f s%s", step, seconds, built, extra={"step": "end"})
            if kernel.spec.keeps_graphs:
                graphs.record(kernel.label, seconds)

    def decode_cache(self, positions: int | None = None):
        """The KV cache one sequence decodes in: with a compiled kernel its StaticCache, rewound to empty
        (``positions``, prompt + max_new_tokens, must fit its capacity: one ConfigError line otherwise);
        else a fresh DynamicCache, as ``new_cache``."""
        if self._runner is None:
            return self.new_cache()
        return self._runner.fresh_cache(positions)

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
            with self._runner.drafting() if self._runner is not None else contextlib.nullcontext():
                yield
        finally:
            self._compile_draft = before

    def draft_aside(self) -> None:
        """Inside ``compiled_draft``: have the compiled kernel build this draft's one-token graph in a child process
        while this one goes on (``KernelRunner.draft_aside``), so that several drafts' builds run side by side;
        the draft's first compiled step loads it. Nothing without a compiled kernel."""
        if self._runner is not None and self._compile_draft:
            self._runner.draft_aside()

    def _runs_compiled(self, cache, start: int, tokens: int) -> str | None:
        """Which compiled graph runs this forward, if any: "full" (the kernel's blocks: the full model, after the
        prompt) or "draft" (a one-token step of a draft model inside ``compiled_draft``); or "prompt": the full
        model's prompt, eagerly, through the kernel's own copy of the model (``KernelRunner.prompt_model``) where
        it has one and the prompt is at most ``PROMPT_ROWS`` tokens."""
        if self._runner is None or cache is not self._runner.cache:
            return None
        full_model = not self._drafting and not self._partial
        if start == 0:
            copy = self._runner.prompt_model is not None
            return "prompt" if full_model and copy and tokens <= PROMPT_ROWS else None
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
        and every partial model run eagerly; the prompt through the kernel's own copy where it has one).
        """
        ids = token_ids.view(1, -1).to(self.device)  # [1, T]
        graph = self._runs_compiled(cache, start, ids.shape[1])
        if graph == "full":
            logits = self._runner.forward(ids[0], start)  # [T, V]
            return logits[-1:] if last_only else logits
        if graph == "draft":
            return self._runner.forward_one(ids[0], start)  # [1, V]
        positions = torch.arange(start, start + ids.shape[1], device=self.device).unsqueeze(0)  # [1, T]
        out = (self._runner.prompt_model if graph == "prompt" else self.hf)(
            input_ids=ids,
            position_ids=positions,
            **self.cache_kwargs(cache),
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        return out.logits[0].float()  # [T, V]

    def batch_cache(self, rows: int, positions: int):
        """The KV cache a batch of ``rows`` decodes in: a ``kv_cache.row_cache`` of at least ``positions`` slots per
        row (longest prompt + new tokens + the draft length + 1), emptied. With a compiled kernel it is the
        runner's cache for this batch size (its graphs are compiled on the first batch of that size, and fixed
        shapes need a fixed capacity: one ConfigError line when ``positions`` exceed it); else a fresh one."""
        if self._runner is not None:
            if rows in self._runner.batch_sizes:
                return self._runner.batch_cache(rows, positions)
            with long_step(_log, "compiling %s graphs for batches of %d ...", self._runner.kernel.label, rows):
                return self._runner.batch_cache(rows, positions)
        try:
            return kv_cache.row_cache(self.hf.config, rows=rows, capacity=positions, dtype=self.dtype,
                                      device=self.device)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def graph_bytes(self, rows: int) -> int:
        """What compiling the graphs for batches of ``rows`` is expected to add to memory: as much as the kernel's last
        compile added (each batch size's graphs freeze their own copy of the weights). 0 on the eager kernel, for a
        batch of one (it runs the one-sequence graphs) and for a batch size already compiled."""
        if self._runner is None or rows <= 1 or rows in self._runner.batch_sizes:
            return 0
        return self._runner.graph_bytes

    @torch.inference_mode()
    def forward_rows(self, ids: torch.Tensor, *, positions: torch.Tensor, cache,
                     last: list[int] | None = None) -> torch.Tensor:
        """Run a batch on a ``batch_cache``: ``ids`` and ``positions`` [B, T], each query attending to its own row's
        slots up to its position (``kv_cache.row_mask``). Returns logits [B, T, V] float, or with ``last`` (one
        index into T per row) each row's logits there only: [B, V].

        The full model's forwards after the prompt run the compiled kernel's batched graphs where one is in use;
        the prompt (a block whose positions start at 0) and every partial model (a draft's) run eagerly."""
        ids, positions = ids.to(self.device), positions.to(self.device)
        compiled = (self._runner is not None and not self._drafting and not self._partial
                    and int(positions[:, 0].min()) > 0 and self._runner.owns(cache))
        if compiled:
            logits = self._runner.forward_rows(ids, positions, cache)  # [B, T, V]
            return logits[torch.arange(ids.shape[0]), last] if last is not None else logits
        keep: int | torch.Tensor = 0
        if last is not None:
            cols = sorted(set(last))
            keep = torch.tensor(cols, device=self.device)
        mask = kv_cache.row_mask(positions, kv_cache.row_capacity(cache))  # [B, 1, T, S]
        out = self.hf(input_ids=ids, position_ids=positions, attention_mask=mask, **self.cache_kwargs(cache),
                      use_cache=True, logits_to_keep=keep).logits.float()
        if last is None:
            return out  # [B, T, V]
        return out[torch.arange(ids.shape[0]), torch.tensor([cols.index(i) for i in last])]  # [B, V]

    @torch.inference_mode()
    def forward_hidden(self, token_ids: torch.Tensor, *, start: int, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` that also returns the residual stream: logits [T, V] and hidden [L+1, T, H].

        ``hidden[0]`` is what enters layer 0 (the embeddings), ``hidden[i + 1]`` what leaves layer i,
        *before* the final norm (HF's ``output_hidden_states`` puts the normed state last instead).
        Read with forward hooks that live only for this call, so no other forward pays for them. The hooks are on
        this model's own modules, so the forward runs eagerly here, on a compiled kernel's cache too: its graphs
        run a copy of the model (``panel``) or a trace without the hooks, and would leave them empty.
        """
        captured: list[torch.Tensor] = []

        def keep(module, args, output) -> None:
            captured.append((output[0] if isinstance(output, tuple) else output)[0])  # [T, H]

        modules = [self.hf.get_input_embeddings(), *self.layers]
        handles = [m.register_forward_hook(keep) for m in modules]
        try:
            with self.eager():
                logits = self.forward(token_ids, start=start, cache=cache)
        finally:
            for h in handles:
                h.remove()
        return logits, torch.stack(captured)  # [T, V], [L+1, T, H]

    # the KV-cache helpers (skipsearch.kv_cache), where code holding an adapter reaches them
    crop = staticmethod(kv_cache.crop)
    cache_lengths = staticmethod(kv_cache.cache_lengths)
