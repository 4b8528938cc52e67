"""Precision's record: a precision draft's traces (a precision profile's, or a hybrid's precision fallback's).

A precision draft's acceptance belongs to the model, its roles (skipped / full / quantized sublayers, head) and
its scheme's numerics, not to the device's speed: its teacher-forced traces, encoded as the acceptance record's
(files.records.ENCODING), with the roles they were traced with so that a profile edited since is refused. The
scheme's per-sublayer costs on the searching device go in measured.costs.schemes (files.costs.SchemeCosts), beside
the rest of its costs. For a hybrid, the traces line up with measured.lookup's sequences, one per calibration
sequence ("" where the sequence's continuation is empty).

The same draft is also traced in the other schemes the searching device has kernels for (``other_schemes``: e.g.
int8 and int4 beside a CPU search's fp16), over the same calibration sequences, so that a cost file that prices
none of the searched scheme (a GPU's, where fbgemm's fp16 has no kernel) still prices the draft in one of them.
Each keeps the device type it was traced on: its kernel's rounding is in the traces. Records written before
(no ``other_schemes``) read as the searched scheme alone. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skipsearch.config import Trace
from skipsearch.files.errors import ProfileError
from skipsearch.files.records import (
    ENCODING,
    decode_trace,
    is_base64,
    known_keys,
    matched,
    optional_strings,
    read_record,
    record_mapping,
)

PRECISION_KEY = "precision_traces"  # measured.<key> of a precision profile, or of a hybrid with a precision fallback
_PRECISION_KEYS = ("encoding", "scheme", "skip_attn", "skip_mlp", "full_attn", "full_mlp", "quant_head",
                   "vocab_subset", "vocab_size", "workload", "architecture", "alpha", "traces", "other_schemes")
_OTHER_KEYS = ("device", "alpha", "traces")


@dataclass(frozen=True)
class SchemeTraces:
    """The draft's traces in another scheme than the searched one, over the same calibration sequences."""

    scheme: str
    traces: tuple[str, ...]  # encoded, one per calibration sequence, lined up with the record's own
    device: str | None = None  # the device type whose kernel ran the scheme when it was traced ("cpu")

    def alpha(self) -> float:
        return _alpha(self.traces)


def _alpha(traces: tuple[str, ...]) -> float:
    bits = [b for t in traces for b in matched(t)]
    return sum(bits) / len(bits) if bits else 0.0


@dataclass(frozen=True)
class PrecisionRecord:
    scheme: str
    skip_attn: tuple[int, ...]
    skip_mlp: tuple[int, ...]
    full_attn: tuple[int, ...]
    full_mlp: tuple[int, ...]
    quant_head: bool
    traces: tuple[str, ...]  # encoded (files.records.ENCODING), one per calibration sequence
    vocab_subset: int | None = None  # V' of a trimmed draft head
    vocab_size: int | None = None  # V, the full head's: re-planning prices a trimmed head at V'/V of it
    workload: str | None = None
    architecture: str | None = None  # costs.architecture_of the traced model
    others: tuple[SchemeTraces, ...] = ()  # the same draft traced in other schemes (none in older records)

    def schemes(self) -> tuple[str, ...]:
        """Every scheme the draft was traced in, the searched one first."""
        return (self.scheme, *(o.scheme for o in self.others))

    def other(self, scheme: str) -> SchemeTraces | None:
        return next((o for o in self.others if o.scheme == scheme), None)

    def decoded(self, scheme: str | None = None) -> tuple[Trace, ...]:
        """The traces in ``scheme`` (default: the searched one)."""
        other = None if scheme in (None, self.scheme) else self.other(scheme)
        if scheme not in (None, self.scheme) and other is None:
            raise KeyError(scheme)
        return tuple(decode_trace(t) for t in (other.traces if other is not None else self.traces))

    def alpha(self) -> float:
        return _alpha(self.traces)


def precision_to_dict(rec: PrecisionRecord) -> dict:
    out: dict[str, Any] = {"encoding": ENCODING, "scheme": rec.scheme, "skip_attn": list(rec.skip_attn),
                           "skip_mlp": list(rec.skip_mlp), "full_attn": list(rec.full_attn),
                           "full_mlp": list(rec.full_mlp), "quant_head": rec.quant_head}
    out.update({k: v for k, v in (("vocab_subset", rec.vocab_subset), ("vocab_size", rec.vocab_size),
                                  ("workload", rec.workload), ("architecture", rec.architecture)) if v is not None})
    out["alpha"] = round(rec.alpha(), 4)
    out["traces"] = list(rec.traces)
    if rec.others:
        out["other_schemes"] = {o.scheme: {**({"device": o.device} if o.device else {}), "alpha": round(o.alpha(), 4),
                                           "traces": list(o.traces)} for o in rec.others}
    return out


def _others(raw: Any, scheme: str, traces: list, path: str, source: str) -> tuple[SchemeTraces, ...]:
    """``other_schemes``: scheme -> {device, alpha, traces}, each lined up with the record's own traces."""
    if raw is None:
        return ()
    where = f"{path}.other_schemes"
    if not isinstance(raw, dict):
        raise ProfileError(f"{source}: {where} must map a scheme to its traces")
    lengths = [len(matched(t)) for t in traces]
    out = []
    for name, entry in raw.items():
        if not isinstance(name, str) or not name.isidentifier() or name == scheme:
            shown = str(name)[:40]
            raise ProfileError(f"{source}: {where} has {shown!r}: it must name a precision scheme other than the "
                               f"record's own ({scheme})")
        entry = record_mapping(entry, f"{where}.{name}", source)
        known_keys(entry, _OTHER_KEYS, f"{where}.{name}", source)
        (device,) = optional_strings(entry, ("device",), f"{where}.{name}", source)
        theirs = entry.get("traces")
        if not isinstance(theirs, list) or not all(isinstance(t, str) and is_base64(t) for t in theirs):
            raise ProfileError(f"{source}: {where}.{name}.traces must list base64 traces")
        if [len(matched(t)) for t in theirs] != lengths:
            raise ProfileError(f"{source}: {where}.{name}.traces are not lined up with {path}.traces (one per "
                               f"calibration sequence, as long)")
        out.append(SchemeTraces(name, tuple(theirs), device))
    return tuple(out)


def precision_from_dict(raw: Any, *, source: str = "<profile>") -> PrecisionRecord:
    """Validate ``measured.precision_traces``; every problem is one ProfileError line."""
    path, raw = read_record(raw, PRECISION_KEY, ENCODING, source)
    known_keys(raw, _PRECISION_KEYS, path, source)
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
    optional_strings(raw, ("workload", "architecture"), path, source)
    alpha = raw.get("alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))):
        raise ProfileError(f"{source}: {path}.alpha must be a number")
    traces = raw.get("traces")
    if not isinstance(traces, list) or not traces or not all(isinstance(t, str) for t in traces):
        raise ProfileError(f"{source}: {path}.traces must list one encoded trace per calibration sequence")
    if not all(is_base64(t) for t in traces):
        raise ProfileError(f"{source}: {path}.traces holds a string that is not base64")
    others = _others(raw.get("other_schemes"), scheme, traces, path, source)
    return PrecisionRecord(scheme, layers["skip_attn"], layers["skip_mlp"], layers["full_attn"], layers["full_mlp"],
                           raw["quant_head"], tuple(traces), raw.get("vocab_subset"), raw.get("vocab_size"),
                           raw.get("workload"), raw.get("architecture"), others)


__all__ = ["PRECISION_KEY", "PrecisionRecord", "SchemeTraces", "precision_from_dict", "precision_to_dict"]
