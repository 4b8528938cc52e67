"""``hierarchical``: three depths of one model (M_p verifies M_q, M_q verifies M_s), lossless by composition.

The draft config is M_q's skip sets, with K = m·(n+1) and no exit rule; ``method_params`` give m, n and
M_s's skip sets. The drafter is ``skipsearch.hierarchical.HierarchicalDrafter``. It has no strategy of
its own: ``skipsearch plan`` chooses (m, n) by the planner's closed forms and writes the profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig
from skipsearch.methods import Method, ParamsError, check_keys, layers_param


@dataclass(frozen=True)
class HierarchicalParams:
    method: ClassVar[str] = "hierarchical"
    m: int  # M_q rounds per cycle
    n: int  # M_s drafts per round
    small: DraftConfig  # M_s's skip sets

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> HierarchicalParams:
        from skipsearch.hierarchical import Hierarchy  # its checks (nesting, layer 0) are the method's rules

        check_keys(cls.method, raw, cls, required=("m", "n", "small"))
        small_raw = raw["small"]
        if not isinstance(small_raw, Mapping):
            raise ParamsError("hierarchical: method_params.small must be a mapping with skip_attn and skip_mlp")
        extra = [k for k in small_raw if k not in ("skip_attn", "skip_mlp")]
        if extra:
            raise ParamsError(f"hierarchical: unknown key method_params.small.{extra[0]!s:.40} "
                              f"(known: skip_attn, skip_mlp)")
        small = DraftConfig(skip_attn=layers_param(cls.method, small_raw.get("skip_attn"), "small.skip_attn",
                                                   num_layers),
                            skip_mlp=layers_param(cls.method, small_raw.get("skip_mlp"), "small.skip_mlp", num_layers),
                            max_draft_tokens=0, exit=NO_EXIT)
        if draft.exit.threshold != 0.0 or draft.exit.adaptive:
            raise ParamsError("hierarchical: draft.exit must be {threshold: 0, adaptive: false} (m and n are fixed)")
        try:
            h = Hierarchy(medium=draft, small=small, m=raw["m"], n=raw["n"])
            h.check_layers(num_layers)
        except ConfigError as e:
            raise ParamsError(str(e).replace("draft.", "layer ")) from None
        if draft.max_draft_tokens not in (0, h.max_block):
            raise ParamsError(f"hierarchical: draft.max_draft_tokens must be m·(n+1) = {h.max_block}, the largest "
                              f"block (or 0: plain decoding), got {draft.max_draft_tokens}")
        return cls(m=h.m, n=h.n, small=h.small)

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        return (("m", self.m), ("n", self.n),
                ("small", {"skip_attn": list(self.small.skip_attn), "skip_mlp": list(self.small.skip_mlp)}))


def _drafter(candidate: Candidate, sm):
    from skipsearch.hierarchical import HierarchicalDrafter, Hierarchy

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
)
