"""``layer-skip``'s surrogate: traces of the calibration data through the draft, replayed with the measured costs.

What it reads (trace, replay, the cost model) is skipsearch.engine.surrogate's, shared with every method.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

from skipsearch.config import Candidate, DraftConfig
from skipsearch.engine import timing
from skipsearch.engine.surrogate import measure_head_saving, replay_all, trace
from skipsearch.measure import Measurement
from skipsearch.methods.layer_skip.drafter import subset_head
from skipsearch.methods.layer_skip.params import LayerSkipParams


@dataclass
class _Memo:
    full: list  # full-model KV per calibration sequence
    traces: dict  # (skip_attn, skip_mlp, subset sha256 or None) -> [Trace]
    savings: dict  # subset sha256 -> seconds the trimmed head saves per draft step


_MEMOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # objective -> _Memo


def _memo(objective) -> _Memo:
    memo = _MEMOS.get(objective)
    if memo is None:
        memo = _MEMOS[objective] = _Memo(objective.full_caches(), {}, {})
    return memo


def draft_traces(objective, config: DraftConfig, params: LayerSkipParams = LayerSkipParams()) -> list:
    """``trace`` of every calibration sequence through ``config``'s skips and ``params``' draft
    head, computed once per objective. Entry i of a trace is the draft's guess at continuation[i], with
    the full model's context before it."""
    memo = _memo(objective)
    key = (config.skip_attn, config.skip_mlp, params.vocab_sha256)
    if key not in memo.traces:
        sm = objective.sm
        rows = zip(objective.cal.prompts, objective.cal.continuations, memo.full, strict=True)
        with sm.draft_head(subset_head(sm, params)):
            memo.traces[key] = [trace(sm, p, c, config, cache=kv) for p, c, kv in rows]
    return memo.traces[key]


def draft_costs(objective, params: LayerSkipParams):
    """The objective's cost model, with the draft step's fixed part less what ``params``' trimmed head saves.

    The saving is timed once per subset (``surrogate.measure_head_saving``: a one-token step of the full model with
    the full head and with the trimmed one, interleaved by the one harness, medians), and never priced below 0."""
    costs = objective.costs
    if params.vocab_sha256 is None:
        return costs
    memo = _memo(objective)
    if params.vocab_sha256 not in memo.savings:
        sm = objective.sm
        saving = measure_head_saving(sm, objective.cal.cost_context, subset_head(sm, params),
                                     repeats=objective.cost_rounds)
        memo.savings[params.vocab_sha256] = max(saving, 0.0)
    return replace(costs, fixed_seconds=max(costs.fixed_seconds - memo.savings[params.vocab_sha256], 0.0))


def predict(objective, candidate: Candidate, params: LayerSkipParams) -> Measurement:
    """Trace each calibration sequence through the draft (and its trimmed head, if any), then replay the
    decoder over the traces, charging the draft step less what the trimmed head saves."""
    t0 = timing.now(objective.sm.device)
    config, costs = candidate.draft, draft_costs(objective, params)
    traces = [tr for tr in draft_traces(objective, config, params) if tr.matches]
    return replace(replay_all(traces, config, costs), seconds=timing.now(objective.sm.device) - t0)
