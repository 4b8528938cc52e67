"""A kept graph's whole call, dynamo's trace included: precompiled once per machine, loaded by later processes.

Inductor's caches (``kernels/graphs.py``) keep what inductor and AOTAutograd build, but every process still ran
dynamo over the model's Python to find which graph to load: about 8 s a graph for smollm2-135m on a 2-core Zen 4,
24 s of a 43 s warm ``decode`` (``studies/startup-cpu.md``). Torch's precompile (``aot_compile``: dynamo's capture,
guards and bytecode, and the compiled graph, in one file) keeps that too: a later process loads a call in about a
second and runs it without tracing, as fast as a traced one.

What a call is: ``logits(model, input_ids, position_ids, cache, attention_mask)``, one module function compiled
whole (``fullgraph``) for one input shape. Its file is named by a hash of what the traced code bakes in and its
saved guards cannot check (``entry_key``, in ``kernels/call_key.py``):
- the model's structure as it stands: every module's class, its tensors' shapes and dtypes, its plain settings (a
  draft's stand-ins change it), and its config;
- the call's role (a full-model step or block, a draft's step; its attention), the shapes of its inputs and its
  mask (a batch's) and its cache's (capacity, layer kind): another capacity bucket is another call;
- inductor's settings;
- the versions of torch and transformers, and a hash of the skipsearch source that runs inside a call (kernels,
  model, methods, the KV cache): any edit of it builds the calls anew.

Guards on identity (which object, which function) and on globals cannot be saved and are dropped; the caller's
in-process key (``CompiledBlocks._call_key``) still holds the objects. Guards on the model and what it holds are
dropped too (``_savable``; a few on its classes' attributes are kept): what they check (each module's class and
attributes, each tensor's shape, stride, dtype and device, which objects are shared, hooks) is in the file's name
(``structure``), and a loaded call rebuilds every guard it keeps:
smollm2-135m's calls kept 6,555, 6,000 of them on the model, which took seconds of each later process's start
(``studies/startup-cpu.md``). The other guards (the inputs' and the cache's shapes, strides and dtypes, the global
state) are checked on a loaded call's first run, and a call that fails them is built again. Weights are the call's
inputs, never its constants: edited weights of the same shapes load the same file and are read.

A file that cannot be read is built again with ``graphs``' one notice a process. Files are written whole (torch
writes a temporary file and renames it), so two processes building the same call both end with a whole one.

A first build on a machine of more than one core builds calls side by side (``build_aside``): forked children build
and save calls (the one-token step, the verify block) while this process builds another (a draft's), and the
first call of a child's file waits for it, then loads it. A C++ compile runs on one core, so two builds take
about as long as one (``studies/startup-cpu.md``); so do a search's precision drafts (the kernel's
``draft_aside``), each about one core's work. Nothing is timed while a child builds: ``settle_aside`` waits for
them first. A child that fails leaves no file, and this process builds the call itself; one that outlives
``ASIDE_SECONDS`` is stopped first. The child runs nothing but the build (no graph, no thread pool of its own), and
its output goes nowhere: what it built is checked where it is loaded. A call dynamo cannot capture whole (a graph
break) is not precompiled: the caller falls back to ``torch.compile``.
A saved call runs skipsearch's own operators through the dispatcher, so they are loaded before any call is (a
dispatcher call of an operator nobody registered ends the process). No torch at import.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from skipsearch.config import ConfigError
from skipsearch.interrupts import die_with_parent
from skipsearch.kernels import graphs
from skipsearch.kernels.call_key import cache_shape, entry_key, structure

_log = logging.getLogger(__name__)

FOLDER = "calls"  # under a machine's graph folder (``graphs.graphs_dir``)
_CLEARING: set[Path] = set()  # graph folders a failed build had cleared (Call.of): once a process each
# this process's precompiled calls: loaded, built (here or by a child of it: "aside" counts those too), refused (fell
# back to torch.compile), stale (built again)
COUNTS: Counter = Counter()
ASIDE_SECONDS = 900.0  # the longest a child's build is waited for; a first build of one call takes 1-3 minutes
_ASIDE: dict[Path, int] = {}  # a call's file -> the pid of the child of this process building it
_SETTLED: dict[Path, bool] = {}  # a call's file -> whether its child built it, waited for before its first Call.of
Rows = tuple[int, int] | None  # the row counts one call covers (its ids' last dimension), or None: its shape alone
# guards that name an object or a function by identity: a later process has other objects, so they cannot be saved
_IDENTITY = frozenset({"ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE"})


def logits(model, input_ids, position_ids, cache, attention_mask=None):
    """The call kept: the HF model over one block on its cache (a batch's row cache with its mask), its logits. A
    module function, so that the saved call names it, and the cache a positional argument, whatever keyword the
    installed transformers takes it by (``cache`` is that keyword and the cache, one item)."""
    mask = {} if attention_mask is None else {"attention_mask": attention_mask}
    return model(input_ids=input_ids, position_ids=position_ids, use_cache=True, **cache, **mask).logits


_MODEL = ("model.", "model[")  # how a guard's name starts where it is on the model argument or anything under it
# (dynamo's filter names a source without its scope: ``L['model'].config`` is ``model.config``)


def _savable(entries) -> list[bool]:
    """dynamo's guard filter: keep every guard but those on identity and on globals (neither can be saved) and those
    on the model and what it holds (``structure`` keys what they check). A few guards that reach the model's classes
    through an expression (``dict(type(model.config).__mro__[1].__dict__)``, the transformers code's: keyed by its
    version) are kept: dropping every guard through the model leaves dynamo's saved key-order checks of its dicts
    without the model to read when the call loads."""
    return [not (e.is_global or e.guard_type in _IDENTITY or _IDENTITY.intersection(e.derived_guard_types or ())
                 or e.name == "model" or e.name.startswith(_MODEL)) for e in entries]


def _path(folder: Path, model, args: tuple, role: str, settings: dict, rows: Rows = None) -> Path:
    """Where the call of ``logits`` on ``model`` over ``args`` (ids, positions, the cache's keyword, the mask or
    None) for ``role`` is kept; with ``rows``, the one call of every row count in that range."""
    ids, positions, cache, mask = args

    def shape(t) -> tuple:
        return tuple(t.shape) if rows is None else (*t.shape[:-1], f"{rows[0]}..{rows[1]}")

    shapes = (shape(ids), shape(positions), None if mask is None else tuple(mask.shape),
              *(cache_shape(c) for c in cache.values()))
    return folder / FOLDER / f"{entry_key(model, role, shapes, settings)}.bin"


def built_note(before: Counter) -> str:
    """What the end of a step that was to load kept calls adds where this process built some instead (``COUNTS``
    since ``before``, a copy): none was kept for these shapes (another capacity bucket, a draft not decoded here
    before) or for this skipsearch, torch and transformers. "" where none was built."""
    built = COUNTS["built"] - before["built"]
    if not built:
        return ""
    loaded = COUNTS["loaded"] - before["loaded"]
    return f": {built} of {built + loaded} graphs built (none kept for these shapes and versions)"


def build_aside(folder: Path, model, args: tuple, role: str, settings: dict, rows: Rows = None) -> None:
    """Start building the call ``Call.of`` would build for these arguments in a forked child of this process, where
    its file is missing, none is being built already, and this machine has a core to spare: the caller goes on
    to build another call meanwhile, and the first ``Call.of`` of this one waits for the child."""
    path = _path(folder, model, args, role, settings, rows)
    if path.is_file() or path in _ASIDE or not hasattr(os, "fork") or (os.cpu_count() or 1) < 2:
        return
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: build, save, and leave without running anything of the parent's at exit
        code = 1
        try:
            die_with_parent(parent)  # a parent killed outright (SIGKILL) leaves no compile running
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            # new streams and no logging: another thread of the parent (a ticking notice) may have held the old
            # streams' locks at the fork, and nothing of the child's is for the terminal
            sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the child's until os._exit
            logging.disable(logging.CRITICAL)
            import torch
            import torch._inductor.config as inductor_config

            inductor_config.compile_threads = 1  # no pool of compile workers: the parent's are not the child's
            with torch.inference_mode():
                _build(path, model, args, settings, rows)
            code = 0
        finally:
            os._exit(code)
    _ASIDE[path] = pid


def settle_aside() -> None:
    """Wait for every child still building a call (``build_aside``): nothing is timed while a build runs beside it
    (``engine/harness`` calls this before it times anything). Each call's first ``Call.of`` then loads it."""
    for path in list(_ASIDE):
        _SETTLED[path] = _await(path)


def _await(path: Path) -> bool:
    """Wait for the child building ``path``, if any (stopped after ``ASIDE_SECONDS``): whether it built the call."""
    if path in _SETTLED:
        return _SETTLED.pop(path)
    pid = _ASIDE.pop(path, None)
    if pid is None:
        return False
    deadline = time.monotonic() + ASIDE_SECONDS
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            _log.debug("the build of %s beside this process took over %.0f s: stopped", path.name, ASIDE_SECONDS)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.1)
    return os.waitstatus_to_exitcode(status) == 0 and path.is_file()


def stop_aside() -> None:
    """Stop every child still building a call (an interrupt, an error, or the end of the process): no compile
    outlives the command that started it."""
    while _ASIDE:
        _, pid = _ASIDE.popitem()
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


atexit.register(stop_aside)  # no child outlives this process (a child leaves by os._exit, which skips it)


class Call:
    """One precompiled call of ``logits`` on ``model`` for one role and shape, kept in ``folder``: loaded from its
    file, else built and saved. Its first run checks dynamo's saved guards against the arguments (a loaded call
    that fails them is built again); later runs skip that check, as the caller's own key already tells its calls
    apart, and check only their own tensors' shapes, strides and dtypes against the first run's (the `panel`
    kernel's C++ wrapper does not assert its inputs'). ``None`` from ``of`` where dynamo cannot capture the call
    whole.

    Later runs skip dynamo's bytecode too, where two recorded runs allow it (``_Replay``): the caller keeps one call
    per model whose objects its graph reads, and per cache.

    With ``rows`` (a range of row counts, say 2 to 8), the graph is compiled once for every count in that range (the
    ids' and positions' last dimension dynamic) and kept in one file; each count still gets a ``Call`` of its own
    (its own first check, signature and replay), which shares the loaded graph through the caller's ``shared``
    (file -> loaded call): a verify of 3 tokens then runs 3 rows, not a block padded to 8."""

    def __init__(self, fn, build: Callable[[], object], settings: dict, path: Path, rows: Rows = None) -> None:
        self._fn, self._build, self._checked, self._settings = fn, build, False, settings
        self.path = path  # its file
        self._replay = _Replay(sized=rows is not None)
        self._signature: tuple | None = None  # its own tensors' shapes, strides and dtypes, as its first run had them

    @classmethod
    def of(cls, folder: Path, model, args: tuple, role: str, settings: dict, *, rows: Rows = None,
           shared: dict | None = None) -> Call | None:
        path = _path(folder, model, args, role, settings, rows)

        def build():
            return _build(path, model, args, settings, rows)

        if shared is not None and path in shared:  # another row count of the same call: its graph is loaded
            return cls(shared[path], build, settings, path, rows)
        aside = _await(path)
        fn = _load(path, folder, settings, aside=aside)
        if fn is None:
            try:
                fn = build()
            except (ConfigError, KeyboardInterrupt, MemoryError):
                raise
            except Exception as exc:  # a graph break, an object torch cannot save: torch.compile runs it instead
                if graphs.names_entry(folder, exc) and folder not in _CLEARING:  # not the call: a bad entry of
                    _CLEARING.add(folder)  # inductor's own caches; graphs.recovering (the caller's) clears the
                    raise  # folder and builds again, once a process (a second failure falls back as below)
                COUNTS["refused"] += 1
                _log.debug("call %s not precompiled (%s: %s); torch.compile runs it", role, type(exc).__name__, exc)
                return None
        if shared is not None:
            shared[path] = fn
        return cls(fn, build, settings, path, rows)

    def __call__(self, model, *args):
        if not self._checked:
            import torch._inductor.config as inductor_config

            with inductor_config.patch(self._settings):  # what its C++ was compiled under: nothing compiles again
                if not self._fn.guard_check(model, *args):  # shapes, strides or constants other than when built
                    COUNTS["stale"] += 1
                    self._fn = self._build()
                self._fn.disable_guard_check()
                self._checked = True
                self._signature = _signature(args)
                return self._fn(model, *args)
        if _signature(args) != self._signature:  # what inductor's size asserts would catch: they are off (panel.py)
            raise RuntimeError(f"precompiled call {self.path.name} was checked for arguments {self._signature} and "
                               f"called with {_signature(args)}: its caller's key must tell such calls apart")
        return self._replay(self._fn, model, args)


def _signature(args: tuple) -> tuple:
    """The shapes, strides and dtypes of a call's own tensors (its ids, positions and mask): what its graph was
    checked for on its first run. A microsecond or two, where the C++ wrapper's asserts of every input took 0.3 ms."""
    import torch

    return tuple((a.shape, a.stride(), a.dtype) for a in args if isinstance(a, torch.Tensor))


class _Replay:
    """A call's later runs without dynamo's bytecode. That bytecode gathers the compiled graph's inputs from the
    model and the cache (397 tensors for smollm2-135m: every weight read through its modules' dicts), calls the
    graph, and sets back what the traced Python set (each sibling group's state: 180 attributes a step, to the
    values they already hold): 0.37 ms of a 4.7 ms int8 step on a Zen 5 (``studies/replay-cpu.md``). Two runs
    through the bytecode are recorded; where they passed the graph the same objects but for the call's own
    tensors (its ids, positions and mask), and returned the same output of it, later runs call the graph as the
    bytecode does (AOTAutograd's runtime wrapper, then inductor's C++) on those objects, the call's tensors put
    in. A call whose recorded runs differ otherwise keeps running the bytecode. Sound only where the model and the
    cache keep their tensors (the same objects, written in place) for as long as the call is theirs, which the
    caller of ``Call`` promises: ``CompiledBlocks`` keys a call by the model's layers, sublayers and head as
    objects, so a draft that swaps its stand-ins in gets a call of its own."""

    RECORDS = 2

    def __init__(self, *, sized: bool = False) -> None:
        self._seen: list[tuple] = []  # (inputs, slots, output index) of each recorded run
        self._run: Callable | None = None
        self._off = False
        # a call of a graph compiled for a range of row counts (``Call``'s ``rows``) is passed its row count too, a
        # number equal to its ids' last dimension, which a ``Call`` of one row count fixes
        self._sized = sized

    def __call__(self, fn, model, args: tuple):
        if self._run is not None:
            return self._run(args)
        if self._off:
            return fn(model, *args)
        return self._record(fn, model, args)

    def _record(self, fn, model, args: tuple):
        import torch

        env, name = getattr(fn, "fn", None), getattr(getattr(fn, "_artifacts", None), "backend_id", None)
        graph = env.__globals__.get(name) if env is not None and name else None
        if graph is None:  # another torch's layout: nothing to record
            self._off = True
            return fn(model, *args)
        seen: dict = {}

        def recording(*inputs, **kwargs):
            out = graph(*inputs, **kwargs)
            seen.update(inputs=inputs, kwargs=kwargs, out=out)
            return out

        env.__globals__[name] = recording
        try:
            result = fn(model, *args)
        finally:
            env.__globals__[name] = graph
        own = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]  # ids, positions, the mask
        inputs, out = seen.get("inputs"), seen.get("out")
        at = next((k for k, x in enumerate(out) if x is result), None) if isinstance(out, (list, tuple)) else None
        rows = args[0].shape[-1] if self._sized else None  # the one number a call of a row range may be passed

        def known(x) -> bool:  # a tensor (identity tells it), or the call's row count
            return isinstance(x, torch.Tensor) or (rows is not None and type(x) is int and x == rows)

        if (inputs is None or seen["kwargs"] or at is None  # not one plain call whose output it returns
                or not all(known(x) for x in inputs)):  # another number, which identity cannot tell
            self._off = True
            return result
        slots = tuple((k, i) for k, x in enumerate(inputs) for i, a in own if x is a)
        self._seen.append((inputs, slots, at))
        if len(self._seen) == self.RECORDS:
            self._settle(graph)
        return result

    def _settle(self, graph) -> None:
        """Replay from now on where the recorded runs agree (see the class), else run the bytecode."""
        (first, slots, at), *others = self._seen
        mine = {k for k, _ in slots}
        same = all(len(inputs) == len(first) and s == slots and a == at
                   and all(x is y or (type(x) is int and x == y)  # a row count: equal, not the same object
                           for k, (x, y) in enumerate(zip(inputs, first, strict=True)) if k not in mine)
                   for inputs, s, a in others)
        self._seen = []
        if not same or not slots:
            self._off = True
            return
        template = list(first)

        def run(args: tuple):
            inputs = template.copy()
            for k, i in slots:
                inputs[k] = args[i]
            return graph(*inputs)[at]

        self._run = run


def _load(path: Path, folder: Path, settings: dict, *, aside: bool = False):
    """The call saved at ``path``, or ``None`` where there is none; one that cannot be read is removed, with one
    notice a process (``graphs.unreadable``). It loads under inductor's ``settings``, the ones it was built with:
    inductor looks its C++ up by the compiler's command line, so under other settings (the wrapper's -Og) it would
    compile it again. ``aside``: a child of this process built it (``build_aside``), so it counts as built here,
    not as kept."""
    import torch
    import torch._inductor.config as inductor_config

    from skipsearch.kernels.lowbit.build import check_lowbit

    if not path.is_file():
        return None
    check_lowbit()  # a saved call runs skipsearch's ops through the dispatcher: they must be registered before it runs
    try:
        with path.open("rb") as handle, inductor_config.patch(settings):
            fn = torch.compiler.load_compiled_function(handle)
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception:
        graphs.unreadable(folder)
        path.unlink(missing_ok=True)
        return None
    COUNTS.update(("built", "aside") if aside else ("loaded",))
    return fn


def _build(path: Path, model, args: tuple, settings: dict, rows: Rows = None):
    """Capture, compile and save the call (dynamo's precompile, under inductor's ``settings``); with ``rows``, for
    every row count in that range (the ids' and positions' last dimension marked dynamic within it)."""
    import torch
    import torch._inductor.config as inductor_config

    from skipsearch.kv_cache import unguarded

    if rows is not None:
        for tensor in args[:2]:
            torch._dynamo.mark_dynamic(tensor, tensor.dim() - 1, min=rows[0], max=rows[1])
    compiled = torch.compile(logits, fullgraph=True, dynamic=None if rows else False,
                             options={"guard_filter_fn": _savable})
    with inductor_config.patch(settings), unguarded(*args[2].values()):
        fn = compiled.aot_compile(((model, *args), {}))
    path.parent.mkdir(parents=True, exist_ok=True)
    fn.save_compiled_function(str(path))
    COUNTS["built"] += 1
    return fn


__all__ = ["ASIDE_SECONDS", "COUNTS", "Call", "build_aside", "built_note", "cache_shape", "entry_key", "logits",
           "settle_aside", "stop_aside", "structure"]
