"""Dynamic CLaSp's record and re-plan: the traces of its starting skip set, replayed under another device's costs.

The DP re-selects the skipped sublayers every LOI verify steps while decoding, which no trace records. Its starting
set skips as many sublayers, so it costs the same (c), and its traces (layer skip's acceptance record) price K and
the exit rule; the acceptance the re-selection adds is not modelled, and the re-planned profile says so.
"""

from __future__ import annotations

from dataclasses import replace

from skipsearch.files.errors import ProfileError
from skipsearch.methods.base import Keeping, Kept, Record, Replanned, Replanning
from skipsearch.methods.layer_skip import ACCEPTANCE_KEY, AcceptanceRecord, acceptance_from_dict
from skipsearch.methods.layer_skip.replan import keep as keep_skip_sets
from skipsearch.methods.layer_skip.replan import kept_traces, replan_record

NOTE = ("approximation: dynamic CLaSp re-selects its skipped sublayers every LOI verify steps; it is priced with the "
        "traces of its starting skip set, which skips as many sublayers (so c is the same), while the acceptance the "
        "re-selection adds is not modelled")


def keep(k: Keeping) -> Kept:
    """The traces of the profile's starting skip set (the DP's choices while decoding are not recorded)."""
    return keep_skip_sets(replace(k, searched=None))


RECORD = Record(formats=((ACCEPTANCE_KEY, acceptance_from_dict),), build=keep)


def replan(job: Replanning) -> Replanned:
    """K and the exit rule re-chosen for the cost file by replaying the traces of the profile's starting skip set
    (the DP's choice is left as it is)."""
    rec, draft = kept_traces(job), job.profile.draft
    kept = [s for s in rec.skip_sets if (s.skip_attn, s.skip_mlp) == (draft.skip_attn, draft.skip_mlp)]
    if not kept:
        raise ProfileError(f"{job.source}: measured.{ACCEPTANCE_KEY} keeps no traces of the profile's starting skip "
                           f"set; run optimize again")
    plan = replan_record(AcceptanceRecord(tuple(kept), rec.workload, rec.architecture), job.target.cost_model(),
                         k_values=job.k_values, also=(draft,))
    # plain decoding ships as K = 0 with the starting set kept, so the method's params stay valid
    ships = plan.draft if not plan.draft.is_autoregressive else replace(draft, max_draft_tokens=0)
    return replace(plan, draft=ships, note=NOTE, basis="the traces of its starting skip set")


__all__ = ["NOTE", "RECORD", "keep", "replan"]
