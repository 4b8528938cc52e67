"""The search space for layer-skip drafts, derived from the model's depth and nothing else.

Draft&Verify (§3.3) searches z ∈ {0, 1}^{2L}: one bit per attention and per MLP sublayer. Here a
space also fixes which layers may be skipped at all, how much may be skipped, and the choices for
K and the draft-exit threshold. Strategies propose inside it; ``repair`` maps anything back into it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from skipsearch.config import ConfigError, DraftConfig, ExitRule

Sublayers = Literal["both", "attn", "mlp"]
_SUBLAYERS = ("both", "attn", "mlp")


@dataclass(frozen=True)
class SearchSpace:
    num_layers: int  # L, from the model: every index and every probe point is derived from it
    max_draft_tokens: tuple[int, ...] = (1, 2, 3, 4, 6, 8)  # the choices for K
    thresholds: tuple[float, float] = (0.0, 0.9)  # range for the exit threshold γ0
    adaptive_exit: bool | None = None  # None: searched; True/False: fixed
    protect_ends: bool = True  # never skip layer 0 or L-1: they map embeddings in and logits out
    max_skip_ratio: float = 0.5  # most skipped sublayers, as a fraction of the 2L
    sublayers: Sublayers = "both"  # which kind of sublayer may be skipped
    threshold_step: float = 0.05  # γ0 is searched on this grid: finer steps only defeat the duplicate cache

    def __post_init__(self) -> None:
        L = self.num_layers
        if isinstance(L, bool) or not isinstance(L, int) or L < 1:
            raise ConfigError(f"num_layers must be an integer >= 1, got {L!r}")
        ks = tuple(self.max_draft_tokens) if isinstance(self.max_draft_tokens, (list, tuple)) else ()
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
            raise ConfigError(f"max_draft_tokens choices must be integers >= 1, got {self.max_draft_tokens!r}")
        object.__setattr__(self, "max_draft_tokens", tuple(sorted(set(ks))))
        t = self.thresholds
        if not (isinstance(t, (list, tuple)) and len(t) == 2 and all(_real(v) for v in t) and 0 <= t[0] <= t[1] <= 1):
            raise ConfigError(f"thresholds must be (low, high) with 0 <= low <= high <= 1, got {t!r}")
        object.__setattr__(self, "thresholds", (float(t[0]), float(t[1])))
        if self.adaptive_exit not in (None, True, False):
            raise ConfigError(f"adaptive_exit must be true, false or unset, got {self.adaptive_exit!r}")
        if not (_real(self.max_skip_ratio) and 0.0 < self.max_skip_ratio <= 1.0):
            raise ConfigError(f"max_skip_ratio must be in (0, 1], got {self.max_skip_ratio!r}")
        if self.sublayers not in _SUBLAYERS:
            raise ConfigError(f"sublayers must be one of {', '.join(_SUBLAYERS)}, got {self.sublayers!r}")
        if not (_real(self.threshold_step) and self.threshold_step > 0):
            raise ConfigError(f"threshold_step must be > 0, got {self.threshold_step!r}")
        if self.protect_ends not in (True, False):
            raise ConfigError(f"protect_ends must be true or false, got {self.protect_ends!r}")
        if not self.skippable_layers():
            raise ConfigError(f"a {L}-layer model has no layer to skip when its first and last are protected")
        if self.max_skips < 1:
            raise ConfigError(f"max_skip_ratio {self.max_skip_ratio} allows no skipped sublayer of {2 * L}")

    # -- what may be skipped --------------------------------------------------------------------

    def skippable_layers(self) -> tuple[int, ...]:
        first, last = (1, self.num_layers - 1) if self.protect_ends else (0, self.num_layers)
        return tuple(range(first, last))

    @property
    def skips_attn(self) -> bool:
        return self.sublayers in ("both", "attn")

    @property
    def skips_mlp(self) -> bool:
        return self.sublayers in ("both", "mlp")

    @property
    def max_skips(self) -> int:
        # A little slack so that a ratio such as 0.5 of 2L is not lost to float rounding.
        return math.floor(self.max_skip_ratio * 2 * self.num_layers + 1e-9)

    def threshold_grid(self) -> tuple[float, float, float]:
        """(low, high, step) such that (high - low) is a whole number of steps (Optuna's ``step``)."""
        lo, hi = self.thresholds
        n = math.floor((hi - lo) / self.threshold_step + 1e-9)
        return lo, round(lo + n * self.threshold_step, 10), self.threshold_step

    def snap_threshold(self, threshold: float) -> float:
        """The nearest γ0 on the grid."""
        lo, hi, step = self.threshold_grid()
        return round(min(max(lo + round((threshold - lo) / step) * step, lo), hi), 10)

    # -- building and checking configs ----------------------------------------------------------

    def config_from_bits(self, attn_bits: Sequence[bool], mlp_bits: Sequence[bool], k: int, threshold: float,
                         adaptive: bool) -> DraftConfig:
        """A config from one bit per layer (index i = layer i). Bits for layers or sublayers the
        space does not allow are ignored, so every strategy gets protect_ends and sublayers for free."""
        for name, bits in (("attn_bits", attn_bits), ("mlp_bits", mlp_bits)):
            if len(bits) != self.num_layers:
                raise ConfigError(f"{name} must have one bit per layer ({self.num_layers}), got {len(bits)}")
        allowed = self.skippable_layers()
        attn = [i for i in allowed if attn_bits[i]] if self.skips_attn else []
        mlp = [i for i in allowed if mlp_bits[i]] if self.skips_mlp else []
        return DraftConfig(skip_attn=attn, skip_mlp=mlp, max_draft_tokens=int(k),
                           exit=ExitRule(threshold=float(threshold), adaptive=bool(adaptive)))

    def feasible(self, config: DraftConfig) -> bool:
        """Whether the config skips no more than max_skip_ratio of the 2L sublayers."""
        return len(config.skip_attn) + len(config.skip_mlp) <= self.max_skips

    def contains(self, config: DraftConfig) -> bool:
        """Whether a strategy may propose this config: every rule of the space holds."""
        allowed = set(self.skippable_layers())
        return (set(config.skip_attn) <= (allowed if self.skips_attn else set())
                and set(config.skip_mlp) <= (allowed if self.skips_mlp else set())
                and config.max_draft_tokens in self.max_draft_tokens
                and abs(config.exit.threshold - self.snap_threshold(config.exit.threshold)) < 1e-9
                and (self.adaptive_exit is None or config.exit.adaptive == self.adaptive_exit)
                and self.feasible(config))

    def repair(self, config: DraftConfig) -> DraftConfig:
        """The nearest config the space contains, found deterministically.

        Skips the space does not allow are dropped, K goes to the nearest choice (the smaller on a
        tie), γ0 goes to the nearest point of its grid and a fixed exit mode is imposed. Then, while too much is
        skipped, skips are dropped from the highest layer down (the MLP before the attention of
        the same layer): late layers are the ones left in probes that skip "the upper half".
        """
        allowed = set(self.skippable_layers())
        attn = [i for i in config.skip_attn if i in allowed] if self.skips_attn else []
        mlp = [i for i in config.skip_mlp if i in allowed] if self.skips_mlp else []
        # Sorted so the last entry is dropped first: highest layer, then mlp (1) before attn (0).
        skips = sorted([(i, 0) for i in attn] + [(i, 1) for i in mlp])
        del skips[self.max_skips:]
        k = min(self.max_draft_tokens, key=lambda c: (abs(c - config.max_draft_tokens), c))
        adaptive = config.exit.adaptive if self.adaptive_exit is None else self.adaptive_exit
        exit_rule = replace(config.exit, threshold=self.snap_threshold(config.exit.threshold), adaptive=adaptive)
        return DraftConfig(skip_attn=[i for i, s in skips if s == 0], skip_mlp=[i for i, s in skips if s == 1],
                           max_draft_tokens=k, exit=exit_rule)

    # -- seeds -----------------------------------------------------------------------------------

    def probe_configs(self) -> list[DraftConfig]:
        """A handful of seed points derived from L, all contained in the space.

        Draft&Verify seeded its search with hand-picked points for a 40-layer model; these are the
        same ideas scaled to any depth: attention in every 2nd/3rd/4th layer of the upper half
        (late attention is the most redundant), MLPs in a few late-middle layers, and a mix. K is
        small because on a CPU a draft step costs nearly as much as a full one, so short drafts win.
        """
        L, allowed = self.num_layers, set(self.skippable_layers())
        upper = [i for i in range(L // 2, L) if i in allowed]
        late_middle = [i for i in range(round(0.6 * L), round(0.75 * L) + 1) if i in allowed][: max(1, L // 10)]
        threshold = self.snap_threshold(0.5)  # an exit at γ0 = 0.5 stops when the draft is unsure
        adaptive = True if self.adaptive_exit is None else self.adaptive_exit
        patterns = [  # (attention layers, MLP layers, K)
            (upper[::2], [], 2),
            (upper[::3], [], 3),
            (upper[::4], [], 1),
            ([], late_middle, 2),
            (upper[::2], late_middle[:1], 3),
            ([sorted(allowed)[len(allowed) // 2]], [], 1),  # one middle layer: the smallest possible step
        ]
        out: list[DraftConfig] = []
        for attn, mlp, k in patterns:
            # A space that allows one kind of sublayer only gets the pattern on that kind.
            if not self.skips_attn:
                attn, mlp = [], sorted(set(attn) | set(mlp))
            elif not self.skips_mlp:
                attn, mlp = sorted(set(attn) | set(mlp)), []
            draft = DraftConfig(skip_attn=attn, skip_mlp=mlp, max_draft_tokens=k,
                                exit=ExitRule(threshold=threshold, adaptive=adaptive))
            draft = self.repair(draft)
            if (draft.skip_attn or draft.skip_mlp) and draft not in out:
                out.append(draft)
        return out


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
