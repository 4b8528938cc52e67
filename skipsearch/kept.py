"""Where skipsearch keeps what it makes, and what each folder there holds: the cache root (``$SKIPSEARCH_CACHE``,
else ``~/.cache/skipsearch``), with the converted models (``models/``), the compiled graphs and packed weights
(``graphs/``: ``kernels/graphs.py``), the builds of skipsearch's C++ products (``lowbit/``) and the GGUFs the
llama.cpp peer serves (``llama.cpp/``). ``skipsearch cache`` lists them and clears them.

The standard library only: the cache root is read before torch loads.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

# the folders under the cache root besides the compiled graphs' (``kernels.graphs.caches``), and what each holds
FOLDERS = {
    "models": "converted models: converting one again takes a minute",
    "lowbit": "builds of skipsearch's C++ products, one per source, torch and CPU: built again in a minute",
    "llama.cpp": "GGUFs the llama.cpp peer serves: written again when it next runs",
}


def cache_dir() -> Path:
    """The cache root: $SKIPSEARCH_CACHE, else $XDG_CACHE_HOME/skipsearch, else ~/.cache/skipsearch."""
    root = os.environ.get("SKIPSEARCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "skipsearch"
    )
    return Path(root)


@dataclass(frozen=True)
class KeptFolder:
    """One folder of kept files, as ``skipsearch cache`` lists it."""

    path: Path
    files: int
    bytes: int
    modified: float  # its newest file's mtime (seconds since the epoch); 0 when it holds none


def usage(folder: Path) -> KeptFolder:
    """What ``folder`` holds: its files (followed through a linked folder itself, not through links inside it)."""
    files = [p for p in Path(folder).rglob("*") if p.is_file()]
    stats = [p.stat() for p in files]
    return KeptFolder(Path(folder), len(files), sum(s.st_size for s in stats),
                      max((s.st_mtime for s in stats), default=0.0))


def folders() -> tuple[KeptFolder, ...]:
    """Each folder of ``FOLDERS`` that the cache root holds (nothing else there is skipsearch's to list or clear)."""
    root = cache_dir()
    return tuple(usage(root / name) for name in FOLDERS if (root / name).is_dir())


def age(modified: float) -> str:
    """How long ago ``modified`` (seconds since the epoch) was, for people: ``3 min``, ``2 h``, ``5 d``."""
    seconds = max(0.0, time.time() - modified)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def remove(folder: Path) -> None:
    """Remove ``folder``: a link to a folder elsewhere is unlinked, never followed (what it points to is kept)."""
    if folder.is_symlink():
        folder.unlink()
    else:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["FOLDERS", "KeptFolder", "age", "cache_dir", "folders", "remove", "usage"]
