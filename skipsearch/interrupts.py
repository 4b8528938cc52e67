"""Ctrl-C held back while a block runs that must not be cut in half, and delivered where the caller can clean up.

The CLI takes SIGTERM (``timeout``, a scheduler or a container stopping the job) as it takes Ctrl-C: the command
keeps what it finished, stops what it started, says ``interrupted`` and exits 130. Left at its default, SIGTERM
ended the process at once, and a compile it had started beside itself ran on, orphaned (``die_with_parent``).

Imports nothing beyond the standard library: ``python -m skipsearch`` uses it before the CLI's own modules load.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_seen: list[int] = []


INTERRUPTS = (signal.SIGINT, signal.SIGTERM)  # the signals the CLI takes as Ctrl-C


def raise_interrupt(signum: int, frame: object) -> None:
    """The CLI's SIGINT and SIGTERM handler: Python's own (raise KeyboardInterrupt), that also records the signal.
    Raised inside a callback from native code (safetensors' reader, for one), the KeyboardInterrupt can come back out
    as an unrelated error that the CLI would report as bad input; `interrupt_seen` tells the two apart."""
    _seen.append(signum)
    raise KeyboardInterrupt


def interrupt_seen() -> bool:
    """Whether Ctrl-C reached `raise_interrupt` in this process."""
    return bool(_seen)


@contextmanager
def held_interrupt(pending: list[int]) -> Iterator[None]:
    """Hold Ctrl-C (and SIGTERM) back while this block runs; one that arrives is appended to ``pending`` for the caller
    to raise where it can clean up. Outside the main thread (where no signal handler can be set) the block runs as
    it is. Used around the CLI's imports (an interrupt inside a C extension's module initialisation can leave that
    module half made) and around `study.ask()` (interrupted inside it, the trial it just made would stay RUNNING,
    with no worker and no heartbeat, so that no worker could ever judge it lost)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in INTERRUPTS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def die_with_parent(parent: int) -> None:
    """In a child forked from ``parent`` (pid): on Linux, have the kernel kill it when the parent's forking thread
    ends, however the parent dies (SIGKILL, the OOM killer), so that no compile outlives its command; where the
    parent is gone already, exit now. Elsewhere the parent's own clean-up (``finally``, ``atexit``) is all there is."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)
