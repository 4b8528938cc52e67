"""A copy's packed weights in one block of memory: the stand-ins' buffers of a draft copy or a verify block's copy,
back to back in the order the forward reads them, in one anonymous mapping asked for as transparent huge pages
(Linux's ``madvise(MADV_HUGEPAGE)``) before anything touches it.

Why: on the AVX-512 Xeon under KVM of ``studies/weight-arena-cpu.md``, the same 540 MB of fp32 weights streamed
13-15% faster from huge pages (25-27 GB/s against 22-23), and a copy's weights allocated first in a process ran
slower than the same bytes allocated later. Each stand-in's buffers were their own allocations, on 4 KiB pages,
wherever the allocator put them. Nothing is computed differently: the bytes are the same, only where they live.

Where the OS has no huge pages (or ``madvise`` refuses), the mapping is used as it is; where there is no anonymous
``mmap`` (not Linux or macOS), the block is one ``torch.empty``.

A block of ``KEEP_FROM`` bytes or more is kept for later processes, in a file under ``kept_folder()``. Fresh huge
pages cost their first touch: 0.7-0.9 s for the 560 MB of smollm2-135m's fp32 panels on the Zen 5 of
``studies/startup-cpu.md`` (the kernel finds and zeroes 2 MiB pages), against 13 ms to map the same bytes from a
kept file whose page cache holds large folios, which Linux then maps as huge pages too (ext4 and XFS on recent
kernels), streamed as fast. A kept file is used only where its bytes equal, byte for byte, the block this process
would build (the stand-ins are built first either way), so a stale, foreign or damaged file costs a rewrite, never
a wrong output. Where files map on small pages, none is kept: the fresh block is the faster one.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from skipsearch.kernels.lowbit.modules import LowbitLinear

HUGE = 2 << 20  # x86-64's transparent huge page: the block starts on one
ALIGN = 64  # each tensor starts on a cache line
KEEP_FROM = 64 << 20  # a block this large or larger is kept in a file for later processes (a smaller one's fresh
# huge pages cost milliseconds)
KEPT_DAYS = 14  # a kept block no process used for this long is removed when another is kept
HUGE_SHARE = 0.9  # a kept file is used where this share of it or more maps as huge pages (68%: 1.5-2% slower)
_FORMAT = 1  # in every kept file's name: a new layout of the block reads no old file
_SMALL_PAGES = "small-pages"  # the folder's mark where its files map on small pages

_log = logging.getLogger(__name__)


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
    """Move every buffer of the stand-ins (``LowbitLinear``) under ``modules`` into one block, in the order given,
    then each module's own. The block is this machine's kept file of the same bytes where one maps as huge pages
    (``_kept_block``), else fresh memory asked for as huge pages (``hugepage_bytes``), which is then kept for later
    processes (``_keep``). A storage shared by several buffers (siblings' whole buffers and their slices,
    ``siblings.py``) moves once, and its views stay views of it: one new tensor for each view, so siblings still
    hold one whole-buffer object, and a compiled graph still runs their one product. Each storage is freed as soon
    as it has moved, so the copy is held twice only one storage at a time. Returns the bytes moved; 0 where there
    is nothing to move or the stand-ins are not on the CPU."""
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
    sources: list[torch.Tensor | None] = [_bytes(ts[0][2].untyped_storage()) for ts in views.values()]
    total = sum(_padded(s.numel()) for s in sources)
    kept = _name(sources, total) if total >= KEEP_FROM else None
    block, keep = _kept_block(sources, total, kept) if kept else (None, False)
    fresh = block is None
    if fresh:
        block = hugepage_bytes(total)
    at = 0
    for i, key in enumerate(list(views)):
        buffers, source, sources[i] = views.pop(key), sources[i], None
        if fresh:
            block[at:at + source.numel()].copy_(source)
        new: dict[tuple, torch.Tensor] = {}
        for m, name, t in buffers:
            shape = (t.dtype, t.size(), t.stride(), t.storage_offset())
            if shape not in new:
                new[shape] = block.view(t.dtype).as_strided(t.size(), t.stride(),
                                                            at // t.element_size() + t.storage_offset())
            m._buffers[name] = new[shape]
        at += _padded(source.numel())
        del buffers, source, t  # the old storage goes now, not with the last one
    if keep:
        _keep(block, kept)
    return total


def _padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def kept_folder() -> Path:
    """Where this machine keeps blocks for later processes: beside the kept graphs (``skipsearch cache`` lists and
    clears it)."""
    from skipsearch.kernels.graphs import graphs_root

    return graphs_root() / "arenas"


def kept_note(folder: Path) -> str:
    """What ``folder`` (``kept_folder()``) holds, for ``skipsearch cache``: packed weights, or the mark that kept files
    map on small pages here, so none is kept."""
    if (folder / _SMALL_PAGES).exists():
        return "packed weights: none kept, files map on small pages on this filesystem"
    return "packed weights, mapped by later processes"


def _name(sources: list[torch.Tensor], total: int) -> str:
    """The kept file's name for a block of ``sources``: their sizes and 16 samples of each one's bytes. A name says
    where to look, not what is there: a file's bytes are compared in full before it is used (``_kept_block``)."""
    digest = hashlib.sha256(f"arena {_FORMAT} {total}".encode())
    for s in sources:
        n = s.numel()
        digest.update(n.to_bytes(8, "little"))
        for i in range(16):
            digest.update(s[n * i // 16:][:64].numpy().tobytes())
    return digest.hexdigest()[:32] + ".bin"


def _kept_block(sources: list[torch.Tensor], total: int, name: str) -> tuple[torch.Tensor | None, bool]:
    """The kept file ``name`` mapped as the block, where it holds exactly ``sources``' bytes at their places and
    nine tenths of it or more maps as huge pages; else None, with whether the fresh block should be kept: yes where
    there is no such file or it holds other bytes, no where files here map on small pages (``_SMALL_PAGES``) or
    this one does not map huge enough even once its page cache is read again (memory too fragmented now: the fresh
    block streams faster, and the file may map whole later). A page cache partly evicted and read back in small
    folios is read again once (0.4-0.5 s for 538 MB on the Zen 5, against 0.7-0.9 s of fresh huge pages): 85% of
    a kept file mapped huge here after the suite's load, 99.8% once read again."""
    folder = kept_folder()
    try:
        if (folder / _SMALL_PAGES).exists():
            return None, False
    except OSError:  # a folder this process cannot read: nothing kept here
        return None, False
    path = folder / name
    for reread in (False, True):
        block = _mapped(path, total, reread=reread)
        if block is None or not _holds(block, sources):  # _holds reads every page: the share below counts them
            if block is not None and not reread:
                _log.info("the kept weights %s hold other bytes than this model's: kept again", path)
            return None, not reread
        if _huge_share(block) >= HUGE_SHARE:
            with contextlib.suppress(OSError):
                os.utime(path)  # used: not forgotten (``_forget_old``)
            return block, False
        del block  # unmapped, so that its page cache can be dropped and read again
    return None, False


def _mapped(path: Path, size: int, *, reread: bool = False) -> torch.Tensor | None:
    """``path``'s bytes mapped copy-on-write and asked for as huge pages before the first touch (the page cache then
    reads them in 2 MiB folios), where the file is ``size`` bytes; None where it is not, cannot be read, or there
    are no file mappings here. ``reread`` first drops the file's page cache (written by small folios as memory
    allowed: 68% of a fresh 540 MB file mapped huge on the Zen 5, 99.8% once read back this way)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size != size:
                return None
            if reread and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            buf = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError, AttributeError):  # none yet, unreadable, or no file mappings here
        return None
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            buf.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(buf, dtype=torch.uint8)


def _holds(block: torch.Tensor, sources: list[torch.Tensor]) -> bool:
    """Whether ``block`` holds each of ``sources``' bytes at its place (compared 8 bytes at a time where they
    divide: about 20 ms for 540 MB on two cores)."""
    at = 0
    for s in sources:
        n, part = s.numel(), block[at:at + s.numel()]
        if n % 8 == 0:
            part, s = part.view(torch.int64), s.view(torch.int64)
        if not torch.equal(part, s):
            return False
        at += _padded(n)
    return True


def _huge_share(block: torch.Tensor) -> float:
    """The share of ``block``'s file mapping that is mapped as huge pages (``FilePmdMapped`` in Linux's
    ``/proc/self/smaps``); 0 where that cannot be read."""
    start, inside = block.data_ptr(), False
    try:
        text = Path("/proc/self/smaps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0.0
    for line in text.splitlines():
        head = line.split(maxsplit=1)[0] if line.strip() else ""
        if "-" in head and ":" not in head:
            lo, _, hi = head.partition("-")
            inside = int(lo, 16) <= start < int(hi, 16)
        elif inside and head == "FilePmdMapped:":
            return min(1.0, int(line.split()[1]) * 1024 / max(block.numel(), 1))
    return 0.0


def _small_pages(folder: Path, path: Path) -> None:
    """Files here map on small pages: remove ``path`` and mark the folder, so that no process keeps a block again
    (``skipsearch cache --clear`` removes the mark with the folder)."""
    _log.info("kept weights map on small pages on this filesystem; blocks are no longer kept in %s", folder)
    with contextlib.suppress(OSError):
        path.unlink()
        (folder / _SMALL_PAGES).touch()


def _keep(block: torch.Tensor, name: str) -> None:
    """Write ``block`` to the kept file ``name`` (a temporary file renamed into place, so a reader sees a whole file
    or none), where the disk keeps a fifth of itself free after it; then read it back into a page cache of 2 MiB
    folios, map it as a later process will, and mark the folder where none of it maps huge. Blocks not used for
    ``KEPT_DAYS`` go first. A failure to write leaves nothing behind and is not an error: the block in use is the
    fresh one."""
    folder = kept_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _forget_old(folder)
        usage = shutil.disk_usage(folder)
        if usage.free - block.numel() < usage.total // 5:
            return
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(memoryview(block.numpy()))
                f.flush()
                os.fsync(f.fileno())  # written back: its page cache can be dropped and read again in 2 MiB folios
            os.replace(tmp, folder / name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        _log.debug("could not keep the weights' block in %s: %s", folder, exc)
        return
    kept = _mapped(folder / name, block.numel(), reread=True)
    # no file mappings here, or none of it on huge pages once read through (``_holds`` touches every page, which
    # the share counts): a property of this filesystem and kernel (a share between is memory's state, for now)
    if kept is None or (_holds(kept, [block]) and _huge_share(kept) == 0.0):
        _small_pages(folder, folder / name)


def _forget_old(folder: Path) -> None:
    """Remove the kept blocks no process has used for ``KEPT_DAYS``, and temporary files a killed writer left."""
    now = time.time()
    for path in folder.iterdir():
        with contextlib.suppress(OSError):
            age = now - path.stat().st_mtime
            if (path.suffix == ".bin" and age > KEPT_DAYS * 86400) or (path.suffix == ".tmp" and age > 3600):
                path.unlink()
