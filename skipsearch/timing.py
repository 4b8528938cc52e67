"""The one timer. Every figure skipsearch reports is taken here.

On CUDA the device is synchronised before each reading, so queued kernels are counted;
on CPU ``perf_counter`` alone is exact enough. ``time.time`` is never used: it can jump.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


def sync(device: torch.device | str | None = None) -> None:
    """Wait for queued device work, so that a clock reading includes it."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev is None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def now(device: torch.device | str | None = None) -> float:
    """A synchronised ``perf_counter`` reading, in seconds."""
    sync(device)
    return time.perf_counter()


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
