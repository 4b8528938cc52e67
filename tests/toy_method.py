"""A toy draft method, whole in this one module, as a plug-in would be: its params, its record and its re-plan.
tests/test_replan.py registers it with one line and re-plans its profile through ``skipsearch plan profile --profile``,
which shows that adding a method touches only its own package and one registry line.

The toy drafts nothing (its drafter is plain decoding); its record is one number, the acceptance α it claims,
and its re-plan prices K by the i.i.d. closed form: τ = (1 - α^(K+1)) / (1 - α) tokens per cycle of cost
v(K + 1) + K·c, with c its ``draft_cost`` parameter.

Beside it, a toy draft source (``SOURCE_METHOD``): what a new draft source writes to be a hybrid's fallback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from skipsearch.config import DraftConfig
from skipsearch.files.errors import NoRecordError, ProfileError
from skipsearch.files.records import decode_trace, encode_trace, is_base64
from skipsearch.measure import Measurement
from skipsearch.methods import Kept, Method, ParamsError, Record, Replanned, Traced, Tracing, check_keys

NAME = "toy"
KEY = "toy_alpha"  # measured.<key>: its record


@dataclass(frozen=True)
class ToyParams:
    method: ClassVar[str] = NAME
    draft_cost: float = 0.1  # c: one draft token over one full step

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> ToyParams:
        check_keys(NAME, raw, cls)
        cost = raw.get("draft_cost", cls.draft_cost)
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost <= 1:
            raise ParamsError(f"{NAME}: method_params.draft_cost must be a number in [0, 1]")
        return cls(float(cost))

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        return (("draft_cost", self.draft_cost),)


def read_alpha(raw: Any, *, source: str = "<profile>") -> float:
    if not isinstance(raw, dict) or not isinstance(raw.get("alpha"), float) or not 0 <= raw["alpha"] < 1:
        raise ProfileError(f"{source}: measured.{KEY}.alpha must be a number in [0, 1)")
    return raw["alpha"]


def keep(k) -> Kept:
    return Kept(((KEY, {"alpha": 0.5}),))  # a toy: what a real method measures on the model


def replan(job) -> Replanned:
    if KEY not in job.extra:
        raise NoRecordError(f"{job.source}: keeps no toy record")
    alpha = read_alpha(job.extra[KEY], source=job.source)
    job.check_costs(None)
    c = ToyParams.parse(dict(job.profile.method_params), draft=job.profile.draft, num_layers=1).draft_cost
    cm = job.target.cost_model()
    options = []
    for k in sorted(job.k_values):
        tau = (1 - alpha ** (k + 1)) / (1 - alpha)
        speedup = tau / (cm.verify(k + 1) + k * c)
        options.append((replace(job.profile.draft, max_draft_tokens=k),
                        Measurement("surrogate", speedup, predicted_speedup=speedup, tau=tau, cost_ratio=c)))
    options.sort(key=lambda o: -o[1].speedup)
    best, m = options[0]
    ships = best if m.speedup > 1.0 else replace(best, max_draft_tokens=0)
    return Replanned(ships, m, best, tuple(options), basis=f"its toy record (α {alpha})", column="K")


METHOD = Method(name=NAME, summary="a toy: drafts nothing, re-plans K from the α it claims", params=ToyParams,
                drafter=lambda candidate, sm: None, record=Record(formats=((KEY, read_alpha),), build=keep),
                replan=replan)


# -- a toy draft source: all a new draft source needs to be a hybrid's fallback -----------------------------------
# The model under its draft config's skip sets, as layer-skip with the full head is, written as a plug-in would
# write it: a drafter, ``drafts_alone`` and the ``Tracing`` hooks (its traces for the surrogate, its record of them,
# and that record read back for re-planning). tests/test_hybrid.py registers it with one line and checks that a
# hybrid drafts, predicts, keeps and re-plans through it exactly as through layer-skip, with no line in hybrid.
SOURCE = "toy-source"
SOURCE_KEY = "toy_source_traces"  # measured.<key>: its traces, one per calibration sequence


@dataclass(frozen=True)
class SourceParams:
    method: ClassVar[str] = SOURCE

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> SourceParams:
        check_keys(SOURCE, raw, cls)
        draft.check_layers(num_layers)
        return cls()

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        return ()


def _source_drafter(candidate, sm):
    from skipsearch.engine.decoding import LayerSkipDrafter

    return None if candidate.draft.is_autoregressive else LayerSkipDrafter(candidate.draft)


def read_traces(raw: Any, *, source: str = "<profile>") -> tuple[str, ...]:
    traces = raw.get("traces") if isinstance(raw, dict) else None
    if not isinstance(traces, list) or not all(isinstance(t, str) and is_base64(t) for t in traces):
        raise ProfileError(f"{source}: measured.{SOURCE_KEY}.traces must list encoded traces")
    return tuple(traces)


def _measure(objective, candidate) -> Traced:
    from skipsearch.engine.surrogate import trace

    rows = zip(objective.cal.prompts, objective.cal.continuations, objective.full_caches(), strict=True)
    traces = tuple(trace(objective.sm, p, c, candidate.draft, cache=kv) for p, c, kv in rows)
    return Traced(traces, objective.costs.draft_ratio(candidate.draft))


def _keep_source(k, candidate) -> Kept:
    from skipsearch.engine.surrogate import aligned, trace_skip_sets

    key = (candidate.draft.skip_attn, candidate.draft.skip_mlp)
    traced = aligned(trace_skip_sets(k.objective.sm, k.objective.cal, [candidate.draft])[key], k.objective.cal)
    return Kept(((SOURCE_KEY, {"traces": [encode_trace(t) for t in traced]}),))


def _read_source(job, candidate) -> Traced:
    if SOURCE_KEY not in job.extra:
        raise ProfileError(f"{job.source}: keeps no {SOURCE} traces")
    traces = tuple(decode_trace(t) for t in read_traces(job.extra[SOURCE_KEY], source=job.source))
    job.check_costs(None)
    return Traced(traces, job.target.cost_model().draft_ratio(candidate.draft), key=SOURCE_KEY)


def _keep_own(k) -> Kept:
    return _keep_source(k, k.candidate)


SOURCE_METHOD = Method(name=SOURCE, summary="a toy draft source: the model under its skip sets", params=SourceParams,
                       drafter=_source_drafter, record=Record(formats=((SOURCE_KEY, read_traces),), build=_keep_own),
                       drafts_alone=True, traces=Tracing(measure=_measure, keep=_keep_source, read=_read_source))
