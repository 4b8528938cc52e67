"""Memory around one call, for the bench: what was in use before it and the peak during it.

There is no single honest figure for "peak memory" on every device, so each probe says what
its numbers mean (``kind``), and the report prints that next to them:
- CUDA: bytes torch has allocated on the device (weights included), its peak reset per call;
- Linux CPU: the process's resident memory (weights, torch and Python included), its high-water
  mark reset per call through /proc/self/clear_refs;
- elsewhere: the process's lifetime peak, which cannot be reset, so later calls show no less.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass(frozen=True)
class MemoryProbe:
    """``reset`` then ``current`` before a call, ``peak`` after it; peak minus current is what it added."""

    kind: str
    reset: Callable[[], None] = field(compare=False, repr=False)
    current: Callable[[], int] = field(compare=False, repr=False)
    peak: Callable[[], int] = field(compare=False, repr=False)


def memory_probe(device: torch.device) -> MemoryProbe:
    if device.type == "cuda":
        return MemoryProbe(
            "CUDA memory allocated by torch (weights included), peak per call",
            lambda: torch.cuda.reset_peak_memory_stats(device),
            lambda: int(torch.cuda.memory_allocated(device)),
            lambda: int(torch.cuda.max_memory_allocated(device)),
        )
    status, clear = Path("/proc/self/status"), Path("/proc/self/clear_refs")
    try:
        # Writing 5 resets the resident high-water mark (Linux >= 4.0), so each call's peak is its own.
        clear.write_text("5")
        return MemoryProbe(
            "process resident memory (weights, torch and Python included), peak per call",
            lambda: clear.write_text("5"), lambda: _status_bytes(status, "VmRSS:"),
            lambda: _status_bytes(status, "VmHWM:"),
        )
    except OSError:  # not Linux, or not allowed here
        pass
    return MemoryProbe("process peak resident memory since start (cannot be reset here)", lambda: None,
                       _lifetime_peak, _lifetime_peak)


def _status_bytes(status: Path, key: str) -> int:
    for line in status.read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024  # reported in kB
    return 0


def _lifetime_peak() -> int:
    try:
        import resource  # POSIX only
    except ImportError:
        return 0
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
