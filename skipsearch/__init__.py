"""skipsearch: find, ship and run self-speculative decoding draft profiles.

The layers are folders (docs/development.md): ``cli/`` over ``api/`` over ``search/``, ``bench/``, ``export/`` and
``roofline/``, over ``profile/``, ``methods/``, ``engine/``, ``model/``, ``files/`` and ``kernels/``, over the
ground floor's shared modules here (``config``, ``data``, ``hardware``, ``checkpoints``, ...).

Modules that sat at this top level until 0.1.0 moved into those folders. Their old import paths still work for
this release: each is the moved module itself (so patching either name patches the same object), and the first
import of an old path says where it went, once, as a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

# old path -> where it lives now; read by the finder below, and removed in the next release
MOVED = {
    "skipsearch.models": "skipsearch.model.skippable",
    "skipsearch.loader": "skipsearch.model.loader",
    "skipsearch.placement": "skipsearch.model.placement",
    "skipsearch.stand_ins": "skipsearch.model.stand_ins",
    "skipsearch.decoding": "skipsearch.engine.decoding",
    "skipsearch.batched": "skipsearch.engine.batched",
    "skipsearch.draft": "skipsearch.engine.draft",
    "skipsearch.harness": "skipsearch.engine.harness",
    "skipsearch.timing": "skipsearch.engine.timing",
    "skipsearch.surrogate": "skipsearch.engine.surrogate",
    "skipsearch.equivalence": "skipsearch.engine.equivalence",
    "skipsearch.calibration": "skipsearch.engine.calibration",
    "skipsearch.optimize": "skipsearch.search.optimize",
    "skipsearch.objective": "skipsearch.search.objective",
    "skipsearch.space": "skipsearch.search.space",
    "skipsearch.device_replan": "skipsearch.search.replan",
    "skipsearch.study": "skipsearch.search.study",
    "skipsearch.strategies": "skipsearch.search.strategies",
    "skipsearch.schedule": "skipsearch.files.schedule",
}


def _new_name(name: str) -> str | None:
    """Where an old path (or a module inside an old package) lives now; None when it did not move."""
    if not name.startswith("skipsearch."):  # every import of the process asks: most leave here
        return None
    for old, now in MOVED.items():
        if name == old or name.startswith(old + "."):
            return now + name[len(old):]
    return None


_SPECS: dict = {}  # old name -> the moved module's own spec


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import an old path as the module that now holds it: the same object under both names."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if _new_name(name) else None

    def create_module(self, spec):
        now = _new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {now}; the old path goes in the next release", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(now)
        _SPECS[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = _SPECS[module.__spec__.name]  # the import system gave it the old name's: put its own back


def _interrupted_early(signum, frame) -> None:
    import os

    os.write(2, b"interrupted\n")
    os._exit(130)


def _hold_early_interrupts() -> None:
    """Run as the command (``python -m skipsearch``, where runpy names the process ``-m`` while it imports the package,
    or the ``skipsearch`` script): a Ctrl-C before ``__main__.main`` puts its own handler in place ends the process
    as that one would, ``interrupted`` and exit 130, with no traceback: nothing has run yet. Imported as a library,
    the process's handler is left alone."""
    import os
    import signal
    import threading

    command = sys.argv[:1] == ["-m"] or (sys.argv[:1] and os.path.basename(sys.argv[0]) == "skipsearch")
    if (command and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, _interrupted_early)


_hold_early_interrupts()

if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.insert(0, _Moved())  # before the path finder, which would load a second copy from the old name
