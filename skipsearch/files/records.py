"""What every method's record shares: the trace and match encodings, and the checks of a ``measured.<key>`` record.

A profile keeps, in ``measured``, the records its method re-plans from; each method owns its own format
(``Method.record``: ``methods/layer_skip/record.py``'s acceptance record, ``methods/ngram.py``'s lookup record,
``methods/precision/record.py``, ``methods/fractal/record.py``), and profile.py validates every one on load through
the method registry. ``measured.costs`` is ``skipsearch.files.costs.PlannedCosts``.

Two encodings, both base64, one string per calibration sequence and no torch:
- a trace (``ENCODING``): one byte per position, the top bit set where the draft's argmax matched, the low seven
  round(127 · its top probability);
- matches (``MATCH_ENCODING``): one byte per position, a count of matching tokens (at most 254) or ``NO_HIT``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from skipsearch.config import Trace
from skipsearch.files.errors import ProfileError
from skipsearch.files.yamlio import mapping

ENCODING = "b64-u8"  # one byte per position: 128 if the draft's argmax matched, + round(127 · its top probability)
MATCH_ENCODING = "b64-u8-match"  # one byte per position: how many tokens matched, or NO_HIT
NO_HIT = 255  # a position with nothing to match (no lookup hit; no cycle starts there)


def encode_trace(tr: Trace) -> str:
    data = bytes((128 if m else 0) | round(127 * min(max(c, 0.0), 1.0)) for m, c in zip(tr.matches, tr.confidences,
                                                                                         strict=True))
    return base64.b64encode(data).decode("ascii")


def decode_trace(text: str) -> Trace:
    data = base64.b64decode(text, validate=True)
    return Trace(tuple(b >= 128 for b in data), tuple((b & 127) / 127 for b in data))


def matched(text: str) -> tuple[bool, ...]:
    """An encoded trace's per-position verdicts (whether the draft's argmax matched), without the probabilities."""
    return tuple(b >= 128 for b in base64.b64decode(text))


# -- the checks a record's reader runs: each problem is one ProfileError line ------------------------------------
def record_mapping(raw: Any, path: str, source: str) -> dict:
    return mapping(raw, path, source, error=ProfileError)


def read_record(raw: Any, key: str, encoding: str, source: str) -> tuple[str, dict]:
    """``measured.<key>`` as a mapping whose ``encoding`` is ``encoding``, and its path for messages."""
    path = f"measured.{key}"
    raw = record_mapping(raw, path, source)
    if raw.get("encoding") != encoding:
        raise ProfileError(f"{source}: {path}.encoding must be {encoding!r}, got {str(raw.get('encoding'))[:40]!r}")
    return path, raw


def known_keys(raw: dict, known, path: str, source: str) -> None:
    unknown = set(raw) - set(known)
    if unknown:
        raise ProfileError(f"{source}: unknown key {path}.{str(sorted(unknown, key=str)[0])[:40]}")


def optional_strings(raw: dict, keys, path: str, source: str) -> tuple[str | None, ...]:
    """The optional string fields ``keys`` (workload, architecture), each None or a string."""
    values = tuple(raw.get(key) for key in keys)
    for key, value in zip(keys, values, strict=True):
        if value is not None and not isinstance(value, str):
            raise ProfileError(f"{source}: {path}.{key} must be a string")
    return values


def match_sequences(raw: dict, path: str, source: str, *, most: int, what: str) -> tuple[str, ...]:
    """``sequences``: one base64 string per calibration sequence, of bytes at most ``most`` (or NO_HIT)."""
    seqs = raw.get("sequences")
    if not isinstance(seqs, list) or not seqs or not all(isinstance(t, str) for t in seqs):
        raise ProfileError(f"{source}: {path}.sequences must list one encoded record per calibration sequence")
    for t in seqs:
        try:
            data = base64.b64decode(t, validate=True)
        except (binascii.Error, ValueError):
            raise ProfileError(f"{source}: {path}.sequences holds a string that is not base64") from None
        if any(b > most and b != NO_HIT for b in data):
            raise ProfileError(f"{source}: {path}.sequences holds a match longer than {what} {most}")
    return tuple(seqs)


def is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


__all__ = ["ENCODING", "MATCH_ENCODING", "NO_HIT", "decode_trace", "encode_trace", "is_base64", "known_keys",
           "match_sequences", "matched", "optional_strings", "read_record", "record_mapping"]
