"""Search strategies: one module each behind ``Strategy``, and this registry.

Adding a strategy means one module and its ``register(...)`` line at the end of this file; tests/test_strategies.py
then runs the shared suite against it, and ``skipsearch optimize`` gets a flag for each option it declares
(``Strategy.options``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skipsearch.config import ConfigError, DraftConfig
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies._base import Companion, Option, Plan, Seed, Strategy

REGISTRY: dict[str, type[Strategy]] = {}  # keyed by each strategy's own ``name``


def register(cls: type[Strategy]) -> type[Strategy]:
    """Add a strategy class under its ``name``, in the order ``skipsearch optimize --help`` lists them."""
    REGISTRY[cls.name] = cls
    return cls


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


def make_strategy(name: str, space: SearchSpace, *, seed: int = 0, warm_start: Sequence[DraftConfig] = (),
                  fixed: Mapping[str, Any] | None = None, **options: Any) -> Strategy:
    """``options`` go to the strategy's constructor: what only some strategies take, such as fractal's
    ``n_values``. Each is checked against the strategy's declaration (``Strategy.options``): one it does not
    declare, or a value of another type or out of bounds, is a one-line ConfigError, never ignored. The strategy
    is made for the one method it proposes for (``Strategy.method_for``). ``fixed`` are options the caller sets from
    the strategy's own declarations (``Strategy.quantized_target``), passed unchecked."""
    cls = check_strategy(name)
    declared = {o.name: o for o in cls.options}
    for key, value in options.items():
        if key not in declared:
            raise ConfigError(f"strategy '{name}' does not take {spelling(key)}")
        declared[key].check(name, value)
    options = {**options, **(fixed or {})}
    return cls(space, method=cls.method_for(options), seed=seed, warm_start=warm_start, **options)


__all__ = ["REGISTRY", "Companion", "Option", "Plan", "Seed", "Strategy", "check_strategy", "make_strategy", "register",
           "spelling"]

# The registry: one line per strategy (its module's class). Each class stays importable from here by its name.
from skipsearch.search.strategies.tpe import TPEStrategy; register(TPEStrategy)  # noqa: E402, E702, I001
from skipsearch.search.strategies.bayes import BayesStrategy; register(BayesStrategy)  # noqa: E402, E702, I001
from skipsearch.search.strategies.clasp import ClaspStrategy; register(ClaspStrategy)  # noqa: E402, E702, I001
from skipsearch.search.strategies.fractal import FractalStrategy; register(FractalStrategy)  # noqa: E402, E702, I001
from skipsearch.search.strategies.ngram import NgramStrategy; register(NgramStrategy)  # noqa: E402, E702, I001
from skipsearch.search.strategies.hybrid import HybridStrategy; register(HybridStrategy)  # noqa: E402, E702, I001
from skipsearch.search.strategies.precision import PrecisionStrategy; register(PrecisionStrategy)  # noqa: E402, E702, I001
