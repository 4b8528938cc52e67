"""Ctrl-C held back while a block runs that must not be cut in half, and delivered where the caller can clean up.

Imports nothing beyond the standard library: ``python -m skipsearch`` uses it before the CLI's own modules load.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_seen: list[int] = []


def raise_interrupt(signum: int, frame: object) -> None:
    """The CLI's SIGINT handler: Python's own (raise KeyboardInterrupt), that also records the signal. Raised
    inside a callback from native code (safetensors' reader, for one), the KeyboardInterrupt can come back out as an
    unrelated error that the CLI would report as bad input; `interrupt_seen` tells the two apart."""
    _seen.append(signum)
    raise KeyboardInterrupt


def interrupt_seen() -> bool:
    """Whether Ctrl-C reached `raise_interrupt` in this process."""
    return bool(_seen)


@contextmanager
def held_interrupt(pending: list[int]) -> Iterator[None]:
    """Hold Ctrl-C back while this block runs; one that arrives is appended to ``pending`` for the caller to
    raise where it can clean up. Outside the main thread (where no signal handler can be set) the block runs as
    it is. Used around the CLI's imports (an interrupt inside a C extension's module initialisation can leave that
    module half made) and around `study.ask()` (interrupted inside it, the trial it just made would stay RUNNING,
    with no worker and no heartbeat, so that no worker could ever judge it lost)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
