"""``hierarchical``'s parameters and the ``Hierarchy`` they describe: three levels, one cycle shape (no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from skipsearch.config import NO_EXIT, ConfigError, DraftConfig, thaw
from skipsearch.methods.base import ParamsError, check_keys, layers_param
from skipsearch.methods.hierarchical.closed_form import check_shape


@dataclass(frozen=True)
class Hierarchy:
    """The three levels: which sublayers M_q and M_s skip, and the cycle's shape (m, n)."""

    medium: DraftConfig  # M_q's skip sets (its K and exit rule are not used)
    small: DraftConfig  # M_s's skip sets
    m: int  # M_q rounds per cycle
    n: int  # M_s drafts per round

    def __post_init__(self) -> None:
        check_shape(self.m, self.n)
        # normalise: only the skip sets matter, so equal hierarchies compare equal
        object.__setattr__(self, "medium", DraftConfig(self.medium.skip_attn, self.medium.skip_mlp, 0, NO_EXIT))
        object.__setattr__(self, "small", DraftConfig(self.small.skip_attn, self.small.skip_mlp, 0, NO_EXIT))
        missing = sorted(set(self.medium.skip_attn) - set(self.small.skip_attn))
        if missing:
            raise ConfigError(
                f"hierarchical: the small draft must skip every attention sublayer the medium draft skips "
                f"(add {missing} to the small draft's skip_attn)"
            )
        if self.n >= 1 and 0 in self.medium.skip_attn:
            raise ConfigError(
                "hierarchical: with n >= 1 the medium draft must keep layer 0's attention (its multi-token "
                "verify sizes the attention mask from layer 0's cache)"
            )

    def check_layers(self, num_layers: int) -> None:
        self.medium.check_layers(num_layers)
        self.small.check_layers(num_layers)

    @property
    def max_block(self) -> int:
        """The most tokens one cycle drafts, m·(n+1): what a profile's draft.max_draft_tokens says."""
        return self.m * (self.n + 1)


@dataclass(frozen=True)
class HierarchicalParams:
    method: ClassVar[str] = "hierarchical"
    m: int  # M_q rounds per cycle
    n: int  # M_s drafts per round
    small: DraftConfig  # M_s's skip sets

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> HierarchicalParams:
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


# -- profiles ------------------------------------------------------------------------------------------
def hierarchy_from_profile(profile) -> Hierarchy:
    """The hierarchy a ``method: hierarchical`` profile holds (its params checked by the method's one path)."""
    raw = {k: thaw(v) for k, v in profile.method_params}  # as Method.parse reads them
    p = HierarchicalParams.parse(raw, draft=profile.draft, num_layers=profile.model.num_layers)
    return Hierarchy(medium=profile.draft, small=p.small, m=p.m, n=p.n)


def hierarchy_to_profile_fields(h: Hierarchy) -> tuple[DraftConfig, tuple[tuple[str, object], ...]]:
    """(draft, method_params) for a profile of ``h``; the inverse of hierarchy_from_profile."""
    draft = replace(h.medium, max_draft_tokens=h.max_block, exit=NO_EXIT)
    return draft, HierarchicalParams(m=h.m, n=h.n, small=h.small).to_pairs()
