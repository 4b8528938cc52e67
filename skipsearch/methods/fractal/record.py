"""Fractal's record: a fractal draft's acceptance, cycle by cycle (``measured.fractal_matches``).

A fractal draft pass depends only on the committed tokens (whose KV the full model wrote) and the pending one, and
its K is the draft's own (w + n + 1), so the positions decoding's cycles start at follow from what they accept.
The record keeps, per calibration sequence, one byte per position t = 1 .. len - 1 (files.records.MATCH_ENCODING):
the leading matches of the pass a cycle starting there drafts (at most ``drafted``), or NO_HIT where no cycle
starts. Replayed by the engine's rules (ngram.replay_cycles) it gives every cycle's accepted tokens, up to float
rounding (fractal.surrogate). No torch.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from skipsearch.files.errors import ProfileError
from skipsearch.files.records import (
    MATCH_ENCODING,
    NO_HIT,
    known_keys,
    match_sequences,
    optional_strings,
    read_record,
)

FRACTAL_KEY = "fractal_matches"  # measured.<key> of a fractal profile
_FRACTAL_KEYS = ("encoding", "scheme", "n", "w", "layers", "drafted", "max_new_tokens", "workload", "architecture",
                 "acceptance", "sequences")


@dataclass(frozen=True)
class FractalRecord:
    scheme: str  # the compressed layers' scheme the passes ran (resolved: int8-dynamic, int8-weight-only, ...)
    n: int
    w: int
    layers: tuple[int, ...]  # the fractal layers' positions
    drafted: int  # tokens per pass: w + n + 1
    max_new_tokens: int  # the calibration's: a cycle drafts at most max_new_tokens - t - 1 tokens
    sequences: tuple[str, ...]  # encoded (MATCH_ENCODING: NO_HIT where no cycle starts), one per sequence
    workload: str | None = None
    architecture: str | None = None  # costs.architecture_of the traced model

    def positions(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(base64.b64decode(s)) for s in self.sequences)

    def acceptance(self) -> float:
        """Leading matches per pass over the tokens a full pass drafts, for people."""
        seqs = [b for seq in self.positions() for b in seq if b != NO_HIT]
        return sum(seqs) / (len(seqs) * self.drafted) if seqs else 0.0


def fractal_to_dict(rec: FractalRecord) -> dict:
    out: dict[str, Any] = {"encoding": MATCH_ENCODING, "scheme": rec.scheme, "n": rec.n, "w": rec.w,
                           "layers": list(rec.layers), "drafted": rec.drafted, "max_new_tokens": rec.max_new_tokens}
    out.update({k: v for k, v in (("workload", rec.workload), ("architecture", rec.architecture)) if v is not None})
    out["acceptance"] = round(rec.acceptance(), 4)
    out["sequences"] = list(rec.sequences)
    return out


def fractal_from_dict(raw: Any, *, source: str = "<profile>") -> FractalRecord:
    """Validate ``measured.fractal_matches``; every problem is one ProfileError line."""
    path, raw = read_record(raw, FRACTAL_KEY, MATCH_ENCODING, source)
    known_keys(raw, _FRACTAL_KEYS, path, source)
    scheme = raw.get("scheme")
    if not isinstance(scheme, str) or not scheme:
        raise ProfileError(f"{source}: {path}.scheme must name the compressed layers' scheme (int8-dynamic, ...)")
    ints = {}
    for key, low in (("n", 1), ("w", 0), ("drafted", 1), ("max_new_tokens", 1)):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (
                key == "drafted" and value >= NO_HIT):
            raise ProfileError(f"{source}: {path}.{key} must be an integer >= {low}"
                               + (f" and < {NO_HIT}" if key == "drafted" else ""))
        ints[key] = value
    if ints["drafted"] != ints["w"] + ints["n"] + 1:
        raise ProfileError(f"{source}: {path}.drafted must be w + n + 1 = {ints['w'] + ints['n'] + 1}")
    layers = raw.get("layers")
    if not isinstance(layers, list) or len(layers) != ints["n"] or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
        raise ProfileError(f"{source}: {path}.layers must list the n fractal layers' positions (integers >= 0)")
    optional_strings(raw, ("workload", "architecture"), path, source)
    seqs = match_sequences(raw, path, source, most=ints["drafted"], what="drafted")
    return FractalRecord(scheme, ints["n"], ints["w"], tuple(layers), ints["drafted"], ints["max_new_tokens"], seqs,
                         raw.get("workload"), raw.get("architecture"))


__all__ = ["FRACTAL_KEY", "FractalRecord", "fractal_from_dict", "fractal_to_dict"]
