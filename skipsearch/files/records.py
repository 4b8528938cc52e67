"""The re-planning records a draft profile keeps in ``measured``, and the check of every ``measured`` key that
has a format: ``acceptance`` (the traces of the shortlisted layer-skip skip sets), ``lookup`` (prompt lookup's
match record), ``precision`` (the traces of a precision draft, or of a hybrid's precision fallback) and ``costs``
(``skipsearch.files.costs.PlannedCosts``). Each method names the formats its profiles keep (``Method.record``),
makes them and re-plans from them; profile.py validates every one on load through the method registry.

A kept trace is compact: one byte per position (the top bit: the draft's argmax matched; the low seven:
round(127 · top probability)), base64, one string per calibration sequence. No torch.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skipsearch.config import ConfigError, DraftConfig, Trace
from skipsearch.files.errors import ProfileError
from skipsearch.files.yamlio import mapping

ENCODING = "b64-u8"  # one byte per position: 128 if the draft's argmax matched, + round(127 · its top probability)
ACCEPTANCE_KEY = "acceptance"  # measured.<key> of a profile (schema v2), beside files.costs.COSTS_KEY
MAX_KEPT = 8  # skip sets a profile keeps the traces of


def _mapping(value: Any, path: str, source: str) -> dict:
    return mapping(value, path, source, error=ProfileError)


def _record(raw: Any, key: str, encoding: str, source: str) -> tuple[str, dict]:
    """``measured.<key>`` as a mapping whose ``encoding`` is ``encoding``, and its path for messages."""
    path = f"measured.{key}"
    raw = _mapping(raw, path, source)
    if raw.get("encoding") != encoding:
        raise ProfileError(f"{source}: {path}.encoding must be {encoding!r}, got {str(raw.get('encoding'))[:40]!r}")
    return path, raw


# -- the acceptance record ---------------------------------------------------------------------------------
def _known_keys(raw: dict, known, path: str, source: str) -> None:
    unknown = set(raw) - set(known)
    if unknown:
        raise ProfileError(f"{source}: unknown key {path}.{str(sorted(unknown, key=str)[0])[:40]}")


def _strings(raw: dict, keys, path: str, source: str) -> tuple[str | None, ...]:
    """The optional string fields ``keys`` (workload, architecture), each None or a string."""
    values = tuple(raw.get(key) for key in keys)
    for key, value in zip(keys, values, strict=True):
        if value is not None and not isinstance(value, str):
            raise ProfileError(f"{source}: {path}.{key} must be a string")
    return values


def _match_sequences(raw: dict, path: str, source: str, *, most: int, what: str) -> tuple[str, ...]:
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


def encode_trace(tr: Trace) -> str:
    data = bytes((128 if m else 0) | round(127 * min(max(c, 0.0), 1.0)) for m, c in zip(tr.matches, tr.confidences,
                                                                                         strict=True))
    return base64.b64encode(data).decode("ascii")


def decode_trace(text: str) -> Trace:
    data = base64.b64decode(text, validate=True)
    return Trace(tuple(b >= 128 for b in data), tuple((b & 127) / 127 for b in data))


@dataclass(frozen=True)
class SkipSetTraces:
    """One skip set's traces: what acceptance it gets on each calibration sequence."""

    skip_attn: tuple[int, ...]
    skip_mlp: tuple[int, ...]
    traces: tuple[str, ...]  # encoded (ENCODING), one per calibration sequence

    def decoded(self) -> tuple[Trace, ...]:
        return tuple(decode_trace(t) for t in self.traces)

    def acceptance_curve(self, k: int = 8) -> tuple[float, ...]:
        """α by draft position, for people: P(the first i drafts of a block all match), i = 1..k, over
        every start position (no exit rule)."""
        bits = [tuple(b >= 128 for b in base64.b64decode(t)) for t in self.traces]
        out = []
        for i in range(1, k + 1):
            runs = [all(seq[t:t + i]) for seq in bits for t in range(len(seq) - i + 1)]
            out.append(round(sum(runs) / len(runs), 4) if runs else 0.0)
        return tuple(out)


@dataclass(frozen=True)
class AcceptanceRecord:
    skip_sets: tuple[SkipSetTraces, ...]
    workload: str | None = None  # the calibration set, for people: "mtbench (calib split), 8 prompts x 64 tokens"
    architecture: str | None = None  # costs.architecture_of the traced model: a cost file must match it


def record_acceptance(traced: dict[tuple, Sequence[Trace]], *, workload: str | None = None,
                      architecture: str | None = None) -> AcceptanceRecord:
    """The acceptance record of traced skip sets: (skip_attn, skip_mlp) -> one trace per calibration sequence."""
    return AcceptanceRecord(tuple(SkipSetTraces(a, m, tuple(encode_trace(t) for t in trs))
                                  for (a, m), trs in traced.items()), workload, architecture)


def acceptance_to_dict(rec: AcceptanceRecord) -> dict:
    out: dict[str, Any] = {"encoding": ENCODING}
    out.update({k: v for k, v in (("workload", rec.workload), ("architecture", rec.architecture)) if v})
    out["skip_sets"] = [{"skip_attn": list(s.skip_attn), "skip_mlp": list(s.skip_mlp),
                         "alpha_by_position": list(s.acceptance_curve()), "traces": list(s.traces)}
                        for s in rec.skip_sets]
    return out


def acceptance_from_dict(raw: Any, *, source: str = "<profile>") -> AcceptanceRecord:
    """Validate ``measured.acceptance``; every problem is one ProfileError line."""
    path, raw = _record(raw, ACCEPTANCE_KEY, ENCODING, source)
    items = raw.get("skip_sets")
    if not isinstance(items, list) or not items:
        raise ProfileError(f"{source}: {path}.skip_sets must list the kept skip sets and their traces")
    sets = []
    for i, item in enumerate(items):
        where = f"{path}.skip_sets[{i}]"
        item = _mapping(item, where, source)
        unknown = set(item) - {"skip_attn", "skip_mlp", "alpha_by_position", "traces"}
        if unknown:
            raise ProfileError(f"{source}: unknown key {where}.{sorted(unknown)[0][:40]}")
        traces = item.get("traces")
        if not isinstance(traces, list) or not traces or not all(isinstance(t, str) for t in traces):
            raise ProfileError(f"{source}: {where}.traces must list one encoded trace per calibration sequence")
        try:
            draft = DraftConfig(tuple(item.get("skip_attn") or ()), tuple(item.get("skip_mlp") or ()))
            for t in traces:
                base64.b64decode(t, validate=True)
        except (ConfigError, TypeError) as e:
            raise ProfileError(f"{source}: {where}: {e}") from None
        except (binascii.Error, ValueError):
            raise ProfileError(f"{source}: {where}.traces holds a string that is not base64") from None
        sets.append(SkipSetTraces(draft.skip_attn, draft.skip_mlp, tuple(traces)))
    workload, arch = _strings(raw, ("workload", "architecture"), path, source)
    return AcceptanceRecord(tuple(sets), workload, arch)


# -- the lookup record: prompt lookup's acceptance, exact from the tokens alone ---------------------------------
# A lookup draft depends on the tokens so far only, and greedy output is the full model's whatever K is, so what
# the lookup proposes at each output position, and how much of it matches, is one fact per position: a cycle at
# position t with K drafts min(K, limit) tokens on a hit and accepts min(matched_t, those). The record keeps, per
# calibration sequence, one byte per position t = 1 .. len - 1: NO_HIT, or matched_t capped at max_k.
LOOKUP_KEY = "lookup"  # measured.<key> of an ngram or hybrid profile
LOOKUP_ENCODING = "b64-u8-match"
NO_HIT = 255


@dataclass(frozen=True)
class LookupRecord:
    min_n: int
    max_n: int
    max_k: int
    max_new_tokens: int  # the calibration's: a cycle drafts at most max_new_tokens - t - 1 tokens
    sequences: tuple[str, ...]  # encoded, one per calibration sequence
    workload: str | None = None

    def positions(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(base64.b64decode(s)) for s in self.sequences)

    def hit_rate(self) -> float:
        seqs = [b for seq in self.positions() for b in seq]
        return sum(b != NO_HIT for b in seqs) / len(seqs) if seqs else 0.0


def lookup_to_dict(rec: LookupRecord) -> dict:
    out: dict[str, Any] = {"encoding": LOOKUP_ENCODING, "min_n": rec.min_n, "max_n": rec.max_n, "max_k": rec.max_k,
                           "max_new_tokens": rec.max_new_tokens}
    if rec.workload:
        out["workload"] = rec.workload
    out["hit_rate"] = round(rec.hit_rate(), 4)
    out["sequences"] = list(rec.sequences)
    return out


def lookup_from_dict(raw: Any, *, source: str = "<profile>") -> LookupRecord:
    """Validate ``measured.lookup``; every problem is one ProfileError line."""
    path, raw = _record(raw, LOOKUP_KEY, LOOKUP_ENCODING, source)
    _known_keys(raw, ("encoding", "min_n", "max_n", "max_k", "max_new_tokens", "workload", "hit_rate", "sequences"),
                path, source)
    ints = {}
    for key, low in (("min_n", 1), ("max_n", 1), ("max_k", 1), ("max_new_tokens", 1)):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (key == "max_k" and value >= NO_HIT):
            raise ProfileError(f"{source}: {path}.{key} must be an integer >= {low}"
                               + (f" and < {NO_HIT}" if key == "max_k" else ""))
        ints[key] = value
    seqs = _match_sequences(raw, path, source, most=ints["max_k"], what="max_k")
    (workload,) = _strings(raw, ("workload",), path, source)
    return LookupRecord(ints["min_n"], ints["max_n"], ints["max_k"], ints["max_new_tokens"], seqs, workload)


# -- the precision record: a precision draft's traces (a precision profile's, or a hybrid's precision fallback) --
# A precision draft's acceptance belongs to the model, its roles (skipped / full / quantized sublayers, head) and
# its scheme's numerics, not to the device's speed: its teacher-forced traces, encoded as the acceptance record's,
# with the roles they were traced with so that a profile edited since is refused. The scheme's per-sublayer costs
# on the searching device go in measured.costs.schemes (files.costs.SchemeCosts), beside the rest of its costs.
# For a hybrid, the traces line up with measured.lookup's sequences, one per calibration sequence ("" where the
# sequence's continuation is empty).
PRECISION_KEY = "precision_traces"  # measured.<key> of a precision profile, or of a hybrid with a precision fallback
_PRECISION_KEYS = ("encoding", "scheme", "skip_attn", "skip_mlp", "full_attn", "full_mlp", "quant_head",
                   "vocab_subset", "vocab_size", "workload", "architecture", "alpha", "traces")


@dataclass(frozen=True)
class PrecisionRecord:
    scheme: str
    skip_attn: tuple[int, ...]
    skip_mlp: tuple[int, ...]
    full_attn: tuple[int, ...]
    full_mlp: tuple[int, ...]
    quant_head: bool
    traces: tuple[str, ...]  # encoded (ENCODING), one per calibration sequence
    vocab_subset: int | None = None  # V' of a trimmed draft head
    vocab_size: int | None = None  # V, the full head's: re-planning prices a trimmed head at V'/V of it
    workload: str | None = None
    architecture: str | None = None  # costs.architecture_of the traced model

    def decoded(self) -> tuple[Trace, ...]:
        return tuple(decode_trace(t) for t in self.traces)

    def alpha(self) -> float:
        bits = [b >= 128 for t in self.traces for b in base64.b64decode(t)]
        return sum(bits) / len(bits) if bits else 0.0


def precision_to_dict(rec: PrecisionRecord) -> dict:
    out: dict[str, Any] = {"encoding": ENCODING, "scheme": rec.scheme, "skip_attn": list(rec.skip_attn),
                           "skip_mlp": list(rec.skip_mlp), "full_attn": list(rec.full_attn),
                           "full_mlp": list(rec.full_mlp), "quant_head": rec.quant_head}
    out.update({k: v for k, v in (("vocab_subset", rec.vocab_subset), ("vocab_size", rec.vocab_size),
                                  ("workload", rec.workload), ("architecture", rec.architecture)) if v is not None})
    out["alpha"] = round(rec.alpha(), 4)
    out["traces"] = list(rec.traces)
    return out


def precision_from_dict(raw: Any, *, source: str = "<profile>") -> PrecisionRecord:
    """Validate ``measured.precision``; every problem is one ProfileError line."""
    path, raw = _record(raw, PRECISION_KEY, ENCODING, source)
    _known_keys(raw, _PRECISION_KEYS, path, source)
    scheme = raw.get("scheme")
    if not isinstance(scheme, str) or not scheme.isidentifier():
        raise ProfileError(f"{source}: {path}.scheme must name a precision scheme (fp16, int8, ...)")
    layers = {}
    for key in ("skip_attn", "skip_mlp", "full_attn", "full_mlp"):
        value = raw.get(key) or []
        if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                  for i in value):
            raise ProfileError(f"{source}: {path}.{key} must list layer indices (integers >= 0)")
        layers[key] = tuple(sorted(set(value)))
    if not isinstance(raw.get("quant_head"), bool):
        raise ProfileError(f"{source}: {path}.quant_head must be true or false")
    for key in ("vocab_subset", "vocab_size"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ProfileError(f"{source}: {path}.{key} must be an integer >= 1")
    _strings(raw, ("workload", "architecture"), path, source)
    alpha = raw.get("alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))):
        raise ProfileError(f"{source}: {path}.alpha must be a number")
    traces = raw.get("traces")
    if not isinstance(traces, list) or not traces or not all(isinstance(t, str) for t in traces):
        raise ProfileError(f"{source}: {path}.traces must list one encoded trace per calibration sequence")
    for t in traces:
        try:
            base64.b64decode(t, validate=True)
        except (binascii.Error, ValueError):
            raise ProfileError(f"{source}: {path}.traces holds a string that is not base64") from None
    return PrecisionRecord(scheme, layers["skip_attn"], layers["skip_mlp"], layers["full_attn"], layers["full_mlp"],
                           raw["quant_head"], tuple(traces), raw.get("vocab_subset"), raw.get("vocab_size"),
                           raw.get("workload"), raw.get("architecture"))


# -- the fractal record: a fractal draft's acceptance, cycle by cycle ---------------------------------------------
# A fractal draft pass depends only on the committed tokens (whose KV the full model wrote) and the pending one, and
# its K is the draft's own (w + n + 1), so the positions decoding's cycles start at follow from what they accept.
# The record keeps, per calibration sequence, one byte per position t = 1 .. len - 1: the leading matches of the
# pass a cycle starting there drafts (at most ``drafted``), or NO_HIT where no cycle starts. Replayed by the
# engine's rules (ngram.replay_cycles) it gives every cycle's accepted tokens, up to float rounding
# (fractal.surrogate).
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
    sequences: tuple[str, ...]  # encoded (LOOKUP_ENCODING: NO_HIT where no cycle starts), one per sequence
    workload: str | None = None
    architecture: str | None = None  # costs.architecture_of the traced model

    def positions(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(base64.b64decode(s)) for s in self.sequences)

    def acceptance(self) -> float:
        """Leading matches per pass over the tokens a full pass drafts, for people."""
        seqs = [b for seq in self.positions() for b in seq if b != NO_HIT]
        return sum(seqs) / (len(seqs) * self.drafted) if seqs else 0.0


def fractal_to_dict(rec: FractalRecord) -> dict:
    out: dict[str, Any] = {"encoding": LOOKUP_ENCODING, "scheme": rec.scheme, "n": rec.n, "w": rec.w,
                           "layers": list(rec.layers), "drafted": rec.drafted, "max_new_tokens": rec.max_new_tokens}
    out.update({k: v for k, v in (("workload", rec.workload), ("architecture", rec.architecture)) if v is not None})
    out["acceptance"] = round(rec.acceptance(), 4)
    out["sequences"] = list(rec.sequences)
    return out


def fractal_from_dict(raw: Any, *, source: str = "<profile>") -> FractalRecord:
    """Validate ``measured.fractal_matches``; every problem is one ProfileError line."""
    path, raw = _record(raw, FRACTAL_KEY, LOOKUP_ENCODING, source)
    _known_keys(raw, _FRACTAL_KEYS, path, source)
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
    _strings(raw, ("workload", "architecture"), path, source)
    seqs = _match_sequences(raw, path, source, most=ints["drafted"], what="drafted")
    return FractalRecord(scheme, ints["n"], ints["w"], tuple(layers), ints["drafted"], ints["max_new_tokens"], seqs,
                         raw.get("workload"), raw.get("architecture"))


__all__ = ["ACCEPTANCE_KEY", "AcceptanceRecord", "ENCODING", "FRACTAL_KEY", "FractalRecord", "LOOKUP_ENCODING",
           "LOOKUP_KEY", "LookupRecord", "MAX_KEPT", "NO_HIT", "PRECISION_KEY", "PrecisionRecord", "SkipSetTraces",
           "acceptance_from_dict", "acceptance_to_dict", "decode_trace", "encode_trace", "fractal_from_dict",
           "fractal_to_dict", "lookup_from_dict", "lookup_to_dict", "precision_from_dict", "precision_to_dict",
           "record_acceptance"]
