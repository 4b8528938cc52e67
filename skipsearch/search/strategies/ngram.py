"""Prompt lookup's three knobs on a grid: the shortest and longest suffix looked up, and K.

The grid is small (at most a few dozen points), and the method's surrogate is exact in acceptance
(the draft depends only on tokens, so replaying the full model's greedy continuation reproduces it),
so the default two-stage search scores every point and times the shortlist.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skipsearch.config import NO_EXIT, Candidate, DraftConfig
from skipsearch.methods import Method
from skipsearch.methods.ngram import METHOD as NGRAM
from skipsearch.methods.ngram import NgramParams
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies._base import Option
from skipsearch.search.strategies._grid import GridStrategy

# the suffix lengths looked up (their bounds are the method's: NgramParams); hybrid's lookup takes the same
N_VALUES = Option("n_values", int, (1, 2, 3, 4), "suffix lengths looked up", many=True, flag="--n")


class NgramStrategy(GridStrategy):
    name = NGRAM.name
    methods = (NGRAM,)
    options = (N_VALUES,)

    def __init__(self, space: SearchSpace, *, method: Method | None = None, seed: int = 0,
                 warm_start: Sequence[DraftConfig] = (), n_values: Sequence[int] = (1, 2, 3, 4)) -> None:
        super().__init__(space, method=method, seed=seed, warm_start=warm_start)
        self.n_values = tuple(sorted(set(n_values)))
        for n in self.n_values:
            NgramParams(min_n=n, max_n=n)  # every value is valid, or fail before anything runs

    def grid(self) -> dict[str, list[Any]]:
        # (min_n, max_n) as one categorical "a-b": GridSampler takes a product, and min_n > max_n is no point
        ranges = [f"{a}-{b}" for a in self.n_values for b in self.n_values if a <= b]
        return {"n_range": ranges, "k": list(self.space.max_draft_tokens)}

    def candidate(self, point: dict[str, Any]) -> Candidate:
        low, high = (int(x) for x in point["n_range"].split("-"))
        return self.propose(DraftConfig(max_draft_tokens=point["k"], exit=NO_EXIT), NgramParams(min_n=low, max_n=high))
