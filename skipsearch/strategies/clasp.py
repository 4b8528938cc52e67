"""CLaSp, static (§3.4 on calibration data): sweep the DP's skip sets over M, K and the draft exit.

CLaSp's dynamic program (skipsearch/clasp.py) gives, from one run over many calibration tokens,
the best skip set for every number of skipped layers M, at each granularity (whole layers, only
attention, only MLP). What is left to search is small: the granularity, M, K, γ0 and the exit
mode. Optuna's TPE sweeps those few parameters against the objective; each trial drafts with the
DP's set for its (granularity, M).

The skip sets come in as a ``ClaspPlan``: ``optimize`` computes one from the model and the
calibration prompts (``skipsearch.clasp.static_plan``). Without one (the shared strategy suite,
which has no model), the strategy uses a model-free prior, ``depth_prior_plan``: layers taken from
the middle of the skippable range outward. It is a documented stand-in, not CLaSp.

Seed points (warm start, then the space's probes) are arbitrary configs rather than (granularity,
M) pairs, so they are enqueued with their config in a user attr and no params; TPE models only the
trials it can describe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import optuna

from skipsearch.clasp import ClaspPlan, config_for
from skipsearch.config import DraftConfig, ExitRule
from skipsearch.space import SearchSpace
from skipsearch.strategies._base import SEEDED_ATTR, Strategy

SEED_CONFIG_ATTR = "seed_config"  # trial user attr: this trial evaluates a fixed seed point
_MODES = {"both": ("layer", "attn", "mlp"), "attn": ("attn",), "mlp": ("mlp",)}


def mode_limit(space: SearchSpace, sublayer: str) -> int:
    """The most layers a draft of this granularity may skip in ``space``."""
    per_layer = 2 if sublayer == "layer" else 1  # a whole layer is two of the 2L sublayers
    return min(len(space.skippable_layers()), space.max_skips // per_layer)


def modes(space: SearchSpace) -> tuple[str, ...]:
    return _MODES[space.sublayers]


def depth_prior_plan(space: SearchSpace) -> ClaspPlan:
    """Nested sets without a model: the middle skippable layer first, then outward, alternately
    up and down. A stand-in so the strategy runs where no model is loaded."""
    layers = space.skippable_layers()
    mid = (len(layers) - 1) / 2
    order = sorted(layers, key=lambda i: (abs(layers.index(i) - mid), -i))
    sets = []
    for sub in modes(space):
        sets.append(tuple(tuple(sorted(order[:m])) for m in range(mode_limit(space, sub) + 1)))
    return ClaspPlan(modes(space), tuple(sets), source="depth-prior")


class ClaspStrategy(Strategy):
    name = "clasp"

    def __init__(self, space: SearchSpace, *, seed: int = 0, warm_start: Sequence[DraftConfig] = (),
                 plan: ClaspPlan | None = None, n_startup_trials: int = 4) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        self.plan = plan if plan is not None else depth_prior_plan(space)
        self.modes = tuple(m for m in modes(space) if m in self.plan.sublayers)
        if not self.modes:
            raise ValueError(f"the CLaSp plan has no skip sets for sublayers={space.sublayers}")
        # the DP may reach fewer sets than the space allows (too few layers); never index past them
        self.limits = {m: min(mode_limit(space, m), len(self.plan.sets(m)) - 1) for m in self.modes}
        self.n_startup_trials = n_startup_trials

    def sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=self.n_startup_trials)

    def enqueue_seeds(self, study: optuna.Study, encode: Callable[[DraftConfig], dict[str, Any]]) -> bool:
        if study.user_attrs.get(SEEDED_ATTR):
            return False
        study.set_user_attr(SEEDED_ATTR, True)
        for config in self.seed_points():
            study.enqueue_trial({}, user_attrs={SEED_CONFIG_ATTR: encode(config)})
        return True

    def next_params(self, study: optuna.Study) -> dict[str, Any] | None:
        self.enqueue_seeds(study, _encode)
        return None

    def suggest(self, trial: optuna.Trial) -> DraftConfig:
        fixed = trial.user_attrs.get(SEED_CONFIG_ATTR)
        if fixed is not None:
            return self.space.repair(_decode(fixed))
        sub = trial.suggest_categorical("sublayer", list(self.modes)) if len(self.modes) > 1 else self.modes[0]
        m = trial.suggest_int("m", 1, max(self.limits.values()))
        k = trial.suggest_categorical("k", list(self.space.max_draft_tokens))
        lo, hi, step = self.space.threshold_grid()
        threshold = trial.suggest_float("threshold", lo, hi, step=step) if hi > lo else lo
        adaptive = self.space.adaptive_exit
        if adaptive is None:
            adaptive = trial.suggest_categorical("adaptive", [True, False])
        layers = self.plan.sets(sub)[max(1, min(m, self.limits[sub]))]
        base = DraftConfig(max_draft_tokens=k, exit=ExitRule(threshold=threshold, adaptive=adaptive))
        return self.space.repair(config_for(sub, layers, base))


def _encode(config: DraftConfig) -> dict[str, Any]:
    return {"skip_attn": list(config.skip_attn), "skip_mlp": list(config.skip_mlp),
            "max_draft_tokens": config.max_draft_tokens, "exit": asdict(config.exit)}


def _decode(raw: dict[str, Any]) -> DraftConfig:
    return DraftConfig(skip_attn=tuple(raw["skip_attn"]), skip_mlp=tuple(raw["skip_mlp"]),
                       max_draft_tokens=raw["max_draft_tokens"], exit=ExitRule(**raw["exit"]))
