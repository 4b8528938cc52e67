"""``clasp-dynamic``: CLaSp's DP re-plans the skipped layers every LOI verify steps while decoding.

The draft config gives the starting skip set, K and the exit rule; ``method_params`` give M (how many
layers, or sublayers of one kind, the DP skips), the LOI and the granularity. The drafter is
``skipsearch.clasp.ClaspDynamicDrafter``. The ``clasp`` strategy writes this profile beside the static
one it searches (``Strategy.companions``), so ``clasp`` is its search entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from skipsearch.config import Candidate, DraftConfig
from skipsearch.methods import Method, check_keys, choice_param, int_param

SUBLAYERS = ("layer", "attn", "mlp")


def skippable(num_layers: int, protect_ends: bool) -> tuple[int, ...]:
    return tuple(range(1, num_layers - 1)) if protect_ends else tuple(range(num_layers))


@dataclass(frozen=True)
class DynamicParams:
    """``method_params`` of a ``clasp-dynamic`` profile."""

    method: ClassVar[str] = "clasp-dynamic"
    num_skips: int  # M: layers (or sublayers of the chosen kind) the DP skips
    loi: int  # layer-optimization interval: verify steps between DP runs (1 = after every one)
    sublayer: str = "layer"  # granularity: whole layers (the paper), or only attention / only MLP
    protect_ends: bool = True  # never skip the first or the last layer

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> DynamicParams:
        check_keys(cls.method, raw, cls, required=("num_skips", "loi"))
        sublayer = choice_param(cls.method, raw, "sublayer", "layer", SUBLAYERS)
        protect = choice_param(cls.method, raw, "protect_ends", True, (True, False))
        layers = len(skippable(num_layers, protect))
        loi = int_param(cls.method, raw, "loi", low=1, why=" (verify steps)")
        m = int_param(cls.method, raw, "num_skips", low=1, high=layers,
                      why=f" (the skippable layers of a {num_layers}-layer model)")
        return cls(num_skips=m, loi=loi, sublayer=sublayer, protect_ends=protect)

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        return (("num_skips", self.num_skips), ("loi", self.loi), ("sublayer", self.sublayer),
                ("protect_ends", self.protect_ends))


def _drafter(candidate: Candidate, sm):
    from skipsearch.clasp import ClaspDynamicDrafter

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
)
