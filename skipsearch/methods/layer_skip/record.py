"""Layer skip's record: the traces of skip sets, one per calibration sequence (``measured.acceptance``).

A trace does not depend on K or the exit rule, only on the skip set, so one record serves every K and exit rule
a re-plan weighs. The plain method's profiles keep the traces of their search's shortlist; a study's skip sets are
re-traced into one (``search.replan``); a hybrid's layer-skip fallback keeps its own skip set's. No torch.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skipsearch.config import ConfigError, DraftConfig, Trace
from skipsearch.files.errors import ProfileError
from skipsearch.files.records import (
    ENCODING,
    decode_trace,
    encode_trace,
    matched,
    optional_strings,
    read_record,
    record_mapping,
)

ACCEPTANCE_KEY = "acceptance"  # measured.<key> of a profile (schema v2), beside files.costs.COSTS_KEY
MAX_KEPT = 8  # skip sets a profile keeps the traces of


@dataclass(frozen=True)
class SkipSetTraces:
    """One skip set's traces: what acceptance it gets on each calibration sequence."""

    skip_attn: tuple[int, ...]
    skip_mlp: tuple[int, ...]
    traces: tuple[str, ...]  # encoded (files.records.ENCODING), one per calibration sequence

    def decoded(self) -> tuple[Trace, ...]:
        return tuple(decode_trace(t) for t in self.traces)

    def acceptance_curve(self, k: int = 8) -> tuple[float, ...]:
        """α by draft position, for people: P(the first i drafts of a block all match), i = 1..k, over
        every start position (no exit rule)."""
        bits = [matched(t) for t in self.traces]
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
    path, raw = read_record(raw, ACCEPTANCE_KEY, ENCODING, source)
    items = raw.get("skip_sets")
    if not isinstance(items, list) or not items:
        raise ProfileError(f"{source}: {path}.skip_sets must list the kept skip sets and their traces")
    sets = []
    for i, item in enumerate(items):
        where = f"{path}.skip_sets[{i}]"
        item = record_mapping(item, where, source)
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
    workload, arch = optional_strings(raw, ("workload", "architecture"), path, source)
    return AcceptanceRecord(tuple(sets), workload, arch)


__all__ = ["ACCEPTANCE_KEY", "MAX_KEPT", "AcceptanceRecord", "SkipSetTraces", "acceptance_from_dict",
           "acceptance_to_dict", "record_acceptance"]
