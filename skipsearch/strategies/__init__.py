"""Search strategies: one module each behind ``Strategy``, and this registry.

Adding a strategy means one module and one line in REGISTRY; tests/test_strategies.py then runs
the shared suite against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skipsearch.config import ConfigError, DraftConfig
from skipsearch.space import SearchSpace
from skipsearch.strategies._base import Strategy
from skipsearch.strategies.bayes import BayesStrategy
from skipsearch.strategies.clasp import ClaspStrategy
from skipsearch.strategies.tpe import TPEStrategy

REGISTRY: dict[str, type[Strategy]] = {
    "tpe": TPEStrategy,
    "bayes": BayesStrategy,
    "clasp": ClaspStrategy,
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
    CLaSp's ``plan`` (its skip sets, computed from the model)."""
    return check_strategy(name)(space, seed=seed, warm_start=warm_start, **options)


__all__ = ["REGISTRY", "BayesStrategy", "ClaspStrategy", "Strategy", "TPEStrategy", "check_strategy", "make_strategy"]
