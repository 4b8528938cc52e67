"""``clasp-dynamic``'s parameters, and the skip-set helpers its DP and the ``clasp`` strategy share (no torch)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from skipsearch.config import DraftConfig
from skipsearch.methods.base import check_keys, choice_param, int_param

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


def config_for(sublayer: str, layers: Sequence[int], base: DraftConfig) -> DraftConfig:
    """``base`` (K, exit rule) drafting with ``layers`` skipped at the given granularity."""
    layers = tuple(layers)
    attn = layers if sublayer in ("layer", "attn") else ()
    mlp = layers if sublayer in ("layer", "mlp") else ()
    return replace(base, skip_attn=attn, skip_mlp=mlp)


def granularity(config: DraftConfig) -> tuple[str, int] | None:
    """(sublayer, M) if ``config`` skips whole layers, only attention or only MLPs; else None."""
    a, m = config.skip_attn, config.skip_mlp
    if a and a == m:
        return "layer", len(a)
    if a and not m:
        return "attn", len(a)
    if m and not a:
        return "mlp", len(m)
    return None
