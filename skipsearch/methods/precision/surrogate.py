"""The precision surrogate: α from teacher-forced agreement (as layer-skip's), c from measured scheme costs.

``SchemeCost`` is one scheme's per-sublayer costs, timed once per objective in the same interleaved
rounds as the full step: one layer's quantized attention and MLP, and what the quantized head saves.
With the full model's own per-sublayer costs they give any candidate's c, whatever mix of skipped,
quantized and full sublayers it has, so the replay prices it like for like.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

from skipsearch.config import Candidate, DraftConfig
from skipsearch.engine.surrogate import SchemeCost, measure_head_saving, measure_stand_ins, whole_draft
from skipsearch.methods.precision.params import PrecisionParams


@dataclass
class _Memo:
    costs: dict  # scheme -> SchemeCost
    traces: dict  # (skip sets, full sets, scheme, head) -> [Trace]
    head_savings: dict  # (scheme, quantized head?, subset sha256) -> seconds a trimmed head saves a step


_MEMOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # objective -> _Memo


def _memo(objective) -> _Memo:
    return _MEMOS.setdefault(objective, _Memo({}, {}, {}))


def head_saving(objective, params: PrecisionParams) -> float:
    """Seconds the candidate's draft head saves a step against the full head: the scheme's head from its
    scheme cost; a trimmed head timed once per subset against the full head (``surrogate.measure_head_saving``)."""
    if params.vocab_sha256 is None:
        return scheme_cost(objective, params.scheme).head_saving_seconds if params.quant_head else 0.0
    memo = _memo(objective)
    key = (params.scheme, params.quant_head, params.vocab_sha256)
    if key not in memo.head_savings:
        from skipsearch.methods.precision.copy import draft_head, quantized_copy

        sm = objective.sm
        head = draft_head(sm, quantized_copy(sm, params.scheme), params)
        memo.head_savings[key] = measure_head_saving(sm, objective.cal.cost_context, head,
                                                     repeats=objective.cost_rounds)
    return memo.head_savings[key]


def measure_scheme(sm, context, scheme: str, *, repeats: int = 9) -> SchemeCost:
    """``scheme``'s per-sublayer costs on ``sm``'s device: its quantized copy's stand-ins timed against the full
    step (``surrogate.measure_stand_ins``)."""
    from skipsearch.methods.precision.copy import quantized_copy

    return measure_stand_ins(sm, context, quantized_copy(sm, scheme), repeats=repeats, compiled_whole=True)


def build_drafts_aside(sm, schemes) -> None:
    """Each scheme's whole-model draft (what ``measure_scheme`` times compiled: every sublayer and the head in the
    scheme) built in a child of this process (``SkippableModel.draft_aside``), all side by side, where the kernel is
    compiled; nothing elsewhere."""
    if not sm.kernel.compiled:
        return
    from skipsearch.methods.precision.copy import quantized_copy

    for scheme in schemes:
        with whole_draft(sm, quantized_copy(sm, scheme)):
            sm.draft_aside()


def draft_ratio(cost: SchemeCost, config: DraftConfig, params: PrecisionParams, num_layers: int, *,
                saving: float | None = None) -> float:
    """c of a candidate: its draft step over the decoder's unit (one plain step through the kernel that verifies),
    from the per-sublayer costs; ``saving``: what its draft head saves a step (default: the scheme's whole head when
    it is quantized). The parts are eager timings; where the decoder runs the draft compiled (``whole_seconds``:
    the whole-model draft in the scheme, compiled), their sum is re-priced by that draft's compiled / eager ratio,
    an approximation for drafts that keep some sublayers skipped or full."""
    attn, mlp = params.roles(config, num_layers)
    fixed = cost.step_seconds - num_layers * (cost.full_attn_seconds + cost.full_mlp_seconds)
    if saving is None:
        saving = cost.head_saving_seconds if params.quant_head else 0.0
    seconds = (fixed - saving
               + len(attn) * cost.attn_seconds + len(params.full_attn) * cost.full_attn_seconds
               + len(mlp) * cost.mlp_seconds + len(params.full_mlp) * cost.full_mlp_seconds)
    if cost.whole_seconds is not None:
        eager_whole = fixed - cost.head_saving_seconds + num_layers * (cost.attn_seconds + cost.mlp_seconds)
        if eager_whole > 0:
            seconds *= cost.whole_seconds / eager_whole
    return max(seconds, 0.0) / cost.unit


def priced(base, c: float):
    """``base`` (a surrogate CostModel) re-priced so that every draft costs ``c``: its draft_ratio(config) is c
    exactly (every kept sublayer priced at 0, the rest in fixed), so the layer-skip replay charges a precision
    draft its own c. v(k) and the step stay ``base``'s."""
    return replace(base, fixed_seconds=c * base.step_seconds, attn_seconds=0.0, mlp_seconds=0.0)


def scheme_cost(objective, scheme: str) -> SchemeCost:
    memo = _memo(objective)
    if scheme not in memo.costs:
        memo.costs[scheme] = measure_scheme(objective.sm, objective.cal.cost_context, scheme,
                                            repeats=objective.cost_rounds)
    return memo.costs[scheme]


def draft_traces(objective, config: DraftConfig, params: PrecisionParams) -> list:
    """Teacher-forced traces of every calibration sequence through the precision draft (full-model context KV)."""
    from skipsearch.engine.surrogate import trace
    from skipsearch.methods.precision.copy import draft_head, quantized_copy

    memo = _memo(objective)
    key = (config.skip_attn, config.skip_mlp, params.full_attn, params.full_mlp, params.scheme, params.quant_head,
           params.vocab_sha256)
    if key not in memo.traces:
        sm = objective.sm
        q = quantized_copy(sm, params.scheme)
        rows = zip(objective.cal.prompts, objective.cal.continuations, objective.full_caches(), strict=True)
        with sm.substituted(**q.stand_ins(*params.roles(config, sm.num_layers))), \
                sm.draft_head(draft_head(sm, q, params)):
            memo.traces[key] = [trace(sm, p, c, config, cache=kv) for p, c, kv in rows if c]
    return memo.traces[key]


def predict(objective, candidate: Candidate):
    """Replay the decoder over the traces with the candidate's own c (the layer-skip replay, re-priced)."""
    from skipsearch.engine import timing
    from skipsearch.engine.surrogate import replay_all

    sm = objective.sm
    t0 = timing.now(sm.device)
    config = candidate.draft
    params = PrecisionParams.parse(candidate.plain_params(), draft=config, num_layers=sm.num_layers)
    c = draft_ratio(scheme_cost(objective, params.scheme), config, params, sm.num_layers,
                    saving=head_saving(objective, params))
    m = replay_all(draft_traces(objective, config, params), config, priced(objective.costs, c))
    return replace(m, seconds=timing.now(sm.device) - t0)
