"""A copy's packed weights in one block of memory: the stand-ins' buffers of a draft copy or a verify block's copy,
back to back in the order the forward reads them, in one anonymous mapping asked for as transparent huge pages
(Linux's ``madvise(MADV_HUGEPAGE)``) before anything touches it.

Why: on the AVX-512 Xeon under KVM of ``studies/weight-arena-cpu.md``, the same 540 MB of fp32 weights streamed
13-15% faster from huge pages (25-27 GB/s against 22-23), and a copy's weights allocated first in a process ran
slower than the same bytes allocated later. Each stand-in's buffers were their own allocations, on 4 KiB pages,
wherever the allocator put them. Nothing is computed differently: the bytes are the same, only where they live.

Where the OS has no huge pages (or ``madvise`` refuses), the mapping is used as it is; where there is no anonymous
``mmap`` (not Linux or macOS), the block is one ``torch.empty``.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterable

import torch
from torch import nn

from skipsearch.kernels.lowbit.modules import LowbitLinear

HUGE = 2 << 20  # x86-64's transparent huge page: the block starts on one
ALIGN = 64  # each tensor starts on a cache line


def hugepage_bytes(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of ``nbytes`` starting on a 2 MiB boundary of a fresh anonymous mapping that was asked for as
    huge pages before its first touch; a plain ``torch.empty`` where the OS has no such mapping."""
    try:
        buf = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, TypeError, OSError):  # no anonymous private mappings here
        return torch.empty(nbytes, dtype=torch.uint8)
    start = -ctypes.addressof(ctypes.c_char.from_buffer(buf)) % HUGE
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            buf.madvise(advice, start, nbytes)
        except OSError:  # a kernel built without transparent huge pages: 4 KiB pages, as before
            pass
    return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=start)  # keeps ``buf`` alive


def pack(modules: Iterable[nn.Module]) -> int:
    """Move every buffer of the stand-ins (``LowbitLinear``) under ``modules`` into one block (``hugepage_bytes``),
    in the order given, then each module's own. A storage shared by several buffers (siblings' whole buffers and
    their slices, ``siblings.py``) moves once, and its views stay views of it: one new tensor for each view, so
    siblings still hold one whole-buffer object, and a compiled graph still runs their one product. Each storage is
    freed as soon as it has moved, so the copy is held twice only one storage at a time. Returns the bytes moved;
    0 where there is nothing to move or the stand-ins are not on the CPU."""
    owners = [m for top in modules for m in top.modules() if isinstance(m, LowbitLinear)]
    views: dict[int, list[tuple[nn.Module, str, torch.Tensor]]] = {}  # a storage -> the buffers over it
    for m in owners:
        for name, t in m._buffers.items():
            if t is not None:
                if t.device.type != "cpu":
                    return 0
                views.setdefault(t.untyped_storage().data_ptr(), []).append((m, name, t))
    if not views:
        return 0
    total = sum(_padded(ts[0][2].untyped_storage().nbytes()) for ts in views.values())
    block, at = hugepage_bytes(total), 0
    for key in list(views):
        buffers = views.pop(key)
        storage = buffers[0][2].untyped_storage()
        block[at:at + storage.nbytes()].copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
        new: dict[tuple, torch.Tensor] = {}
        for m, name, t in buffers:
            shape = (t.dtype, t.size(), t.stride(), t.storage_offset())
            if shape not in new:
                new[shape] = block.view(t.dtype).as_strided(t.size(), t.stride(),
                                                            at // t.element_size() + t.storage_offset())
            m._buffers[name] = new[shape]
        at += _padded(storage.nbytes())
        del buffers, storage, t  # the old storage goes now, not with the last one
    return total


def _padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN
