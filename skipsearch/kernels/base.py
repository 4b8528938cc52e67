"""What every kernel shares: the ``Kernel`` value (a name and a block size, as ``--kernel``, profiles and cost files
write it), the record each kernel module exports (``KernelSpec``: how it parses, where it runs, what it builds),
the runner a compiled kernel builds and the report it gives, and the registry's functions.

No torch at import: the CLI validates ``--kernel``, and profiles their ``kernel``, before anything loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from skipsearch.config import ConfigError

DEFAULT_CHUNK = 4  # tokens per block, where a kernel takes a block size and none is given


@dataclass(frozen=True)
class Kernel:
    """A full-model forward implementation, as files and reports name it: ``eager``, ``inductor-c4``.

    The value crosses module boundaries (profiles, cost files, bench settings); what the kernel *does* is its
    registered ``KernelSpec`` (``spec``)."""

    name: str = "eager"  # a registered kernel's name; the default, eager, is HF's own forward
    chunk: int = DEFAULT_CHUNK  # tokens per compiled block (kernels that take a block size only)

    def __post_init__(self) -> None:
        spec = REGISTRY.get(self.name)
        if spec is None:
            raise ConfigError(f"unknown kernel {str(self.name)[:40]!r} (known: {', '.join(REGISTRY)})")
        if spec.blocks and self.chunk not in spec.blocks:
            raise ConfigError(f"kernel block must be one of {', '.join(map(str, spec.blocks))} tokens, "
                              f"got {self.chunk}")
        if not spec.blocks and self.chunk != DEFAULT_CHUNK:
            raise ConfigError(f"the {self.name} kernel takes no block size")

    @property
    def spec(self) -> KernelSpec:
        return REGISTRY[self.name]

    @property
    def compiled(self) -> bool:
        """Whether it builds compiled code for the full model's forwards (a ``KernelRunner``)."""
        return self.spec.compiled

    @property
    def label(self) -> str:
        """How files and reports name it: ``eager`` or ``inductor-c4``."""
        return f"{self.name}-c{self.chunk}" if self.spec.blocks else self.name

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class KernelReport:
    """How a compiled kernel was built, for people and for the files that record timings taken with it."""

    kernel: str  # its label, e.g. inductor-c4
    threads: int  # torch threads its generated code was compiled for
    capacity: int  # positions its cache holds
    compile_seconds: float  # building and compiling its graphs (and their warm-up calls)
    graphs: int  # graphs compiled so far; it stays the same while decoding (no recompilation)
    cache_dir: str  # the compiler's on-disk cache for this torch and thread count


class Adapter(Protocol):
    """What a kernel's ``build`` reads of the model adapter (``SkippableModel``, a layer above the kernels): the HF
    model it compiles, where it runs, and the keyword the modeling code takes its cache by."""

    hf: Any  # the transformers model
    layers: Any  # its decoder layers (nn.ModuleList), a draft's stand-ins swapped in
    device: Any  # torch.device
    dtype: Any  # torch.dtype

    def cache_kwargs(self, cache: Any, *, layer: bool = False) -> dict[str, object]: ...


class KernelRunner(Protocol):
    """What a compiled kernel's ``build`` returns: it owns one KV cache, and the adapter routes the full model's
    forwards on that cache here (after the prompt, which runs eagerly; see ``SkippableModel.forward``)."""

    kernel: Kernel
    cache: Any  # the KV cache its forwards run on (``SkippableModel.decode_cache`` hands it out)
    # the model a prompt (at position 0, on ``cache``) runs through eagerly: a copy of its own that shares the
    # model's weights (``panel``'s, on its products), or None: the adapter's own model
    prompt_model: Any
    graph_bytes: int  # what its last compile added to memory (frozen weights included): a new batch size's estimate

    def fits(self, kernel: Kernel, capacity: int) -> bool:
        """Whether it is ``kernel``, built for sequences of ``capacity`` positions or more (no rebuild needed)."""

    def report(self) -> KernelReport: ...

    def settle(self) -> None:
        """Finish its build: what it left building beside the process (``kernels/precompiled.build_aside``) waited
        for and checked. ``SkippableModel.use_kernel`` calls it once anything it warms meanwhile is built."""

    def fresh_cache(self, positions: int | None) -> Any:
        """Its cache, emptied, for a sequence of ``positions``: one ConfigError line if they do not fit."""

    def forward(self, ids: Any, start: int) -> Any:
        """The full model over ``ids`` [T] at positions start..: logits [T, V] in fp32; the cache ends at start + T."""

    def forward_one(self, ids: Any, start: int) -> Any:
        """One token ``ids`` [1] at ``start`` through the model as it stands (a draft's): logits [1, V]."""

    def draft_aside(self) -> None:
        """Inside ``drafting``: have a child of this process build the one-token graph of the model as it stands (a
        draft's) while this one goes on, where the kernel keeps its calls (``kernels/precompiled.build_aside``);
        the draft's first step then loads it. Nothing otherwise."""

    def drafting(self) -> AbstractContextManager[None]:
        """Held while a draft model's steps run (``SkippableModel.compiled_draft``): what they run in, set up once
        for all of them (``panel``: every attention switched to its packed one)."""

    def batch_cache(self, rows: int, positions: int) -> Any:
        """Its row cache (``kv_cache.row_cache``) for batches of ``rows`` and ``positions`` slots per row, its graphs
        for that batch size compiled: one ConfigError line if they do not fit."""

    @property
    def batch_sizes(self) -> frozenset[int]:
        """The batch sizes whose graphs it has compiled."""

    def owns(self, cache: Any) -> bool:
        """Whether ``cache`` is one of its batch caches."""

    def forward_rows(self, ids: Any, positions: Any, cache: Any) -> Any:
        """The full model over a batch, ``ids`` and ``positions`` [B, T], on one of its batch caches: logits
        [B, T, V] in fp32."""


def _runs_anywhere(kernel: Kernel, device: str, instead: str) -> None:
    return None


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: what its module exports as ``KERNEL`` and the registry holds (``kernels/__init__.py``)."""

    name: str  # what --kernel, profiles and cost files call it (lower-case letters)
    summary: str  # one line for people: what runs the forwards
    compiled: bool  # it builds a KernelRunner for the full model's forwards; False: the adapter's own eager ones
    # (adapter, kernel, capacity) -> the runner for sequences of up to ``capacity`` positions; None: run eagerly.
    # Called after ``check``; it may take a minute or more (compiling), once per process.
    build: Callable[[Any, Kernel, int], KernelRunner | None]
    # (kernel, device, instead) -> None, or one ConfigError line when ``device`` (cpu, cuda, cuda:N, auto, mps)
    # cannot run it here; called before the model loads. ``instead`` is how the caller's user asks for eager.
    check: Callable[[Kernel, str, str], None] = _runs_anywhere
    blocks: tuple[int, ...] = ()  # block sizes ``<name>-c<N>`` may give; (): it takes none
    keeps_graphs: bool = False  # its compiled graphs are kept on disk for later processes (``kernels/graphs.py``)
    default_block: int = DEFAULT_CHUNK  # the block of a bare ``<name>``, where it takes blocks

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z]+", self.name):
            raise ValueError(f"a kernel's name is lower-case letters, not {self.name!r}")
        if self.blocks and self.default_block not in self.blocks:
            raise ValueError(f"kernel {self.name}: its default block {self.default_block} is not one of its blocks")

    @property
    def forms(self) -> tuple[str, ...]:
        """How users write it, for messages: ``eager``; ``inductor``, ``inductor-c<block>``."""
        return (self.name, f"{self.name}-c<block>") if self.blocks else (self.name,)

    def parse(self, text: str) -> Kernel | None:
        """``text`` as this kernel (``name``, or ``name-c<N>`` where it takes blocks); None when it names another
        kernel; one ConfigError line when it names this one with a block it cannot take."""
        m = re.fullmatch(rf"{self.name}(?:-c(\d{{1,3}}))?", text)
        if m is None:
            return None
        if m.group(1) is not None and not self.blocks:
            raise ConfigError(f"the {self.name} kernel takes no block size")
        return Kernel(self.name, int(m.group(1)) if m.group(1) else self.default_block)


REGISTRY: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> KernelSpec:
    if spec.name in REGISTRY:
        raise ValueError(f"kernel {spec.name!r} is registered twice")
    REGISTRY[spec.name] = spec
    return spec


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def parse_kernel(text: str | Kernel | None) -> Kernel:
    """A registered kernel's name (``eager``, ``inductor``: its default block, ``inductor-c<N>``); None or empty:
    eager. One ConfigError line otherwise."""
    if isinstance(text, Kernel):
        return text
    if text is None or text == "":
        return Kernel()
    word = str(text).strip()
    for spec in REGISTRY.values():
        kernel = spec.parse(word)
        if kernel is not None:
            return kernel
    known = ", ".join(form for spec in REGISTRY.values() for form in spec.forms)
    raise ConfigError(f"unknown kernel {str(text)[:40]!r} (known: {known})")


def choose_kernel(option: str | None, recorded: str | None = None) -> Kernel:
    """The kernel a command runs: ``--kernel`` when given, else the one a profile records (``recorded``), else eager."""
    if option is not None and option != "":
        return parse_kernel(option)
    return parse_kernel(recorded) if recorded else Kernel()


def check_kernel(kernel: Kernel, device: str, *, instead: str = "--kernel eager") -> None:
    """A one-line ConfigError unless ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``, ``mps``) can run
    ``kernel`` here; called before the model loads. ``instead`` is how the caller's user asks for eager."""
    kernel.spec.check(kernel, device, instead)
