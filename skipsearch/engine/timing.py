"""The one timer. Every figure skipsearch reports is taken here.

On CUDA the device is synchronised before each reading, so queued kernels are counted;
on CPU ``perf_counter`` alone is exact enough. ``time.time`` is never used: it can jump.

The clock itself can be swapped for a block of code (``use_clock``): a test that checks what the cost model,
the harness or a search *does* with timings runs them against a clock it controls, so that its verdict does
not depend on what else the machine is running. Real runs never swap it: they read ``perf_counter``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")
Clock = Callable[[], float]  # seconds from an arbitrary origin, never going back

# A context variable, not a module global: a swapped clock stays with the code that swapped it (and its own
# thread), and is always put back.
_CLOCK: ContextVar[Clock] = ContextVar("skipsearch_clock", default=time.perf_counter)


@contextlib.contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    """Read ``clock`` instead of ``time.perf_counter`` in ``now`` (so in every timing) inside the block.

    The device is still synchronised before each reading. Yields ``clock``."""
    token = _CLOCK.set(clock)
    try:
        yield clock
    finally:
        _CLOCK.reset(token)


def sync(device: torch.device | str | None = None) -> None:
    """Wait for queued device work, so that a clock reading includes it."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev is None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def now(device: torch.device | str | None = None) -> float:
    """A synchronised reading of the clock (``perf_counter`` unless ``use_clock`` swapped it), in seconds."""
    sync(device)
    return _CLOCK.get()()


@dataclass(frozen=True)
class Timing:
    """Repeated timings of one callable, after warm-up."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)


def time_call(
    fn: Callable[[], T], *, device: torch.device | str | None = None, repeats: int = 3, warmup: int = 1
) -> tuple[Timing, T]:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; return timings and the last result."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    result = None
    for _ in range(warmup):
        result = fn()
    seconds = []
    for _ in range(repeats):
        start = now(device)
        result = fn()
        seconds.append(now(device) - start)
    return Timing(tuple(seconds)), result  # type: ignore[return-value]
