"""``layer-skip``'s parameters: the trimmed draft head's token subset, in its portable form (no torch)."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from skipsearch.config import DraftConfig
from skipsearch.methods.base import ParamsError, check_keys, int_param

SUBSET_KEYS = ("vocab_subset", "vocab_ids", "vocab_sha256")


# -- the subset's portable form --------------------------------------------------------------------
def subset_sha256(ids: Sequence[int]) -> str:
    """The checksum a profile keeps: sha256 of the sorted ids as comma-separated decimals."""
    return hashlib.sha256(",".join(map(str, ids)).encode("ascii")).hexdigest()


def encode_ids(ids: Sequence[int]) -> str:
    """Sorted ids -> base64(zlib(LEB128 varints of the first id and the gaps))."""
    out, prev = bytearray(), 0
    for i, v in enumerate(ids):
        gap = v - prev if i else v
        while True:  # unsigned LEB128: 7 bits a byte, high bit set while more follow
            byte, gap = gap & 0x7F, gap >> 7
            out.append(byte | (0x80 if gap else 0))
            if not gap:
                break
        prev = v
    return base64.b64encode(zlib.compress(bytes(out), 9)).decode("ascii")


# At most this many bytes of varints: 5 per id (ids below 2^35) for a million ids, far above any vocabulary. A
# profile is at most 1 MiB, but zlib expands a run of equal bytes a thousandfold: a hostile vocab_ids must not
# cost gigabytes and minutes before it is refused.
MAX_IDS_BYTES = 5 << 20


@functools.lru_cache(maxsize=64)
def decode_ids(text: str) -> tuple[int, ...]:
    """``encode_ids`` backwards; ValueError for anything that is not such a string."""
    try:
        unzip = zlib.decompressobj()
        raw = unzip.decompress(base64.b64decode(text.encode("ascii"), validate=True), MAX_IDS_BYTES)
    except (binascii.Error, zlib.error, UnicodeEncodeError) as e:
        raise ValueError(str(e)) from None
    if unzip.unconsumed_tail:
        raise ValueError(f"more than {MAX_IDS_BYTES >> 20} MiB of ids")
    ids: list[int] = []
    value = shift = 0
    for byte in raw:
        value |= (byte & 0x7F) << shift
        shift += 7
        if shift > 35:
            raise ValueError("a varint longer than 5 bytes")
        if not byte & 0x80:
            if ids and value == 0:
                raise ValueError("ids repeat")
            ids.append(ids[-1] + value if ids else value)
            value = shift = 0
    if shift:
        raise ValueError("the last varint is cut off")
    return tuple(ids)


def frequent_tokens(sequences: Iterable[Sequence[int]], size: int, vocab: int) -> tuple[int, ...]:
    """The ``size`` most frequent tokens of ``sequences``, sorted (FR-Spec's frequency-ranked subset).

    Ties, which are most of a large vocabulary when the data is a few calibration prompts, go to the
    lower id: byte-level BPE vocabularies number their merges in the order they were learned, which
    is by frequency in the tokenizer's own training corpus, so a low id is the better guess.
    """
    if not 1 <= size <= vocab:
        raise ParamsError(f"layer-skip: method_params.vocab_subset must be an integer in 1..{vocab}, got {size}")
    counts = Counter(t for seq in sequences for t in seq if 0 <= t < vocab)
    seen = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    chosen = set(seen)
    rest = (t for t in range(vocab) if t not in chosen)
    return tuple(sorted([*seen, *(next(rest) for _ in range(size - len(seen)))]))


# -- parameters -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerSkipParams:
    """A trimmed draft head, or none: all three keys, or none of them (see the module docstring)."""

    method: ClassVar[str] = "layer-skip"
    vocab_subset: int | None = None  # V': how many tokens the draft head covers; None: the full head
    vocab_ids: str | None = None  # the ids: base64(zlib(LEB128 gaps)), as ``encode_ids`` writes them
    vocab_sha256: str | None = None  # sha256 of the ids as comma-separated decimals

    def __post_init__(self) -> None:
        given = [k for k in SUBSET_KEYS if getattr(self, k) is not None]
        if not given:
            return
        if len(given) < len(SUBSET_KEYS):
            missing = next(k for k in SUBSET_KEYS if getattr(self, k) is None)
            raise ParamsError(f"{self.method}: method_params.{missing} is missing: a trimmed draft head needs "
                              f"{', '.join(SUBSET_KEYS)}")
        size = int_param(self.method, {"vocab_subset": self.vocab_subset}, "vocab_subset", low=1)
        if not isinstance(self.vocab_ids, str) or not isinstance(self.vocab_sha256, str):
            raise ParamsError(f"{self.method}: method_params.vocab_ids and vocab_sha256 must be strings")
        try:
            ids = decode_ids(self.vocab_ids)
        except ValueError as e:
            raise ParamsError(f"{self.method}: method_params.vocab_ids is not base64 of zlib-compressed LEB128 "
                              f"gaps ({str(e).splitlines()[0][:60]})") from None
        if len(ids) != size:
            raise ParamsError(f"{self.method}: method_params.vocab_ids holds {len(ids)} ids, but vocab_subset "
                              f"is {size}")
        if subset_sha256(ids) != self.vocab_sha256:
            raise ParamsError(f"{self.method}: method_params.vocab_sha256 does not match vocab_ids "
                              "(the subset was changed or cut)")

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> LayerSkipParams:
        check_keys(cls.method, raw, cls)
        return cls(**{k: raw[k] for k in SUBSET_KEYS if k in raw})

    @classmethod
    def trimmed(cls, ids: Sequence[int]) -> LayerSkipParams:
        """The parameters of a draft head over token ``ids``."""
        ids = tuple(sorted(set(ids)))
        return cls(len(ids), encode_ids(ids), subset_sha256(ids))

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        """The trimmed head's token ids, sorted; None: the full head."""
        return decode_ids(self.vocab_ids) if self.vocab_ids is not None else None

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        return tuple((k, getattr(self, k)) for k in SUBSET_KEYS if getattr(self, k) is not None)
