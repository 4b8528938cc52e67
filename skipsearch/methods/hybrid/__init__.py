"""``hybrid``: prompt lookup first; in a cycle where it finds no match, another draft source drafts.

Prompt lookup costs almost nothing but drafts only where the text repeats; a layer-skip (or fractal)
draft costs most of a step but drafts everywhere. The hybrid runs the lookup of ``method: ngram``
every cycle and calls the fallback only on a miss, so each cycle's draft comes from exactly one
source. Which one depends on the tokens so far alone, so each cycle is an ordinary speculative step
with that source's q (one-hot for a lookup, the fallback's own q otherwise): greedy output is the full
model's, and sampling stays exact.

``method_params``:
- ``min_n``, ``max_n``: the lookup's suffix lengths, as for ``ngram``;
- ``fallback``: a registered method that drafts alone (``Method.drafts_alone``: ``layer-skip``, ``fractal``,
  ``precision``) or ``none`` (lookup alone: what a search ships when no fallback pays);
- ``fallback_k``: the most tokens the fallback drafts in a cycle (default: K, the draft's
  ``max_draft_tokens``, which bounds the lookup's drafts and every draft);
- the fallback's own ``method_params`` beside them (layer-skip: a trimmed head's ``vocab_subset``,
  ``vocab_ids``, ``vocab_sha256``; fractal: ``n``, ``w``, ...), validated by that method.
A traced fallback's skip sets and exit rule are the profile's ``draft`` (layer-skip, precision: ``Method.traces``).

The drafter's report says what each source contributed: ``lookups``, ``lookup_hits``, ``ngram_drafted``,
``ngram_accepted``, ``ngram_seconds`` and ``fallback_cycles``, ``fallback_drafted``,
``fallback_accepted``, ``fallback_seconds``. The surrogate replays the lookup exactly and, on a miss, a traced
fallback over the same traces its own surrogate reads (``Method.traces``; any other fallback, e.g. fractal, can
only be timed). The ``hybrid`` strategy searches it.

Its record: the lookup record (as ``ngram``'s) and, for a traced fallback, that draft's own record of its traces
lined up with the lookup's sequences; re-planning replays both, cycle by cycle, under another device's costs.
Nothing here names a fallback: it asks the registry which methods draft alone and what they trace.

The package: the params (``params.py``), the drafters (``drafter.py``: one row, or a batch), the surrogate, record
and re-plan (``replan.py``); here, its settings as a serving engine's and the METHOD record.
"""

from __future__ import annotations

from dataclasses import replace

from skipsearch.config import NO_EXIT, Candidate, DraftConfig
from skipsearch.methods import ngram
from skipsearch.methods.base import Method, Setting, Speculation, candidate_for, copies_weights, setting_of
from skipsearch.methods.hybrid.drafter import HybridBatchDrafter, HybridDrafter, _drafter
from skipsearch.methods.hybrid.params import _OWN, NONE, HybridParams, fallbacks
from skipsearch.methods.hybrid.replan import (
    RECORD,
    LookupThenFallback,
    _predict,
    _replan_schemes,
    keep,
    recorded_cycles,
    replan,
    replay_recorded,
)

__all__ = ["METHOD", "NONE", "RECORD", "HybridBatchDrafter", "HybridDrafter", "HybridParams", "LookupThenFallback",
           "fallbacks", "keep", "recorded_cycles", "replan", "replay_recorded"]


# -- as serving engines' settings -------------------------------------------------------------------------------
def _setting(candidate: Candidate) -> Setting:
    """The lookup, and on its miss the fallback's draft model where the fallback is one (a precision draft);
    ``fallback`` names any fallback."""
    lookup = ngram.lookup_of(candidate)
    theirs = _fallback(candidate)
    if theirs is None:
        return Setting(lookup=lookup)
    return Setting(lookup=lookup, draft_model=setting_of(theirs).draft_model, fallback=theirs.method)


def _fallback(candidate: Candidate) -> Candidate | None:
    """The fallback's own candidate (its K, its params), or None where the lookup drafts alone."""
    params = candidate.plain_params()
    fallback = params.get("fallback", HybridParams.fallback)
    if fallback == NONE:
        return None
    k = params.get("fallback_k") or candidate.draft.max_draft_tokens
    return Candidate(fallback, replace(candidate.draft, max_draft_tokens=k),
                     tuple((key, v) for key, v in params.items() if key not in _OWN))


def _copies_weights(candidate: Candidate) -> bool:
    theirs = _fallback(candidate)
    return theirs is not None and copies_weights(theirs)


def _candidate(setting: Setting) -> Candidate | None:
    """The hybrid candidate of a lookup with a draft model on its miss (the draft model's candidate as fallback)."""
    lk, dm = setting.lookup, setting.draft_model
    if lk is None or dm is None:
        return None
    fb = candidate_for(Setting(draft_model=dm))
    params = HybridParams(min_n=lk.min_n, max_n=lk.max_n, fallback=fb.method, fallback_k=dm.k,
                          fallback_params=fb.params)
    return Candidate(HybridParams.method, replace(fb.draft, max_draft_tokens=lk.k), params.to_pairs())


def _example(num_layers: int) -> Candidate:
    draft = DraftConfig(skip_attn=(num_layers // 2,), max_draft_tokens=3, exit=NO_EXIT)
    return Candidate(HybridParams.method, draft, HybridParams(min_n=1, max_n=2, fallback_k=2).to_pairs())


METHOD = Method(
    name=HybridParams.method,
    summary="prompt lookup first; on a miss, a layer-skip (optionally trimmed-head) or fractal draft",
    params=HybridParams,
    drafter=_drafter,
    example=_example,
    strategy=HybridParams.method,
    predict=_predict,
    record=RECORD,
    replan=replan,
    replan_schemes=_replan_schemes,
    speculation=Speculation(setting=_setting, candidate=_candidate),
    copies_weights=_copies_weights,
    batch_drafter=lambda candidate, sm: _drafter(candidate, sm, batch=True),
)
