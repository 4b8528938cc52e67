"""Strategies over a small grid of a method's parameters, on Optuna's GridSampler.

Each grid point is one candidate; the sampler visits the points in a seeded random order, so a
budget smaller than the grid times a random subset, and a resumed or shared study goes on with the
points not yet taken. Its plan's ``max_trials`` is the grid's size: a larger budget has nothing more to try.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

import optuna

from skipsearch.config import Candidate
from skipsearch.search.strategies._base import Plan, Strategy


class _GridSampler(optuna.samplers.GridSampler):
    """GridSampler for ask/tell: the runner stops at the grid's size (``Plan.max_trials``) itself, and
    ``Study.stop``, which GridSampler calls on the last point, works only inside ``study.optimize``."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


class GridStrategy(Strategy):
    warm_starts = False  # a layer-skip profile's skip set says nothing about this method's parameters

    @abstractmethod
    def grid(self) -> dict[str, list[Any]]:
        """Parameter name -> its values (JSON scalars), in a fixed order."""

    @abstractmethod
    def candidate(self, point: dict[str, Any]) -> Candidate:
        """The candidate one grid point means."""

    def plan(self) -> Plan:
        return Plan(max_trials=math.prod(len(values) for values in self.grid().values()))

    def sampler(self) -> optuna.samplers.BaseSampler:
        return _GridSampler(self.grid(), seed=self.seed)

    def suggest(self, trial: optuna.Trial) -> Candidate:
        return self.candidate({name: trial.suggest_categorical(name, values) for name, values in self.grid().items()})
