"""Layer skip's record and re-plan: the traces of its shortlisted skip sets, replayed under another device's costs.

Acceptance belongs to the model, the skip set and the workload: one trace per calibration sequence, the draft's
per-position agreement with the full model and its top probability (``surrogate.trace``). A trace does not depend
on K or the exit rule, only on the skip set, so the profile keeps the traces of its shortlist's skip sets
(``record.AcceptanceRecord``) and re-planning replays every K and exit rule of a small grid on each under
the other costs (``surrogate.replan_skip_set``), with no model. torch loads only when a record is made or replayed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skipsearch.config import AUTOREGRESSIVE, Candidate, DraftConfig
from skipsearch.files.errors import NoRecordError, ProfileError
from skipsearch.methods.base import Keeping, Kept, Record, Replanned, Replanning, Traced
from skipsearch.methods.layer_skip.params import LayerSkipParams
from skipsearch.methods.layer_skip.record import (
    ACCEPTANCE_KEY,
    MAX_KEPT,
    AcceptanceRecord,
    acceptance_from_dict,
    acceptance_to_dict,
    record_acceptance,
)


def keep(k: Keeping) -> Kept:
    """The traces of the distinct skip sets the search shortlisted (best first, at most MAX_KEPT); for a profile
    alone, of its own draft's skip set."""
    from skipsearch.engine.surrogate import trace_skip_sets

    if k.searched is None:
        draft = k.candidate.draft
        if not (draft.skip_attn or draft.skip_mlp):
            raise ProfileError(f"{k.source}: its draft skips no sublayer, so there is no draft to trace; decode it "
                               f"without a profile")
        drafts = [draft]
    else:
        drafts = [c.draft for c in k.searched if c.method == LayerSkipParams.method and not c.is_autoregressive]
    keys = list(dict.fromkeys((d.skip_attn, d.skip_mlp) for d in drafts))[:MAX_KEPT]
    if not keys:
        return Kept()
    traced = trace_skip_sets(k.objective.sm, k.objective.cal, [DraftConfig(a, m) for a, m in keys])
    rec = record_acceptance(traced, workload=k.workload, architecture=k.architecture)
    return Kept(((ACCEPTANCE_KEY, acceptance_to_dict(rec)),))


RECORD = Record(formats=((ACCEPTANCE_KEY, acceptance_from_dict),), build=keep)


# -- as a draft another method drafts through (Method.traces: a hybrid's fallback) ------------------------------
def _priced(cand: Candidate) -> bool:
    # a cost file prices the skipped sublayers, not a trimmed head's saving
    return not cand.plain_params().get("vocab_subset")


def keep_draft(k: Keeping, cand: Candidate) -> Kept | None:
    """The acceptance record of ``cand``'s skip set alone, its traces lined up with the calibration's sequences (an
    empty trace where a continuation is empty); None for a trimmed head, which a cost file does not price."""
    from skipsearch.engine.surrogate import aligned, trace_skip_sets

    if not _priced(cand):
        return None
    key = (cand.draft.skip_attn, cand.draft.skip_mlp)
    sm, cal = k.objective.sm, k.objective.cal
    traced = {key: aligned(trace_skip_sets(sm, cal, [DraftConfig(*key)])[key], cal)}
    rec = record_acceptance(traced, workload=k.workload, architecture=k.architecture)
    return Kept(((ACCEPTANCE_KEY, acceptance_to_dict(rec)),))


def read_draft(job: Replanning, cand: Candidate) -> Traced:
    """``cand``'s skip set's kept traces, and its c from the cost file's per-sublayer costs; one line when the
    profile keeps none of them (or ``cand`` has a trimmed head)."""
    extra = job.extra
    acc = acceptance_from_dict(extra[ACCEPTANCE_KEY], source=job.source) if ACCEPTANCE_KEY in extra else None
    priced = _priced(cand)
    kept = [t for t in (acc.skip_sets if acc else ()) if priced
            and (t.skip_attn, t.skip_mlp) == (cand.draft.skip_attn, cand.draft.skip_mlp)]
    if not kept:
        raise ProfileError(f"{job.source}: keeps no traces of its layer-skip fallback (measured.{ACCEPTANCE_KEY}"
                           f"{'' if priced else '; a trimmed head is not priced by a cost file'}); run optimize again")
    job.check_costs(acc.architecture or job.weights_architecture)
    return Traced(kept[0].decoded(), job.target.cost_model().draft_ratio(cand.draft), key=ACCEPTANCE_KEY)


# -- re-planning the profile's own draft ----------------------------------------------------------------------
def kept_traces(job: Replanning) -> AcceptanceRecord:
    """The profile's acceptance record, once its cost file is checked against the profile's model; a
    ``NoRecordError`` (after the checks: the caller may trace the draft on the model next) when it keeps none."""
    extra = job.extra
    rec = acceptance_from_dict(extra[ACCEPTANCE_KEY], source=job.source) if ACCEPTANCE_KEY in extra else None
    job.check_costs((rec and rec.architecture) or job.weights_architecture)
    if rec is None:
        raise NoRecordError(f"{job.source}: keeps no acceptance record (measured.acceptance): it was written before "
                            f"profiles kept one, or by hand; plan traces its draft on the model (`skipsearch plan "
                            f"--profile`), or run optimize again")
    return rec


def replan_record(rec: AcceptanceRecord, costs: Any, *, k_values: Sequence[int] | None = None,
                  also: Sequence[DraftConfig] = ()) -> Replanned:
    """Re-plan K, the exit rule and the skip set (among the kept ones) for ``costs`` (a surrogate.CostModel)."""
    from skipsearch.engine.surrogate import K_VALUES, replan_skip_set

    ks = K_VALUES if k_values is None else k_values
    options = sorted((replan_skip_set(s.decoded(), (s.skip_attn, s.skip_mlp), costs, k_values=ks, also=also)
                      for s in rec.skip_sets), key=lambda cm: -cm[1].speedup)
    draft, m = options[0] if options else (None, None)
    ships = draft if m is not None and m.speedup > 1.0 else AUTOREGRESSIVE
    return Replanned(ships, m, draft, tuple(options), basis=f"{len(options)} kept skip set(s)")


def replan(job: Replanning) -> Replanned:
    """K, the exit rule and the skip set re-planned for the cost file from the kept traces (the profile's own draft
    is weighed too)."""
    rec = kept_traces(job)
    return replan_record(rec, job.target.cost_model(), k_values=job.k_values, also=(job.profile.draft,))


__all__ = ["RECORD", "keep", "keep_draft", "kept_traces", "read_draft", "replan", "replan_record"]
