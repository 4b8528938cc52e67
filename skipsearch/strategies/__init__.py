"""Search strategies: one module each behind ``Strategy``, and this registry.

Adding a strategy means one module and one line in REGISTRY; tests/test_strategies.py then runs
the shared suite against it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from skipsearch.config import ConfigError, DraftConfig
from skipsearch.space import SearchSpace
from skipsearch.strategies._base import Companion, Plan, Seed, Strategy
from skipsearch.strategies.bayes import BayesStrategy
from skipsearch.strategies.clasp import ClaspStrategy
from skipsearch.strategies.fractal import FractalStrategy
from skipsearch.strategies.hybrid import HybridStrategy
from skipsearch.strategies.ngram import NgramStrategy
from skipsearch.strategies.precision import PrecisionStrategy
from skipsearch.strategies.tpe import TPEStrategy

# One line per strategy, keyed by its own ``name``.
REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (TPEStrategy, BayesStrategy, ClaspStrategy, FractalStrategy, NgramStrategy,
                              HybridStrategy, PrecisionStrategy)
}


def check_strategy(name: str) -> type[Strategy]:
    """The strategy class registered as ``name``; a one-line ConfigError for anything else."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown strategy '{name}': use {', '.join(sorted(REGISTRY))}") from None


def make_strategy(name: str, space: SearchSpace, *, seed: int = 0,
                  warm_start: Sequence[DraftConfig] = (), **options: Any) -> Strategy:
    """``options`` go to the strategy's constructor: what only some strategies take, such as
    fractal's ``n_values``. One the strategy does not take is a one-line ConfigError, never ignored."""
    cls = check_strategy(name)
    taken = inspect.signature(cls.__init__).parameters
    for key in options:
        if key not in taken:
            raise ConfigError(f"strategy '{name}' does not take {key.replace('_', '-')}")
    return cls(space, seed=seed, warm_start=warm_start, **options)


__all__ = ["REGISTRY", "BayesStrategy", "ClaspStrategy", "Companion", "FractalStrategy", "HybridStrategy",
           "NgramStrategy", "Plan", "PrecisionStrategy", "Seed", "Strategy", "TPEStrategy", "check_strategy",
           "make_strategy"]
