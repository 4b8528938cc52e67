"""Draft&Verify's search (§3.3): Bayesian optimisation with a Gaussian process over relaxed bits.

Every skippable sublayer is a continuous ``x`` in [0, 1] that means "skip" above 0.5; K and the
exit mode are encoded the same way, γ0 is its own range. The GP and its fitting come from the
``bayesian-optimization`` package. Its own ``suggest()`` is not used: it maximises the acquisition
with L-BFGS-B from 10 starts over all 2L+3 dimensions (about 12 s per proposal at L = 40 on a CPU),
from points drawn uniformly in the box, which in 80 dimensions never come near the good corners.
Instead the acquisition (expected improvement, from the GP's mean and std) is maximised over
uniform points plus bit flips of the best configs seen so far, a trust region as in TuRBO.

Nothing is kept between proposals: the optimiser is rebuilt from every completed trial in the
study, so a search resumes, and several workers share one model of the objective. It proposes as an
Optuna sampler does (``GPSampler.sample_relative``): every dimension of a trial at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import optuna

from skipsearch.config import Candidate, DraftConfig
from skipsearch.methods import Method
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.precision import METHOD as PRECISION
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies._base import Option, Plan, Seed, Strategy, bits, seed_points
from skipsearch.search.strategies.precision import ONE_SCHEME, check_runnable, one_scheme

_SKIP, _KEEP = 0.75, 0.25  # how a seed point's bits are encoded: clear of the 0.5 boundary
_STATES = optuna.trial.TrialState


class BayesStrategy(Strategy):
    name = "bayes"
    methods = (LAYER_SKIP, PRECISION)  # precision drafts with ``schemes``
    options = (
        Option("xi", float, 0.01, "expected improvement over the best value + xi: larger explores more", low=0),
        Option("n_uniform", int, 64, "candidates per proposal drawn uniformly in the box", low=1),
        Option("n_local", int, 48, "candidates per parent, a few bits of a good config flipped", low=0),
        Option("n_parents", int, 4, "the best configs seen, which local candidates start from", low=1),
        Option("gp_restarts", int, 0, "restarts of the GP's hyperparameter fit", low=0),
        ONE_SCHEME,
    )

    def __init__(self, space: SearchSpace, *, method: Method | None = None, seed: int = 0,
                 warm_start: Sequence[DraftConfig] = (), xi: float = 0.01, n_uniform: int = 64, n_local: int = 48,
                 n_parents: int = 4, gp_restarts: int = 0, schemes: Sequence[str] = ()) -> None:
        super().__init__(space, method=method, seed=seed, warm_start=warm_start)
        # --schemes: the same skip-bit search, every kept sublayer quantized (a precision draft: ``method_for``)
        self.precision = one_scheme(self.name, schemes)
        self.xi = xi  # expected improvement over the best value + xi: larger explores more
        self.n_uniform = n_uniform  # candidates drawn uniformly in the box
        self.n_local = n_local  # candidates per parent: a few bits of a good config flipped
        self.n_parents = n_parents  # the best configs seen, which local candidates start from
        # bayes_opt restarts the GP's hyperparameter fit 5 times; its kernel has one length scale,
        # which one L-BFGS-B run from the default finds as well.
        self.gp_restarts = gp_restarts
        lo, hi = space.thresholds
        self.bounds: dict[str, tuple[float, float]] = {f"x_{sub}_{i}": (0.0, 1.0) for sub, i in self.slots}
        self.bounds["x_k"] = (0.0, 1.0)
        if hi > lo:
            self.bounds["threshold"] = (lo, hi)
        if space.adaptive_exit is None:
            self.bounds["x_adaptive"] = (0.0, 1.0)

    # -- the encoding ------------------------------------------------------------------------------

    def encode(self, config: DraftConfig) -> dict[str, float]:
        skipped = {("attn", i) for i in config.skip_attn} | {("mlp", i) for i in config.skip_mlp}
        params = {f"x_{sub}_{i}": _SKIP if (sub, i) in skipped else _KEEP for sub, i in self.slots}
        choices = self.space.max_draft_tokens
        params["x_k"] = (choices.index(config.max_draft_tokens) + 0.5) / len(choices)  # the middle of its bin
        if "threshold" in self.bounds:
            params["threshold"] = config.exit.threshold
        if "x_adaptive" in self.bounds:
            params["x_adaptive"] = _SKIP if config.exit.adaptive else _KEEP
        return params

    def decode(self, params: dict[str, float]) -> DraftConfig:
        attn, mlp = bits(self.space, lambda sub, i: params[f"x_{sub}_{i}"] > 0.5)
        choices = self.space.max_draft_tokens
        k = choices[min(int(params["x_k"] * len(choices)), len(choices) - 1)]
        threshold = self.space.snap_threshold(params.get("threshold", self.space.thresholds[0]))
        adaptive = self.space.adaptive_exit
        if adaptive is None:
            adaptive = params["x_adaptive"] > 0.5
        return self.space.repair(self.space.config_from_bits(attn, mlp, k, threshold, adaptive))

    # -- the Strategy interface ---------------------------------------------------------------------

    def sampler(self) -> optuna.samplers.BaseSampler:
        return GPSampler(self)

    def plan(self) -> Plan:
        return Plan(seeds=tuple(Seed(config, self.encode(config))
                                for config in seed_points(self.space, self.warm_start)))

    def prepare(self, sm, calibration, *, say) -> None:
        if self.precision is not None:
            check_runnable((self.precision.scheme,), sm.device)

    def suggest(self, trial: optuna.Trial) -> Candidate:
        params = {name: trial.suggest_float(name, lo, hi) for name, (lo, hi) in self.bounds.items()}
        return self.propose(self.decode(params), self.precision)

    # -- the proposal ------------------------------------------------------------------------------

    def proposal(self, study: optuna.Study, number: int) -> dict[str, float]:
        """Every dimension of trial ``number`` (not enqueued: seeds go first), from a GP fitted to every
        completed trial of the study."""
        trials = study.get_trials(deepcopy=False)
        names = list(self.bounds)
        ours = [t for t in trials if set(names) <= t.params.keys()]
        done = [t for t in ours if t.state == _STATES.COMPLETE]
        # Seeded by the trial's number, the history before it (and, in a shared study, the worker): a given
        # history and worker always give the same proposal.
        rng = np.random.default_rng([self.seed, number, self.worker])
        if not done:
            return self._as_params(self._uniform(rng, 1)[0])
        # 1. the GP, fitted to every completed trial (a point seen twice counts once, at its mean)
        observed: dict[tuple[float, ...], list[float]] = {}
        for t in done:
            observed.setdefault(tuple(t.params[n] for n in names), []).append(float(t.value))
        from bayes_opt import BayesianOptimization  # here, not at import: scikit-learn's 1-2 s, which every command
        from threadpoolctl import threadpool_limits  # paid (the CLI imports the registry), only where a GP is fitted

        bo = BayesianOptimization(f=None, pbounds=self.bounds, random_state=self.seed, verbose=0)
        bo.set_gp_params(n_restarts_optimizer=self.gp_restarts)
        for x, ys in observed.items():
            bo.space.register(np.array(x), float(np.mean(ys)))  # bo.register would log, in O(n) per call
        # 2. candidates: uniform in the box, and a few bits of the best configs flipped
        X = np.vstack([self._uniform(rng, self.n_uniform), self._local(done, rng)])  # [n, dims]
        with threadpool_limits(limits=1):  # a GP this small is slower on many BLAS threads than on one
            mean, std = bo.predict([dict(zip(names, row, strict=True)) for row in X], return_std=True)
        ei = _expected_improvement(mean, std, max(max(ys) for ys in observed.values()) + self.xi)
        # 3. the best candidate whose config is neither evaluated nor being evaluated by another worker
        taken = {self.decode(t.params) for t in ours if t.state in (_STATES.COMPLETE, _STATES.RUNNING)}
        order = np.argsort(-ei, kind="stable")
        for j in order:
            params = self._as_params(X[j])
            if self.decode(params) not in taken:
                return params
        return self._as_params(X[order[0]])

    # -- candidates ------------------------------------------------------------------------------

    def _as_params(self, row: np.ndarray) -> dict[str, float]:
        return {name: float(v) for name, v in zip(self.bounds, row, strict=True)}

    def _uniform(self, rng: np.random.Generator, n: int) -> np.ndarray:
        lows, highs = (np.array([b[j] for b in self.bounds.values()]) for j in (0, 1))
        return lows + rng.random((n, len(self.bounds))) * (highs - lows)  # [n, dims]

    def _local(self, done: list[optuna.trial.FrozenTrial], rng: np.random.Generator) -> np.ndarray:
        names = list(self.bounds)
        n_bits = len(self.slots)  # the bits come first in self.bounds, K, γ0 and the exit mode after
        lows, highs = (np.array([b[j] for b in self.bounds.values()]) for j in (0, 1))
        parents = sorted(done, key=lambda t: (-t.value, t.number))[: self.n_parents]
        out = []
        for parent in parents:
            base = np.array([parent.params[n] for n in names])
            points = np.repeat(base[None, :], self.n_local, axis=0)  # [n_local, dims]
            for point in points:
                flips = rng.choice(n_bits, size=min(int(rng.integers(1, 4)), n_bits), replace=False)
                point[flips] = np.where(point[flips] > 0.5, _KEEP, _SKIP)
            # K, γ0 and the exit mode move now and then.
            move = rng.random(points[:, n_bits:].shape) < 0.25  # [n_local, dims - n_bits]
            fresh = lows[n_bits:] + rng.random(move.shape) * (highs[n_bits:] - lows[n_bits:])
            points[:, n_bits:] = np.where(move, fresh, points[:, n_bits:])
            out.append(points)
        return np.vstack(out)


class GPSampler(optuna.samplers.BaseSampler):
    """The strategy's proposal as Optuna's sampler interface: the bounds are the relative search space, and a
    trial's every dimension comes from ``BayesStrategy.proposal``; a parameter outside them (none the strategy
    asks for) is drawn at random."""

    def __init__(self, strategy: BayesStrategy) -> None:
        self.strategy = strategy
        self.random = optuna.samplers.RandomSampler(seed=strategy.seed)

    def infer_relative_search_space(self, study, trial) -> dict[str, optuna.distributions.BaseDistribution]:
        return {name: optuna.distributions.FloatDistribution(lo, hi) for name, (lo, hi) in self.strategy.bounds.items()}

    def sample_relative(self, study, trial, search_space) -> dict[str, float]:
        return self.strategy.proposal(study, trial.number) if search_space else {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.random.sample_independent(study, trial, param_name, param_distribution)

    def reseed_rng(self) -> None:
        self.random.reseed_rng()


def _expected_improvement(mean: np.ndarray, std: np.ndarray, target: float) -> np.ndarray:
    from scipy.stats import norm

    std = np.maximum(std, 1e-12)
    z = (mean - target) / std
    return (mean - target) * norm.cdf(z) + std * norm.pdf(z)
