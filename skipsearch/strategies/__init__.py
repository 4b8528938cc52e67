"""Search strategies: one module each behind ``Strategy``, and this registry.

Adding a strategy means one module and one line in REGISTRY; tests/test_strategies.py then runs
the shared suite against it, and ``skipsearch optimize`` gets a flag for each option it declares
(``Strategy.options``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skipsearch.config import ConfigError, DraftConfig
from skipsearch.space import SearchSpace
from skipsearch.strategies._base import Companion, Option, Plan, Seed, Strategy
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


def spelling(option: str) -> str:
    """How messages name the option ``option`` (a constructor keyword): the flag a registered strategy declares for
    it, else --<name with dashes>."""
    declared = (o.spelling for cls in REGISTRY.values() for o in cls.options if o.name == option)
    return next(declared, "--" + option.replace("_", "-"))


def make_strategy(name: str, space: SearchSpace, *, seed: int = 0,
                  warm_start: Sequence[DraftConfig] = (), **options: Any) -> Strategy:
    """``options`` go to the strategy's constructor: what only some strategies take, such as fractal's
    ``n_values``. Each is checked against the strategy's declaration (``Strategy.options``): one it does not
    declare, or a value of another type or out of bounds, is a one-line ConfigError, never ignored. The strategy
    is made for the one method it proposes for (``Strategy.method_for``)."""
    cls = check_strategy(name)
    declared = {o.name: o for o in cls.options}
    for key, value in options.items():
        if key not in declared:
            raise ConfigError(f"strategy '{name}' does not take {spelling(key)}")
        declared[key].check(name, value)
    return cls(space, method=cls.method_for(options), seed=seed, warm_start=warm_start, **options)


__all__ = ["REGISTRY", "BayesStrategy", "ClaspStrategy", "Companion", "FractalStrategy", "HybridStrategy",
           "NgramStrategy", "Option", "Plan", "PrecisionStrategy", "Seed", "Strategy", "TPEStrategy",
           "check_strategy", "make_strategy", "spelling"]
