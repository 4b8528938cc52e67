"""CLaSp, static (§3.4 on calibration data): sweep the DP's skip sets over M, K and the draft exit.

CLaSp's dynamic program (skipsearch/methods/clasp_dynamic/dp.py) gives, from one run over many calibration tokens,
the best skip set for every number of skipped layers M, at each granularity (whole layers, only
attention, only MLP). What is left to search is small: the granularity, M, K, γ0 and the exit
mode. Optuna's TPE sweeps those few parameters against the objective; each trial drafts with the
DP's set for its (granularity, M).

The skip sets come in as a ``ClaspSkipSets``: ``optimize`` computes one from the model and the
calibration prompts (``skipsearch.methods.clasp_dynamic.dp.static_skip_sets``). Without one (the shared strategy suite,
which has no model), the strategy uses a model-free prior, ``depth_prior_sets``: layers taken from
the middle of the skippable range outward. It is a documented stand-in, not CLaSp.

Seed points (warm start, then the space's probes) are arbitrary configs rather than (granularity,
M) pairs, so they are enqueued with their config in a user attr and no params; TPE models only the
trials it can describe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import optuna

from skipsearch.config import Candidate, DraftConfig, ExitRule
from skipsearch.methods import Method
from skipsearch.methods.clasp_dynamic import METHOD as CLASP_DYNAMIC
from skipsearch.methods.clasp_dynamic import DynamicParams, config_for, granularity
from skipsearch.methods.clasp_dynamic.dp import ClaspSkipSets, static_skip_sets
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.precision import METHOD as PRECISION
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies._base import Companion, Option, Plan, Seed, Strategy, seed_points, suggest_k_and_exit
from skipsearch.search.strategies.precision import ONE_SCHEME, check_runnable, one_scheme

SEED_CONFIG_ATTR = "seed_config"  # trial user attr: this trial evaluates a fixed seed point
_MODES = {"both": ("layer", "attn", "mlp"), "attn": ("attn",), "mlp": ("mlp",)}


def mode_limit(space: SearchSpace, sublayer: str) -> int:
    """The most layers a draft of this granularity may skip in ``space``."""
    per_layer = 2 if sublayer == "layer" else 1  # a whole layer is two of the 2L sublayers
    return min(len(space.skippable_layers()), space.max_skips // per_layer)


def modes(space: SearchSpace) -> tuple[str, ...]:
    return _MODES[space.sublayers]


def depth_prior_sets(space: SearchSpace) -> ClaspSkipSets:
    """Nested sets without a model: the middle skippable layer first, then outward, alternately
    up and down. A stand-in so the strategy runs where no model is loaded."""
    layers = space.skippable_layers()
    mid = (len(layers) - 1) / 2
    order = sorted(layers, key=lambda i: (abs(layers.index(i) - mid), -i))
    sets = []
    for sub in modes(space):
        sets.append(tuple(tuple(sorted(order[:m])) for m in range(mode_limit(space, sub) + 1)))
    return ClaspSkipSets(modes(space), tuple(sets), source="depth-prior")


class ClaspStrategy(Strategy):
    name = "clasp"
    methods = (LAYER_SKIP, PRECISION)  # precision drafts with ``schemes``
    options = (
        Option("skip_sets", ClaspSkipSets, None, "the DP's skip sets, computed beforehand (None: in prepare, from "
               "the model; before it, a depth prior)"),
        Option("n_startup_trials", int, 4, "random trials before TPE models the study", low=0),
        Option("loi", int, 8, "the LOI (verify steps between DP runs) of the <out>-dynamic.yaml profile it also "
               "writes", low=1, flag="--clasp-loi"),
        Option("tokens_per_sequence", int, 16, "calibration tokens per prompt the static DP averages", low=1),
        ONE_SCHEME,
    )

    def __init__(self, space: SearchSpace, *, method: Method | None = None, seed: int = 0,
                 warm_start: Sequence[DraftConfig] = (), skip_sets: ClaspSkipSets | None = None,
                 n_startup_trials: int = 4, loi: int = 8, tokens_per_sequence: int = 16,
                 schemes: Sequence[str] = ()) -> None:
        super().__init__(space, method=method, seed=seed, warm_start=warm_start)
        # --schemes: CLaSp's skip sets with every kept sublayer quantized (a precision draft: ``method_for``)
        self.precision = one_scheme(self.name, schemes)
        self.loi = loi  # of the clasp-dynamic companion profile: verify steps between its DP runs
        self.tokens_per_sequence = tokens_per_sequence  # calibration tokens per prompt the static DP averages
        self._use_sets(skip_sets if skip_sets is not None else depth_prior_sets(space))
        self.n_startup_trials = n_startup_trials

    def _use_sets(self, skip_sets: ClaspSkipSets) -> None:
        space = self.space
        self.skip_sets = skip_sets
        self.modes = tuple(m for m in modes(space) if m in self.skip_sets.sublayers)
        if not self.modes:
            raise ValueError(f"the CLaSp skip sets have none for sublayers={space.sublayers}")
        # the DP may reach fewer sets than the space allows (too few layers); never index past them
        self.limits = {m: min(mode_limit(space, m), len(self.skip_sets.sets(m)) - 1) for m in self.modes}

    def prepare(self, sm, calibration, *, say) -> None:
        """CLaSp's DP on the calibration tokens: the best skip set for every M, at each granularity."""
        if self.precision is not None:
            check_runnable((self.precision.scheme,), sm.device)
        say(f"CLaSp: dynamic programming over {self.tokens_per_sequence} tokens of each calibration prompt")
        self._use_sets(static_skip_sets(
            sm, calibration.prompts, calibration.continuations, allowed=self.space.skippable_layers(),
            limits={m: mode_limit(self.space, m) for m in modes(self.space)},
            tokens_per_sequence=self.tokens_per_sequence))

    def companions(self, shipped, tried):
        """The ``clasp-dynamic`` profile: M and the granularity of the best candidate that skips whole
        layers, only attention or only MLPs (the shipped one first); it also gives the starting skip set,
        K and the exit rule. Its LOI is this strategy's, not searched; the profile says so."""
        drafts = [shipped.draft, *(c.draft for c in tried)]  # shipped: the shipped profile's candidate
        chosen = next((d for d in drafts if not d.is_autoregressive and granularity(d)), None)
        if chosen is None:  # nothing pure was tried: the DP's first granularity, a quarter of its reach
            sub = self.skip_sets.sublayers[0]
            sets = self.skip_sets.sets(sub)
            chosen = config_for(sub, sets[max(1, (len(sets) - 1) // 4)],
                                DraftConfig(max_draft_tokens=2, exit=ExitRule(threshold=0.5)))
        sub, m = granularity(chosen)
        params = DynamicParams(num_skips=m, loi=self.loi, sublayer=sub, protect_ends=self.space.protect_ends)
        notes = (f"dynamic CLaSp: the DP re-plans {m} skipped {'layers' if sub == 'layer' else sub + ' sublayers'} "
                 f"every {self.loi} verify steps, starting from the static set; not timed by optimize")
        return (Companion("-dynamic", CLASP_DYNAMIC.candidate(chosen, params), notes),)

    def sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=self.n_startup_trials)

    def plan(self) -> Plan:
        # The seeds' skip sets are no point of this strategy's (sublayer, m) parameters: each rides in a user
        # attr of an empty enqueued trial, which ``suggest`` decodes.
        return Plan(seeds=tuple(Seed(config, {}, {SEED_CONFIG_ATTR: _encode(config)})
                                for config in seed_points(self.space, self.warm_start)))

    def suggest(self, trial: optuna.Trial) -> Candidate:
        fixed = trial.user_attrs.get(SEED_CONFIG_ATTR)
        if fixed is not None:
            return self.propose(self.space.repair(_decode(fixed)), self.precision)
        sub = trial.suggest_categorical("sublayer", list(self.modes)) if len(self.modes) > 1 else self.modes[0]
        m = trial.suggest_int("m", 1, max(self.limits.values()))
        k, threshold, adaptive = suggest_k_and_exit(trial, self.space)
        layers = self.skip_sets.sets(sub)[max(1, min(m, self.limits[sub]))]
        base = DraftConfig(max_draft_tokens=k, exit=ExitRule(threshold=threshold, adaptive=adaptive))
        return self.propose(self.space.repair(config_for(sub, layers, base)), self.precision)


def _encode(config: DraftConfig) -> dict[str, Any]:
    return {"skip_attn": list(config.skip_attn), "skip_mlp": list(config.skip_mlp),
            "max_draft_tokens": config.max_draft_tokens, "exit": asdict(config.exit)}


def _decode(raw: dict[str, Any]) -> DraftConfig:
    return DraftConfig(skip_attn=tuple(raw["skip_attn"]), skip_mlp=tuple(raw["skip_mlp"]),
                       max_draft_tokens=raw["max_draft_tokens"], exit=ExitRule(**raw["exit"]))
