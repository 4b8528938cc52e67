"""``clasp-dynamic``: CLaSp's DP re-plans the skipped layers every LOI verify steps while decoding.

The draft config gives the starting skip set, K and the exit rule; ``method_params`` give M (how many
layers, or sublayers of one kind, the DP skips), the LOI and the granularity. The package holds the
method's algorithm, CLaSp's DP (``dp.py``: its static and dynamic use, and its brute-force check), its
params (``params.py``), its drafter (``drafter.py``), and its record and re-plan (``replan.py``: the traces of its
starting skip set). The ``clasp`` strategy writes this profile beside the static one it searches, so ``clasp`` is
its search entry.
"""

from __future__ import annotations

from skipsearch.config import Candidate, DraftConfig
from skipsearch.methods.base import Method
from skipsearch.methods.clasp_dynamic.params import SUBLAYERS, DynamicParams, config_for, granularity, skippable
from skipsearch.methods.clasp_dynamic.replan import RECORD, replan


def _drafter(candidate: Candidate, sm):
    from skipsearch.methods.clasp_dynamic.drafter import ClaspDynamicDrafter

    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    candidate.draft.check_layers(sm.num_layers)
    return ClaspDynamicDrafter(params, candidate.draft, num_layers=sm.num_layers)


def _example(num_layers: int) -> Candidate:
    mid = num_layers // 2
    return METHOD.candidate(DraftConfig(skip_attn=(mid,), max_draft_tokens=2),
                            DynamicParams(num_skips=1, loi=2, sublayer="attn"))


METHOD = Method(
    name=DynamicParams.method,
    summary="CLaSp: the skip set re-planned by dynamic programming every LOI verify steps",
    params=DynamicParams,
    drafter=_drafter,
    example=_example,
    strategy="clasp",
    record=RECORD,
    replan=replan,
    compiled_kernels=False,
)


# The DP (dp.py) and the drafter (drafter.py) load torch: import them from their modules.
__all__ = ["METHOD", "SUBLAYERS", "DynamicParams", "config_for", "granularity", "skippable"]
