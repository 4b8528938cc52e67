"""``inductor``: ``torch.compile`` of the whole model over a transformers ``StaticCache``: one graph for a
one-token step and one for a block of ``chunk`` tokens.

TorchInductor runs with ``freezing`` and ``max_autotune``: weights frozen as constants, every linear offered to
inductor's CPU GEMM templates and kept there where autotuning finds them faster. Two graphs serve every forward
of the full model that the decoder runs after the prompt: a one-token forward (a plain step, a verify with
nothing drafted) runs the one-token graph, and a forward over k tokens runs k // chunk blocks plus its rest, the
rest as one token where it is one token, else as a block padded to ``chunk``. So plain steps, verifies of any
length and the cost timing share them, and nothing recompiles while decoding (the shapes are fixed: the two
graphs and the cache's capacity). ``inductor-c1`` compiles the one graph. A kernel that asks for ``exact_rows``
(``panel``) has its block graph compiled once for every width from 2 to ``chunk`` instead, so the rest runs as
many rows as it has tokens. The prompt (any length) and every
partial-model forward (a draft's) run eagerly on the same StaticCache, so drafts read and extend the full
model's KV exactly as they do on a DynamicCache; a kernel that hands it a ``prompt_model`` (``panel``: its own copy)
has the prompt run through that. Batches (``batch_cache``, ``forward_rows``) get two graphs of their
own per batch size, [B, 1] and [B, chunk], on a row cache (``kv_cache.row_cache``), compiled on that size's first
batch; each graph freezes its own copy of the weights, so every batch size served costs that memory again
(``graph_bytes``: what the last compile added to the process, the batched memory check's estimate for the next).

Why a one-token graph beside the block: a one-token step through a padded 4-token block costs the whole block,
about 1.4 one-token steps on the Zen 1 EPYC measured in ``studies/compiled-step-smollm2-cpu.md``, and HF's own
compiled greedy runs one-token graphs. Why a block of ``chunk`` tokens and not one graph per verify length: each
graph costs two to four minutes of compilation per thread count on that machine (a minute on a Zen 4), and
longer blocks fall off the templates' fast path (``studies/kernels-smollm2-cpu.md``). ``panel``'s products cost
about a row's arithmetic more for every row, so there one graph covers every width (``exact_rows``): its build
takes about a third longer than a block of one width, and a verify of 2 tokens of the int8 target costs 1.3
one-token steps on a Zen 4 where a padded 8-token block cost 3 (``studies/verify-widths-cpu.md``).

Compilation happens once per process and thread count (the generated code has the thread count baked in).
Inductor's on-disk caches live in this machine's folder of ``kernels/graphs.py`` (C++ kernels and autotuning
results are reused by the next process); this kernel's frozen fp32 graphs themselves are not kept by torch 2.13
(their packed weights are MKL tensors, which its FX graph cache cannot pickle, and AOTAutograd's cache refuses
frozen graphs), so each process pays their tracing and lowering again: ``SkippableModel.kernel_report`` says how
long. ``panel`` keeps every graph it compiles (no frozen weights).

No torch at import (the registry parses ``--kernel`` before anything loads): the runner imports it when built.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from skipsearch.config import ConfigError
from skipsearch.kernels import graphs, precompiled
from skipsearch.kernels.base import DEFAULT_CHUNK, Adapter, Kernel, KernelReport, KernelSpec

if TYPE_CHECKING:  # types only: torch loads with the runner
    import torch

CHUNKS = (1, 2, 4, 8, 16)  # block sizes a compiled verify may use
DRAFT_SLOTS = 16  # a batch's cache holds this many positions past the kernel's capacity: a last cycle's drafts


def cxx_compiler() -> str | None:
    """The C++ compiler inductor's CPU backend would call, if this machine has one (``CXX``, else g++/clang++)."""
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def static_cache_supported() -> bool:
    """Whether the installed transformers' StaticCache layers track their length and crop by it, which the
    compiled kernel relies on to rewind a verify (StaticLayer.cumulative_length, transformers 5)."""
    try:
        from transformers.cache_utils import StaticLayer
    except ImportError:
        return False
    return "cumulative_length" in getattr(StaticLayer, "__annotations__", {}) and hasattr(StaticLayer, "crop")


def check(kernel: Kernel, device: str, instead: str) -> None:
    """Refuses in one line a device other than the CPU, a machine without a C++ compiler, an old transformers."""
    dev = "cuda" if device == "auto" else device.split(":")[0]  # auto: layers spread over the GPUs
    if dev != "cpu":
        raise ConfigError(f"kernel {kernel.label} is built and measured for CPUs only (no GPU was available to "
                          f"measure a compiled {dev} verify): use {instead} on {dev}")
    if cxx_compiler() is None:
        raise ConfigError(f"kernel {kernel.label} compiles C++ with inductor, and this machine has no C++ compiler "
                          f"(g++, clang++ or $CXX): install one, or use {instead}")
    if not static_cache_supported():
        import transformers

        raise ConfigError(f"kernel {kernel.label} needs a transformers whose StaticCache layers keep their own "
                          f"length (5.x); this is {transformers.__version__}: use {instead}")


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


def _blocks(T: int, C: int, exact: bool = False) -> Iterator[tuple[int, int, int]]:
    """How a forward of ``T`` tokens runs on blocks of ``C``: per block its offset, its tokens and the graph's width
    (a lone token runs the one-token graph, unpadded; any other rest a block padded to ``C``, or with ``exact``, a
    block of its own width: the kernel's block graph covers every width from 2 to ``C``)."""
    for b in range(0, T, C):
        n = min(C, T - b)
        yield b, n, n if n == 1 or exact else C


def _rewind(cache, length: int) -> None:
    from skipsearch.kv_cache import crop  # imports torch: here, not at this module's import

    crop(cache, length)


class CompiledBlocks:
    """The inductor kernel: the whole HF model compiled for one token and for one block of ``kernel.chunk``
    tokens on one StaticCache of ``capacity`` positions (freezing + max-autotune), run block by block. Another
    kernel may hand it copies of the model (sharing its weights) for the one-token steps (``step_model``) and for
    forwards over more than one row (``rows_model``), the model a prompt runs through eagerly (``prompt_model``),
    inductor settings of its own (``settings``) and a context its draft steps run in (``draft_context``): ``panel``.

    With ``exact_rows`` (and ``precompile``), a one-sequence forward's block runs as many rows as it has tokens:
    its call is compiled once for every width from 2 to the block's (``precompiled.Call``'s ``rows``), so a verify
    of 3 tokens costs 3 rows of products, not 8. Batches keep blocks of one width.

    Holds real state (the compiled module, the cache, the counters), hence a class. It is the only place
    that compiles; the adapter routes full-model forwards on ``cache`` here (a ``KernelRunner``)."""

    def __init__(self, sm: Adapter, kernel: Kernel, *, capacity: int, step_model=None, rows_model=None,
                 prompt_model=None, settings: dict | None = None,
                 draft_context: Callable[[], contextlib.AbstractContextManager] | None = None,
                 precompile: bool = False, copy_out: bool = False, exact_rows: bool = False) -> None:
        import torch
        import torch._dynamo
        from torch._dynamo.utils import counters

        from skipsearch.kv_cache import guard_addresses, static_cache
        from skipsearch.memory import memory_probe

        self.kernel, self.capacity, self._sm = kernel, capacity, sm
        self._counters = counters
        threads = torch.get_num_threads()
        self._cache_dir = graphs.use(threads)  # inductor's on-disk caches: this machine's kept graphs
        self.cache = static_cache(sm.hf.config, capacity=capacity, dtype=sm.dtype, device=sm.device)
        guard_addresses(self.cache)  # this runner's graphs on this cache only
        # one graph per module and block shape; a model and its copies (a draft) must not evict each other
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self._settings = {**_SETTINGS, **(settings or {})}
        self._copy_out = copy_out  # logits copied out of the graph's memory (CUDA graphs: the next replay reuses it)
        self._draft_context = draft_context or contextlib.nullcontext
        self._module = torch.compile(sm.hf, dynamic=False)  # drafts: the model as it stands, its stand-ins swapped in
        # the full model's one-token steps and its forwards over more than one row (blocks, batches) may each run a
        # copy of the model that shares its weights (``panel``'s); by default both run the model itself
        self._step_module = self._module if step_model is None else torch.compile(step_model, dynamic=False)
        self._rows_module = self._module if rows_model is None else torch.compile(rows_model, dynamic=False)
        self.prompt_model = prompt_model  # what a prompt runs through eagerly (None: the adapter's own model)
        # with ``precompile``, one-sequence calls run precompiled (``kernels/precompiled.py``: dynamo's trace kept too)
        self._models = {id(self._module): sm.hf, id(self._step_module): sm.hf if step_model is None else step_model,
                        id(self._rows_module): sm.hf if rows_model is None else rows_model} if precompile else None
        self._calls: dict[tuple, precompiled.Call | None] = {}  # call key -> its precompiled call (None: refused)
        # the widths a one-sequence block's call covers (None: the block's own); their calls share the loaded graph
        self._widths = (2, kernel.chunk) if exact_rows and precompile and kernel.chunk > 2 else None
        self._shared: dict = {}  # a call's file -> its loaded graph, for the calls of every width it covers
        self._reused: set[tuple] = set()  # calls (``_call_key``) whose graph ran again without compiling
        self._graphs_before, self._threads = counters["stats"]["unique_graphs"], threads
        self._memory = memory_probe(sm.device)
        self._held = self._memory.current()
        self._seconds, self._began = 0.0, time.perf_counter()  # the build's span: from here to settle's end
        self.graph_bytes = 0  # what the next batch size's graphs may add: measured in settle
        self._later = sorted({1, kernel.chunk})  # the one-token graph and the block's: built aside, checked in settle
        with torch.inference_mode():
            for size in self._later:
                self._aside(torch.zeros(1, size, dtype=torch.long, device=sm.device),
                            torch.arange(1, 1 + size, device=sm.device).unsqueeze(0))
        self._rows: dict[int, object] = {}  # batch size -> its row cache (kv_cache.row_cache), graphs compiled

    def _check(self, size: int) -> None:
        """Build (or load) the one-sequence graph of ``size`` tokens: the first call compiles, the second checks
        the graph is reused."""
        import torch

        pad = torch.zeros(size, dtype=torch.long, device=self._sm.device)
        for _ in range(2):
            _rewind(self.cache, 0)
            self.forward(pad, 1)
        _rewind(self.cache, 0)

    def settle(self) -> None:
        """Finish the build: the one-token graph and the block's, which children of this process may be building
        (``_aside``) while this one built whatever ``SkippableModel.use_kernel`` warms meanwhile (a draft's graph),
        waited for (or built here) and checked, so that no timed forward waits for a build."""
        import torch

        if not self._later:
            return
        with torch.inference_mode():
            for size in self._later:
                self._check(size)
        self._later = []
        self._seconds += time.perf_counter() - self._began
        self.graph_bytes = max(0, self._memory.current() - self._held)

    def _aside(self, ids: torch.Tensor, positions: torch.Tensor, *, cache=None, mask=None,
               draft: bool = False) -> None:
        """Have a child of this process build the precompiled call of the full model over ``ids`` [B, T] at
        ``positions`` (on ``cache`` with ``mask``: a batch's), or with ``draft`` the model as it stands (a draft's
        one-token step), while this one builds another (``precompiled.build_aside``); nothing where calls are not
        precompiled."""
        if self._models is None:
            return
        module = self._module if draft else self._step_module if ids.numel() == 1 else self._rows_module
        model = self._models[id(module)]
        args = (ids, positions, self._sm.cache_kwargs(self.cache if cache is None else cache), mask)
        precompiled.build_aside(self._cache_dir, model, args, _role(model, draft=draft), self._settings,
                                self._rows_of(module, args))

    def _rows_of(self, module, args: tuple) -> tuple[int, int] | None:
        """The widths one precompiled call covers (``exact_rows``): a one-sequence block's (no mask: not a batch's)
        on the kernel's copy; None for any other call, whose shape is its own."""
        ids, mask = args[0], args[3]
        one_block = module is self._rows_module and module is not self._module and mask is None
        return self._widths if one_block and ids.shape[-1] > 1 else None

    def draft_aside(self) -> None:
        import torch

        with torch.inference_mode():  # as ``_run`` hands a draft's step its inputs
            ids = torch.zeros(1, 1, dtype=torch.long, device=self._sm.device)
            positions = torch.ones(1, 1, dtype=torch.long, device=self._sm.device)
        self._aside(ids, positions, draft=True)

    def fits(self, kernel: Kernel, capacity: int) -> bool:
        # a padded last block writes up to chunk - 1 positions past the sequence: the cache holds them too
        return self.kernel == kernel and self.capacity >= capacity + kernel.chunk

    def report(self) -> KernelReport:
        return KernelReport(self.kernel.label, self._threads, self.capacity, round(self._seconds, 1),
                            int(self._counters["stats"]["unique_graphs"] - self._graphs_before), str(self._cache_dir))

    def fresh_cache(self, positions: int | None):
        if positions is not None and positions + self.kernel.chunk > self.capacity:
            raise ConfigError(f"{positions} positions (prompt + max_new_tokens) do not fit kernel "
                              f"{self.kernel.label}'s cache of {self.capacity - self.kernel.chunk}: build it for "
                              "longer sequences, or use --kernel eager")
        _rewind(self.cache, 0)
        return self.cache

    def forward_one(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """One token ``ids`` [1] at ``start`` through the model as it stands (a draft's): logits [1, V]."""
        import torch

        _rewind(self.cache, start)
        return self._logits(ids.view(1, 1), torch.tensor([[start]], device=ids.device), draft=True)[0].float()

    def drafting(self) -> contextlib.AbstractContextManager[None]:
        """What a draft model's compiled steps run in (``draft_context``; ``panel``'s packed attention), held by
        ``SkippableModel.compiled_draft`` for all of a draft's steps: switching 31 attention configs costs 0.85 ms
        on the AVX-512 Xeon, which every draft token paid when each step switched them."""
        return self._draft_context()

    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """The full model over ``ids`` [T] at positions start.., in blocks: logits [T, V]; the cache ends at
        start + T (a padded block's extra positions are rewound). A rest of one token (T = 1 included) runs the
        one-token graph, unpadded."""
        import torch

        C, T = self.kernel.chunk, ids.shape[0]
        if start + T + C > self.capacity:
            raise ConfigError(f"position {start + T} is past kernel {self.kernel.label}'s cache of "
                              f"{self.capacity - C} positions")
        out, padded = [], False
        _rewind(self.cache, start)  # each block then ends where the next starts; only the last may be padded
        for b, n, width in _blocks(T, C, exact=self._widths is not None):
            padded = n < width
            block = ids[b:b + n]  # [n]
            if padded:  # its KV lands past the sequence, masked by position and rewound below
                block = torch.cat([block, block.new_zeros(width - n)])
            pos = torch.arange(start + b, start + b + width, device=ids.device).unsqueeze(0)  # [1, width]
            out.append(self._logits(block.unsqueeze(0), pos)[0, :n])
        if padded:
            _rewind(self.cache, start + T)
        return (out[0] if len(out) == 1 else torch.cat(out)).float()  # [T, V]

    # -- batches: B rows on a row cache (kv_cache.row_cache), one graph per batch size and block width ----------
    def batch_cache(self, rows: int, positions: int):
        """The row cache for batches of ``rows``, of the kernel's capacity plus ``DRAFT_SLOTS`` slots per row (fixed:
        a graph is compiled for its shape), emptied. Its two graphs (one token and one block, [rows, 1] and
        [rows, chunk]) are compiled here for its first batch: minutes for a real model, once per batch size."""
        import torch

        from skipsearch.kv_cache import row_cache, row_capacity, row_mask

        slots = self.capacity + DRAFT_SLOTS
        if positions + self.kernel.chunk > slots:
            raise ConfigError(f"{positions} positions per row (prompt + new tokens + draft) do not fit kernel "
                              f"{self.kernel.label}'s batched cache of {slots - self.kernel.chunk}: build it for "
                              "longer sequences, or use --kernel eager")
        cache = self._rows.get(rows)
        if cache is not None:
            return cache  # nothing to empty: a row reads no slot past its own position, which starts at 0
        cache = self._rows[rows] = row_cache(self._sm.hf.config, rows=rows, capacity=slots, dtype=self._sm.dtype,
                                             device=self._sm.device)
        t0, held = time.perf_counter(), self._memory.current()
        with torch.inference_mode():
            sizes = sorted({1, self.kernel.chunk})
            pads = {size: (torch.zeros(rows, size, dtype=torch.long, device=self._sm.device),
                           torch.arange(1, 1 + size, device=self._sm.device).expand(rows, size).contiguous())
                    for size in sizes}
            for size in sizes[1:]:  # the block's graph: built by a child of this process while this one builds the step
                self._aside(*pads[size], cache=cache, mask=row_mask(pads[size][1], row_capacity(cache)))
            for size in sizes:  # the first call compiles (or waits for the child); the second checks the reuse
                for _ in range(2):
                    self.forward_rows(*pads[size], cache)
        self._seconds += time.perf_counter() - t0
        self.graph_bytes = max(0, self._memory.current() - held)
        return cache

    @property
    def batch_sizes(self) -> frozenset[int]:
        """The batch sizes whose graphs it has compiled."""
        return frozenset(self._rows)

    def owns(self, cache) -> bool:
        """Whether ``cache`` is one of its batch caches (whose full-model forwards it runs)."""
        return any(cache is c for c in self._rows.values())

    def forward_rows(self, ids: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """The full model over a batch, ``ids`` and ``positions`` [B, T] (each row's run of positions), on one of its
        row caches, in blocks as ``forward``: logits [B, T, V] fp32. A padded block's extra tokens continue each
        row's positions; their KV lands past the row's last real token, masked until overwritten."""
        import torch

        from skipsearch.kv_cache import row_capacity, row_mask

        C, T = self.kernel.chunk, ids.shape[1]
        slots = row_capacity(cache)
        if int(positions[:, -1].max()) + C > slots:
            raise ConfigError(f"position {int(positions[:, -1].max())} is past kernel {self.kernel.label}'s batched "
                              f"cache of {slots - C} positions")
        out = []
        for b, n, width in _blocks(T, C):
            block, pos = ids[:, b:b + n], positions[:, b:b + n]  # [B, n]; contiguous below (dynamo guards strides)
            if n < width:
                block = torch.cat([block, block[:, -1:].expand(-1, width - n)], dim=1)
                pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, 1 + width - n, device=pos.device)], dim=1)
            block, pos = block.contiguous(), pos.contiguous()
            out.append(self._logits(block, pos, cache=cache, mask=row_mask(pos, slots))[:, :n])
        return torch.cat(out, dim=1).float()  # [B, T, V]

    def _logits(self, ids: torch.Tensor, positions: torch.Tensor, *, cache=None, mask: torch.Tensor | None = None,
                draft: bool = False) -> torch.Tensor:
        """``_run``'s logits, copied where the graph's output memory is reused by its next replay (``copy_out``)."""
        logits = self._run(ids, positions, cache=cache, mask=mask, draft=draft)
        return logits.clone() if self._copy_out else logits

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, *, cache=None, mask: torch.Tensor | None = None,
             draft: bool = False) -> torch.Tensor:
        """The compiled module over ``ids`` [B, T] at ``positions`` [B, T] on ``cache`` (the one-sequence cache by
        default; a batch's row cache with its ``mask``): logits [B, T, V]. Both are copied into inference tensors
        first: a tensor made outside ``inference_mode`` (a decoder's token) carries another dispatch key set, which
        dynamo guards on, and would compile the same graph again."""
        import torch
        import torch._inductor.config as inductor_config

        with torch.inference_mode():
            ids = ids if ids.is_inference() else ids.clone()
            positions = positions if positions.is_inference() else positions.clone()
            extra = {} if mask is None else {"attention_mask": mask if mask.is_inference() else mask.clone()}
            module = self._module if draft else self._step_module if ids.numel() == 1 else self._rows_module
            cache = self.cache if cache is None else cache
            key = self._call_key(module, ids, cache, mask, draft)
            if self._models is not None:
                args = (ids, positions, self._sm.cache_kwargs(cache), extra.get("attention_mask"))
                if key not in self._calls:  # loaded or built, and run once with its guards checked, kept safe
                    logits = graphs.recovering(self._cache_dir, lambda: self._first_call(key, module, args, draft),
                                               self._forget)
                    if logits is not None:
                        return logits
                elif (call := self._calls[key]) is not None:  # its graph ran: no folder, guard or compile on the way
                    return call(self._models[id(module)], *args)
            kwargs = {"input_ids": ids, "position_ids": positions, "use_cache": True, **extra,
                      **self._sm.cache_kwargs(cache)}
            if key in self._reused:  # its graph is there: nothing compiles, so inductor's settings need no patch
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                    return module(**kwargs).logits
            compiled = self._counters["stats"]["unique_graphs"]
            with inductor_config.patch(self._settings):  # the stance stays whatever it is (a test's)
                logits = graphs.recovering(self._cache_dir, lambda: module(**kwargs).logits, self._forget)
            if self._counters["stats"]["unique_graphs"] == compiled:
                self._reused.add(key)
            return logits

    def _first_call(self, key: tuple, module, args: tuple, draft: bool) -> torch.Tensor | None:
        """The first call of ``key`` over ``args`` (ids, positions, the cache's keyword, the mask or None): its
        precompiled call loaded, or built and kept, and run; ``None`` where it cannot be (``torch.compile`` runs it,
        this time and later)."""
        model = self._models[id(module)]
        # a call replays its graph (precompiled._Replay): ``key`` tells apart every model whose objects its graph
        # reads (the kernel's private copies never change; a draft is keyed by its stand-ins and head)
        rows = self._rows_of(module, args)
        call = self._calls[key] = precompiled.Call.of(self._cache_dir, model, args, _role(model, draft),
                                                      self._settings, rows=rows, shared=self._shared)
        if call is None and rows is not None:  # a model dynamo cannot trace for a range of widths: from here on,
            self._widths = None  # blocks of the kernel's own width, padded (torch.compile would build one per width)
        return None if call is None else call(model, *args)

    def _forget(self) -> None:
        """After ``graphs.recovering`` cleared the folder: nothing this process loaded or ran stands."""
        self._reused.clear()
        self._calls.clear()
        self._shared.clear()

    def _call_key(self, module, ids: torch.Tensor, cache, mask, draft: bool) -> tuple:
        """What picks a compiled call's graph: the module, the input's shape, the cache, whether a mask comes, and,
        for the model itself (which drafts change), the context a draft runs in (``drafting``), the model's
        attention implementation, and each layer, attention, MLP and the LM head as objects (a draft's stand-ins).
        Once a call of a key has run its graph again without compiling, later calls of that key skip dynamo's
        guard checks (``skip_guard_eval_unsafe``: only the guards that tell the compiled graphs apart run): 1.1-1.6
        ms of an 11-14 ms draft step and 1.2 ms of a 24 ms step on an AVX-512 Xeon (``studies/guards-cpu.md``). A
        call of any other key is checked in full, and compiles if it must. The key holds the objects it names, so
        no other can take one's identity. The kernel's private copies (``step_model``, ``rows_model``) never change
        after they are built, and are keyed by shape alone."""
        parts: tuple = (module, tuple(ids.shape), cache, mask is None)
        if module is not self._module:
            return parts
        hf, layers = self._sm.hf, tuple(self._sm.layers._modules.values())  # as they stand, without nn.Module's
        subs = tuple(layer._modules.get(name) for layer in layers for name in ("self_attn", "mlp"))  # __getattr__
        return (*parts, self._draft_context if draft else None, hf.config._attn_implementation,
                hf.get_output_embeddings(), layers, subs)


def _role(model, draft: bool) -> str:
    """A precompiled call's role: a draft's step or the full model's, and the attention it runs."""
    return f"{'draft' if draft else 'full'}:{model.config._attn_implementation}"


def build(sm: Adapter, kernel: Kernel, capacity: int) -> CompiledBlocks:
    """Compile the model for sequences of up to ``capacity`` positions (a minute or more, once per process)."""
    return CompiledBlocks(sm, kernel, capacity=capacity + kernel.chunk)


KERNEL = KernelSpec(
    name="inductor",
    summary="torch.compile (TorchInductor, frozen weights, autotuned CPU GEMMs) over a StaticCache: one token, "
            "and blocks of tokens",
    compiled=True,
    build=build,
    check=check,
    blocks=CHUNKS,
    default_block=DEFAULT_CHUNK,
)
