"""Tree-structured Parzen estimator over the skip bits, K and the exit threshold (Optuna's TPE).

Each skippable sublayer is a categorical 0/1 parameter, so TPE models every bit separately:
cheap, and good at the "this MLP must stay" kind of structure a skip search has.

With ``schemes`` (``--schemes fp16``) it searches precision drafts jointly instead: each sublayer's
parameter takes three values, 0 quantized in the scheme, 1 skipped, 2 kept at full precision, and the
scheme (when there are several) and whether the LM head runs quantized are parameters too.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import optuna

from skipsearch.config import NO_EXIT, Candidate, DraftConfig
from skipsearch.methods import Method
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.precision import METHOD as PRECISION
from skipsearch.methods.precision import SCHEMES, PrecisionParams
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies._base import Option, Plan, Seed, Strategy, bits, seed_points, suggest_k_and_exit
from skipsearch.search.strategies.precision import check_runnable


class TPEStrategy(Strategy):
    name = "tpe"
    methods = (LAYER_SKIP, PRECISION)  # precision drafts (skip / quantized / full per sublayer) with ``schemes``
    options = (
        Option("n_startup_trials", int, 0, "random trials before TPE models the study", low=0),
        Option("prior_weight", float, 0.1, "weight of TPE's prior against the good trials", low=0),
        Option("schemes", str, (), "search precision drafts jointly: each sublayer skipped, kept or quantized in "
               "one of these weight formats", many=True, choices=tuple(SCHEMES), method=PRECISION),
    )

    def __init__(self, space: SearchSpace, *, method: Method | None = None, seed: int = 0,
                 warm_start: Sequence[DraftConfig] = (), n_startup_trials: int = 0, prior_weight: float = 0.1,
                 schemes: Sequence[str] = ()) -> None:
        super().__init__(space, method=method, seed=seed, warm_start=warm_start)
        self.schemes = tuple(dict.fromkeys(schemes))  # given: precision candidates (``method_for``)
        for scheme in self.schemes:
            PrecisionParams(scheme=scheme)  # every value is valid, or fail before anything runs
        # Random startup trials skip about half of all sublayers, which no model survives; the
        # seed points (probes and warm start) are the startup instead.
        self.n_startup_trials = n_startup_trials
        # Optuna's default prior (1.0) draws each of the 2L bits half from a coin flip: at L = 30,
        # about 4 MLPs skipped at random per proposal, each enough to sink the acceptance rate.
        # With 0.1 the good trials decide. (Measured on tests' fake objective: 30 trials at L = 40
        # never beat the probes with 1.0; with 0.1 they gain 0.05-0.15.)
        self.prior_weight = prior_weight

    def sampler(self) -> optuna.samplers.BaseSampler:
        # constant_liar: trials other workers are still running count as bad, so that parallel
        # workers spread out instead of proposing the same region (no effect with one worker).
        kwargs = {"seed": self.seed, "n_startup_trials": self.n_startup_trials, "constant_liar": True}
        with warnings.catch_warnings():
            # Deprecated in Optuna 4.9 and to be removed in 6.0, with no replacement yet.
            warnings.simplefilter("ignore", FutureWarning)
            try:
                return optuna.samplers.TPESampler(**kwargs, prior_weight=self.prior_weight)
            except TypeError:  # an Optuna that no longer has it: its default prior
                return optuna.samplers.TPESampler(**kwargs)

    def prepare(self, sm, calibration, *, say) -> None:
        check_runnable(self.schemes, sm.device)

    def plan(self) -> Plan:
        """The seed points (warm start, then the probes), each as its skip bits, K and exit rule."""
        points = seed_points(self.space, self.warm_start)
        if self.schemes:  # first, the whole model quantized: a reduced-precision copy agrees nearly always
            whole = self.space.repair(DraftConfig(max_draft_tokens=6, exit=NO_EXIT))
            points = [whole, *(p for p in points if p != whole)]
        return Plan(seeds=tuple(Seed(config, self.encode(config)) for config in points))

    def encode(self, config: DraftConfig) -> dict[str, Any]:
        skipped = {("attn", i) for i in config.skip_attn} | {("mlp", i) for i in config.skip_mlp}
        params: dict[str, Any] = {f"{sub}_{i}": int((sub, i) in skipped) for sub, i in self.slots}
        params["k"] = config.max_draft_tokens
        lo, hi, _ = self.space.threshold_grid()
        if hi > lo:
            params["threshold"] = self.space.snap_threshold(config.exit.threshold)
        if self.space.adaptive_exit is None:
            params["adaptive"] = config.exit.adaptive
        return params

    def suggest(self, trial: optuna.Trial) -> Candidate:
        if self.schemes:
            return self._suggest_precision(trial)
        attn, mlp = bits(self.space, lambda sub, i: trial.suggest_categorical(f"{sub}_{i}", [0, 1]))
        k, threshold, adaptive = suggest_k_and_exit(trial, self.space)
        # TPE knows nothing of the skip budget; it learns from the params it chose, and the
        # trial records the repaired config that was actually evaluated.
        return self.propose(self.space.repair(self.space.config_from_bits(attn, mlp, k, threshold, adaptive)))

    def _suggest_precision(self, trial: optuna.Trial) -> Candidate:
        # 0 quantized, 1 skipped, 2 full: the seed points' 0/1 encoding means "quantized or skipped"
        roles = {slot: trial.suggest_categorical(f"{slot[0]}_{slot[1]}", [0, 1, 2]) for slot in self.slots}
        attn, mlp = bits(self.space, lambda sub, i: roles[(sub, i)] == 1)
        k, threshold, adaptive = suggest_k_and_exit(trial, self.space)
        scheme = trial.suggest_categorical("scheme", list(self.schemes)) if len(self.schemes) > 1 else self.schemes[0]
        quant_head = trial.suggest_categorical("quant_head", [True, False])
        config = self.space.repair(self.space.config_from_bits(attn, mlp, k, threshold, adaptive))
        full = {sub: tuple(i for (s, i), role in roles.items() if s == sub and role == 2) for sub in ("attn", "mlp")}
        params = PrecisionParams(scheme=scheme, quant_head=quant_head,
                                 full_attn=tuple(i for i in full["attn"] if i not in config.skip_attn),
                                 full_mlp=tuple(i for i in full["mlp"] if i not in config.skip_mlp))
        return self.propose(config, params)
