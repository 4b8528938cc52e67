"""Compiled graphs kept on disk: built once per machine, loaded by every later process.

A compiled kernel's graphs (the one-token step, the verify block, each draft's step, each batch size's pair) are
TorchInductor's: the first process that needs one traces, lowers and compiles it to C++ (minutes on 2 cores);
inductor's own caches, its FX graph cache and AOTAutograd's, keep the result in ``graphs_dir()`` and a later
process loads it in about a second a graph. What keeps an entry valid is inductor's own cache key (the traced
graph, its input shapes and strides, inductor's settings, the torch version), and this folder's name adds what
the generated C++ bakes in beyond that: the thread count and the exact CPU (``hardware.cpu_signature``: family,
model and ISA flags). A graph that does not match is compiled again, never misused. A kernel keeps only graphs
that read the weights as inputs (no frozen constants), so another model of the same shapes, or edited weights,
reuse a graph safely. ``kernels/precompiled.py`` keeps each call whole in the same folder, dynamo's trace too.

Writes are inductor's (each entry written to a temporary file and renamed), so two processes compiling at once
both end with whole entries. An entry that cannot be read (a truncated or garbage file) is, where torch notices it
while looking it up, compiled again: torch's own line becomes one notice of ours and the bad entries are removed
(``_Unreadable``). Where it makes the load fail instead (a truncated ``.so``), ``recovering`` clears this machine's
folder, says so in one line, and builds once more.

``skipsearch cache`` lists and clears the folders (``caches``, ``clear``). No torch at import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from skipsearch.config import ConfigError

_log = logging.getLogger(__name__)
T = TypeVar("T")

CAPACITY_STEP = 1024  # a kept graph's KV cache holds a multiple of this many positions: decode, costs and a
# search of ordinary prompts share one graph, where an exact capacity would compile one per prompt length
_FOLDERS = ("graphs", "inductor")  # under the cache root: this layout's, and the one before it (cleared too)


def graphs_root() -> Path:
    from skipsearch.kept import cache_dir

    return cache_dir() / _FOLDERS[0]


def graphs_dir(threads: int) -> Path:
    """This machine's folder for graphs compiled for ``threads`` torch threads under the installed torch."""
    import torch

    from skipsearch.hardware import cpu_signature

    return graphs_root() / f"torch-{torch.__version__.replace('+', '-')}-{threads}t-{cpu_signature()}"


def bucket(capacity: int) -> int:
    """The capacity a kept graph is built for: ``capacity`` rounded up to a multiple of ``CAPACITY_STEP``."""
    return -(-max(capacity, 1) // CAPACITY_STEP) * CAPACITY_STEP


def use(threads: int) -> Path:
    """Point inductor's on-disk caches at ``graphs_dir(threads)`` (made if missing) for this process's compiles,
    with its FX graph and AOTAutograd caches on, and return the folder."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    folder = graphs_dir(threads)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the compiled-graph cache {folder}: {exc.strerror or exc}; set "
                          "SKIPSEARCH_CACHE to a writable folder") from None
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)  # read by inductor whenever it compiles or loads
    _known_isa(folder)
    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    _UNREADABLE.folder = folder
    for name in _CACHE_LOGGERS:  # idempotent: a filter is added once
        logger = logging.getLogger(name)
        if _UNREADABLE not in logger.filters:
            logger.addFilter(_UNREADABLE)
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)  # AOTAutograd says so at INFO; the filter drops every other INFO line
    if not isinstance(sys.unraisablehook, _QuietHalfLoaded):
        sys.unraisablehook = _QuietHalfLoaded(sys.unraisablehook)
    return folder


_ISA_FILE = "vec-isa.txt"


def _known_isa(folder: Path) -> None:
    """Inductor checks each vector ISA that the CPU's flags list by compiling a test library and loading it in a
    second Python, about a second of every process that compiles or loads a graph. The first process on this folder
    (this exact CPU and torch) runs that check and records the ISAs that passed; every process then tells inductor
    to trust the flags (``cpp.vec_isa_ok``, part of inductor's cache key, so all of them set it alike), unless the
    flags now list other ISAs than the record, when the check runs again and the record is rewritten."""
    import torch._inductor.config as inductor_config
    from torch._inductor import cpu_vec_isa

    def isas(trusted: bool | None) -> str:
        """The ISAs inductor finds here: the flags' alone (trusted), or those that pass its check (None)."""
        inductor_config.cpp.vec_isa_ok = trusted
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        return ",".join(map(str, cpu_vec_isa.valid_vec_isa_list()))

    if inductor_config.cpp.vec_isa_ok is not None:  # set by the user (TORCHINDUCTOR_VEC_ISA_OK), or already here
        return
    path = folder / _ISA_FILE
    try:
        recorded = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        recorded = None
    if recorded is not None and isas(True) == recorded:
        return
    passed = isas(None)  # no record, or the flags and the record disagree: check them
    tmp = path.with_name(f"{_ISA_FILE}.{os.getpid()}")
    with contextlib.suppress(OSError):
        tmp.write_text(passed + "\n", encoding="utf-8")
        os.replace(tmp, path)
    if isas(True) != passed:  # an ISA the flags list failed its check: trusting them would pick it,
        inductor_config.cpp.vec_isa_ok = None  # so every process checks, and nothing is recorded
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        with contextlib.suppress(OSError):
            path.unlink()


class _QuietHalfLoaded:
    """``sys.unraisablehook`` that drops one known torch 2.13 message: a kept graph that failed to unpickle
    half-way is collected later, and its ``CompiledFxGraph.__del__`` reads an attribute it never got, printing a
    traceback though nothing is wrong (the notice above has said what happened). Every other one goes on."""

    def __init__(self, hook) -> None:
        self._hook = hook

    def __call__(self, unraisable) -> None:
        where = getattr(unraisable.object, "__qualname__", "")
        if where == "CompiledFxGraph.__del__" and isinstance(unraisable.exc_value, AttributeError):
            return
        self._hook(unraisable)


# Where torch's caches say that a kept entry could not be read (then they compile it again): inductor's FX graph
# cache (a warning with a traceback) and AOTAutograd's (an info line).
_CACHE_LOGGERS = ("torch._inductor.codecache", "torch._functorch._aot_autograd.autograd_cache")


class _Unreadable(logging.Filter):
    """Turns torch's "unable to load compiled graph" lines into one notice of ours per process (the entry is
    compiled again and written over), and keeps those loggers' other lines below warning off the terminal."""

    folder: Path | None = None
    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "unable to load compiled graph" in str(record.msg):
            if not self.said and self.folder is not None:
                unreadable(self.folder)
                _prune(self.folder)  # torch writes the new entry beside the bad one: remove the bad one
            return False
        return record.levelno >= logging.WARNING


_UNREADABLE = _Unreadable()


def unreadable(folder: Path) -> None:
    """Say, once a process, that a kept entry in ``folder`` could not be read and is built again (the same notice
    as torch's own caches give)."""
    if not _UNREADABLE.said:
        _UNREADABLE.said = True
        _log.warning("a compiled graph kept in %s could not be read (truncated or garbage); compiling it again", folder)


def _prune(folder: Path) -> None:
    """Remove the entries of inductor's FX graph and AOTAutograd caches in ``folder`` that do not unpickle. Torch
    keeps every entry of a key in one folder and writes a new one beside a bad one, which it would try, and warn
    about, in every later process."""
    import pickle

    for sub in ("fxgraph", "aotautograd"):
        for path in (folder / sub).rglob("*"):
            if not path.is_file() or path.name.startswith("."):
                continue
            try:
                pickle.loads(path.read_bytes())
            except Exception:
                with contextlib.suppress(OSError):
                    path.unlink()


def recovering(folder: Path, build: Callable[[], T], on_reset: Callable[[], object] | None = None) -> T:
    """``build()`` (a compiled call that may compile or load graphs); if it fails with anything but bad input or
    an interrupt while ``folder`` held entries (one that cannot be read: truncated, garbage), clear ``folder``,
    say so in one line, forget what this process compiled (dynamo's frames; ``on_reset()``: the caller's own
    record of them), and build once more, from scratch. A second failure is raised as it is."""
    had_entries = _has_files(folder)
    try:
        return build()
    except (ConfigError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:
        if not had_entries:
            raise
        cause = _root(exc)
        first = str(cause).strip().splitlines()[0][:160] if str(cause).strip() else ""
        if not _UNREADABLE.said:  # one notice a process: torch's own "unable to load" line may have given it
            _UNREADABLE.said = True
            _log.warning("the compiled-graph cache %s could not be read (%s%s); cleared it, compiling again",
                         folder, type(cause).__name__, f": {first}" if first else "")
        _reset_compiler()
        if on_reset is not None:
            on_reset()
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        return build()


def names_entry(folder: Path, exc: BaseException) -> bool:
    """Whether ``exc``, or an error inside it, names a file in ``folder``: inductor failed to import or load one of
    its own kept entries (a garbage ``.py`` it found where it would have written its code), not the model."""
    return any(str(folder) in str(e) for e in _causes(exc))


def _root(exc: BaseException) -> BaseException:
    """The innermost cause: dynamo wraps what inductor raised (``BackendCompilerFailed``) around the real error."""
    *_, innermost = _causes(exc)
    return innermost


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then each error it wraps (inductor's ``inner_exception``, else ``__cause__``), outermost first."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = getattr(exc, "inner_exception", None) or exc.__cause__


def _reset_compiler() -> None:
    """Forget what this process compiled or loaded from the cleared folder (dynamo's frames, inductor's modules)."""
    import torch

    torch._dynamo.reset()
    with contextlib.suppress(Exception):
        from torch._inductor.codecache import PyCodeCache

        PyCodeCache.cache_clear(purge=False)


def _has_files(folder: Path) -> bool:
    return folder.is_dir() and any(p.is_file() for p in folder.rglob("*"))


_BUILDS = "builds.json"  # in this machine's folder: how long each kernel's longest build took, for the next notice


def building(label: str, *, keeps: bool) -> str:
    """What a kernel's build says while it runs, with what to expect: a first build on this machine, or kept graphs
    and how long building them took (what a build costs again where they no longer fit)."""
    if not keeps:
        return f"compiling {label} graphs (every process compiles this kernel: minutes)"
    last = last_build(label)
    if last is None:
        return (f"compiling {label} graphs (the first time on this machine and thread count: minutes; later "
                "processes load them)")
    return f"loading {label} graphs (kept on this machine; building them took {last:.0f} s)"


def last_build(label: str) -> float | None:
    """Seconds ``label``'s graphs took to build on this machine at this thread count, where they were built and kept
    here before (a later process is to load them); None where they never were."""
    import torch

    return _builds(graphs_dir(torch.get_num_threads())).get(label)


def record(label: str, seconds: float) -> None:
    """Note how long ``label``'s build took in this machine's folder (best effort: a notice's figure only). The
    longest is kept: a process that loaded the graphs in seconds does not hide what building them cost."""
    import json

    import torch

    folder = graphs_dir(torch.get_num_threads())
    before = _builds(folder)
    builds = {**before, label: round(max(seconds, before.get(label, 0.0)), 1)}
    with contextlib.suppress(OSError):
        tmp = folder / f".{_BUILDS}.{os.getpid()}"
        tmp.write_text(json.dumps(builds, sort_keys=True))
        os.replace(tmp, folder / _BUILDS)


def _builds(folder: Path) -> dict[str, float]:
    import json

    try:
        data = json.loads((folder / _BUILDS).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int | float)} if isinstance(
        data, dict) else {}


@dataclass(frozen=True)
class GraphCache:
    """One folder of kept graphs: a torch version, thread count and CPU (or the layout before, ``inductor/``)."""

    path: str
    files: int
    bytes: int
    modified: float  # newest file's mtime (seconds since the epoch); 0 when empty
    here: bool  # this machine's folder (for some thread count) under the installed torch

    @property
    def name(self) -> str:
        return Path(self.path).name


def caches() -> tuple[GraphCache, ...]:
    """Every kept-graph folder under the cache root, this machine's first."""
    from skipsearch.kept import cache_dir, usage

    try:
        from skipsearch.hardware import cpu_signature

        signature = cpu_signature()
    except Exception:  # listing never fails on a probe
        signature = "?"
    found = []
    for top in _FOLDERS:
        root = cache_dir() / top
        if not root.is_dir():
            continue
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            held = usage(folder)
            found.append(GraphCache(str(folder), held.files, held.bytes, held.modified,
                                    top == _FOLDERS[0] and folder.name.endswith(signature)))
    return tuple(sorted(found, key=lambda c: (not c.here, c.path)))


def clear(selected: tuple[GraphCache, ...] | None = None) -> tuple[GraphCache, ...]:
    """Remove ``selected`` folders (default: every one ``caches()`` lists) and return what was removed."""
    from skipsearch.kept import remove

    gone = caches() if selected is None else selected
    for cache in gone:
        remove(Path(cache.path))
    return gone


__all__ = ["CAPACITY_STEP", "GraphCache", "bucket", "building", "caches", "clear", "graphs_dir",
           "graphs_root", "names_entry", "record", "recovering", "unreadable", "use"]
