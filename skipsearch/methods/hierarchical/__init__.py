"""``hierarchical``: three depths of one model (M_p verifies M_q, M_q verifies M_s), lossless by composition.

The draft config is M_q's skip sets, with K = m·(n+1) and no exit rule; ``method_params`` give m, n and
M_s's skip sets. The package holds the
``Hierarchy`` and the params (``params.py``), the three-level drafter (``drafter.py``), its re-plan (``replan.py``:
m and n re-chosen from the α and β it keeps), the planner's closed forms over (m, n) (``closed_form.py``, no torch)
and the planner on the model (``planner.py``: α and β traced, the three levels timed, the plan validated). It has no
strategy of its own: ``skipsearch plan`` chooses (m, n) by the planner and writes the profile
(``skipsearch.api.planning``, which also reads a study's skip sets into the planner's front).
"""

from __future__ import annotations

from skipsearch.config import NO_EXIT, Candidate, DraftConfig
from skipsearch.methods.base import Method
from skipsearch.methods.hierarchical.params import (
    HierarchicalParams,
    Hierarchy,
    hierarchy_from_profile,
    hierarchy_to_profile_fields,
)
from skipsearch.methods.hierarchical.replan import replan


def _drafter(candidate: Candidate, sm):
    from skipsearch.methods.hierarchical.drafter import HierarchicalDrafter

    p = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    return HierarchicalDrafter(Hierarchy(medium=candidate.draft, small=p.small, m=p.m, n=p.n))


def _example(num_layers: int) -> Candidate:
    mid = num_layers // 2
    small = DraftConfig(skip_attn=(mid, mid + 1) if mid + 1 < num_layers else (mid,), max_draft_tokens=0, exit=NO_EXIT)
    m, n = 2, 1
    return METHOD.candidate(DraftConfig(skip_attn=(mid,), max_draft_tokens=m * (n + 1), exit=NO_EXIT),
                            HierarchicalParams(m=m, n=n, small=small))


METHOD = Method(
    name=HierarchicalParams.method,
    summary="hierarchical: a small draft checked by a medium draft checked by the full model (plan)",
    params=HierarchicalParams,
    drafter=_drafter,
    example=_example,
    strategy=None,
    replan=replan,
)


# The three-level drafter (drafter.py) loads torch: import it from its module.
__all__ = ["METHOD", "HierarchicalParams", "Hierarchy", "hierarchy_from_profile", "hierarchy_to_profile_fields"]
