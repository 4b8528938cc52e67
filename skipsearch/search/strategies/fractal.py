"""FractalLLM's (n, w) grid (the paper's Figure 2), every point timed: the method has no surrogate to rank them.

``--n`` and ``--w`` give the values; the fractal layers sit at evenly spaced depths (gap L/n), and
the draft length is the paper's w + n + 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skipsearch.config import NO_EXIT, Candidate, DraftConfig
from skipsearch.methods import Method
from skipsearch.methods.fractal import METHOD as FRACTAL
from skipsearch.methods.fractal import SCHEMES, FractalParams
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies._base import Option
from skipsearch.search.strategies._grid import GridStrategy


class FractalStrategy(GridStrategy):
    name = FRACTAL.name
    methods = (FRACTAL,)
    # The values' bounds are the method's (FractalParams), checked per grid point below for this model's depth.
    options = (
        Option("n_values", int, None, "fractal layer counts, e.g. 3,5,7 (default: 3,5,7 as far as the model is "
               "deep)", many=True, flag="--n"),
        Option("w_values", int, (3, 5, 7), "draft windows to try", many=True, flag="--w"),
        Option("quantization", str, "auto", "the fractal layers' weight format", choices=("auto", *SCHEMES)),
    )

    def __init__(self, space: SearchSpace, *, method: Method | None = None, seed: int = 0,
                 warm_start: Sequence[DraftConfig] = (), n_values: Sequence[int] | None = None,
                 w_values: Sequence[int] = (3, 5, 7), quantization: str = "auto") -> None:
        super().__init__(space, method=method, seed=seed, warm_start=warm_start)
        if n_values is None:  # the paper's grid, as far as the model is deep
            n_values = tuple(n for n in (3, 5, 7) if n <= space.num_layers) or (space.num_layers,)
        self.n_values, self.w_values, self.quantization = tuple(n_values), tuple(w_values), quantization
        for n in self.n_values:  # every point is valid for this model, or fail before anything runs
            for w in self.w_values:
                FractalParams(n=n, w=w, quantization=quantization).positions(space.num_layers)

    def grid(self) -> dict[str, list[Any]]:
        return {"n": list(self.n_values), "w": list(self.w_values)}

    def candidate(self, point: dict[str, Any]) -> Candidate:
        n, w = point["n"], point["w"]
        params = FractalParams(n=n, w=w, quantization=self.quantization)
        params = FractalParams(n=n, w=w, layers=params.positions(self.space.num_layers), quantization=self.quantization)
        return self.propose(DraftConfig(max_draft_tokens=params.max_draft_tokens, exit=NO_EXIT), params)
