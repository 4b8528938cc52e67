"""The GGUFs the llama.cpp peer and ``optimize --engine llama.cpp`` run: the target (all F32, the same weights in
their exact blocks, or Q8_0: ``TARGETS``), the model's own self-drafts at Q8_0 and Q4_0, and its shallow self-drafts
(a layer-skip draft of whole layers as a GGUF of its own), each written once with ``export/gguf_draft`` into a cache
directory keyed by the weights' fingerprint, and reused by every later run.
"""

from __future__ import annotations

import functools
import os
import re
import weakref
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skipsearch.config import ConfigError
from skipsearch.export.gguf_draft import DRAFT_SCHEMES, write_target_gguf

GGUF_LAYOUT = 1  # the cache's layout: bump when the GGUFs written change (gguf_draft), so old ones are not reused


@dataclass(frozen=True)
class Shallow:
    """A shallow self-draft: the model's decoder layers ``layers`` (of ``of``), in order, at the GGML type ``draft``
    (a key of ``DRAFT_SCHEMES``). llama.cpp loads it as a model of its own (``-md``): the layer-skip draft of
    whole layers (``llamacpp_search.shallow_drafts`` picks them by CLaSp's dynamic program)."""

    draft: str
    layers: tuple[int, ...]
    of: int

    @property
    def name(self) -> str:
        """How a setting names it: ``q4_0 27/30`` (its type, the layers kept of the model's)."""
        return f"{self.draft} {len(self.layers)}/{self.of}"

    @property
    def file(self) -> str:
        """Its GGUF's name in the cache: the layer set's checksum tells two sets of one size apart."""
        crc = zlib.crc32(",".join(map(str, self.layers)).encode()) & 0xFFFFFFFF
        return f"draft-{self.draft}-{len(self.layers)}of{self.of}-{crc:08x}.gguf"


def gguf_cache(sm, *, cache: str | os.PathLike | None = None) -> Path:
    """Where ``sm``'s GGUFs live: under skipsearch's cache, keyed by the weights' fingerprint."""
    from skipsearch.kept import cache_dir

    root = Path(cache) if cache is not None else cache_dir() / "llama.cpp"
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(str(sm.name)).name)[:60] or "model"
    return root / f"{stem}-{sm.weights_fingerprint}-v{GGUF_LAYOUT}"


F32, EXACT, Q8_0 = "f32", "exact", "q8_0"
TARGETS = {  # llama.cpp's target GGUFs: what each holds, for people (``--llama-target``)
    F32: "the model's weights, all F32: HF's numbers, so its outputs are checked against HF greedy's",
    EXACT: "the model's weights in the fewest bytes that give them back (a GGUF's own Q4_0/Q4_1/Q8_0 blocks, BF16, "
           "else F32): the values skipsearch's panel kernel holds, in its blocks, in llama.cpp's arithmetic",
    Q8_0: "the model at Q8_0, the 8-bit model llama.cpp users run: another model (its weights rounded to blocks of "
          "32 with one scale each)",
}


def target_type(sm, asked: str | None = None) -> str:
    """The GGUF type of llama.cpp's target for ``sm`` (a key of ``TARGETS``): ``target_for``'s, for its precision."""
    return target_for(getattr(sm, "target_precision", "native"), asked)


def target_for(precision: str, asked: str | None = None) -> str:
    """The GGUF type of llama.cpp's target for a model of target ``precision`` (model/target.py): ``asked``, else
    F32 for a native model (the same weights) and Q8_0 for the int8 target, the 8-bit model llama.cpp users run: the
    nearest llama.cpp has, not the same. An int8 target takes only Q8_0 (its fp32 weights are not the model it
    decodes). Needs no model: ``--llama-target`` is checked with it before one loads."""
    int8 = precision == "int8"
    if asked is None:
        return Q8_0 if int8 else F32
    if asked not in TARGETS:
        raise ConfigError(f"no llama.cpp target {asked!r:.40}: use {', '.join(TARGETS)}")
    if int8 and asked != Q8_0:
        raise ConfigError(f"llama.cpp's target for the int8 target is {Q8_0}, not {asked}")
    return asked


def tensor_types(path: str | os.PathLike) -> dict[str, int]:
    """How many of a GGUF's tensors each GGML type holds: {"Q4_1": 210, "F32": 61, ...}, most first. Read once per
    process for a file of that size and modification time: gguf's reader parses the whole header, tokenizer included
    (about 2.7 s for smollm2-135m on a Zen 5), and a bench or an engine search asks again for every pass."""
    stat = os.stat(path)
    return dict(_types(os.path.abspath(path), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=16)
def _types(path: str, size: int, mtime_ns: int) -> tuple[tuple[str, int], ...]:
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(path).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return tuple(sorted(counts.items(), key=lambda kv: -kv[1]))


_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # int8 target -> the fp32 model GGUFs come from


def gguf_source(sm, checkpoint: str | os.PathLike):
    """The model whose fp32 weights a GGUF is written from: ``sm`` itself, or for an int8 target (whose linears hold
    int8 weights) the checkpoint loaded again in fp32, once per int8 target, released with it."""
    if getattr(sm, "target_precision", "native") == "native":
        return sm
    if sm not in _SOURCES:
        from skipsearch.model.loader import load_model

        _SOURCES[sm] = load_model(str(checkpoint), device="cpu", dtype="float32")
    return _SOURCES[sm]


def write_ggufs(sm, checkpoint: str | os.PathLike, *, drafts: Sequence[str] = ("q8_0", "q4_0"),
                cache: str | os.PathLike | None = None, target: str | None = None) -> tuple[Path, dict[str, Path]]:
    """The target (``target_type``'s, of ``target``: all F32, exact, or Q8_0) and each self-draft
    (``DRAFT_SCHEMES``) of ``sm``, written once: a file already in the cache directory is reused. An int8 target's
    linears hold no fp32 weights: the GGUFs are written from the checkpoint loaded again in fp32 (once per machine).
    Returns (target, {draft name: path})."""
    _check_drafts(drafts)
    kind = target_type(sm, target)
    if kind == Q8_0:  # the model at Q8_0, its head too (the int8 scheme's self-draft, as a target)
        path = _once(sm, checkpoint, cache, "target-q8_0.gguf", scheme=DRAFT_SCHEMES["q8_0"], quant_head=True)
    else:  # the model at full precision (every sublayer and the head kept F32), or exact
        path = _once(sm, checkpoint, cache, f"target-{kind}.gguf", write=write_target_gguf, exact=kind == EXACT)
    return path, {d: _once(sm, checkpoint, cache, f"draft-{d}.gguf", scheme=DRAFT_SCHEMES[d], quant_head=True)
                  for d in drafts}


def write_shallow(sm, checkpoint: str | os.PathLike, shallow: Sequence[Shallow], *,
                  cache: str | os.PathLike | None = None) -> dict[Shallow, Path]:
    """Each shallow self-draft's GGUF (its kept layers at its type, the head too), written once as ``write_ggufs``
    writes the others."""
    _check_drafts([sh.draft for sh in shallow])
    return {sh: _once(sm, checkpoint, cache, sh.file, scheme=DRAFT_SCHEMES[sh.draft], quant_head=True,
                      layers=sh.layers) for sh in shallow}


def _check_drafts(drafts: Sequence[str]) -> None:
    unknown = [d for d in drafts if d not in DRAFT_SCHEMES]
    if unknown:
        raise ConfigError(f"no GGUF self-draft {unknown[0]!r}: use {', '.join(DRAFT_SCHEMES)}")


def _once(sm, checkpoint: str | os.PathLike, cache: str | os.PathLike | None, name: str, *, write=None,
          **kwargs) -> Path:
    """``name`` in ``sm``'s GGUF cache, written by ``write`` (``gguf_draft.write_draft_gguf`` by default) with
    ``kwargs`` unless it is there already."""
    from skipsearch.export.gguf_draft import write_draft_gguf

    write = write or write_draft_gguf
    where = gguf_cache(sm, cache=cache)
    where.mkdir(parents=True, exist_ok=True)
    path = where / name
    if not path.is_file():
        partial = where / f".{name}.{os.getpid()}.partial"  # renamed into place whole
        try:
            write(partial, gguf_source(sm, checkpoint), Path(checkpoint), **kwargs)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return path


__all__ = ["EXACT", "F32", "GGUF_LAYOUT", "Q8_0", "TARGETS", "Shallow", "gguf_cache", "gguf_source", "target_for",
           "target_type", "tensor_types", "write_ggufs", "write_shallow"]
