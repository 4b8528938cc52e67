"""What an evaluation of a draft config returns, and the objective interface strategies see.

Kept apart from search/objective.py (which needs a model) so that strategies, the study runner and
their tests can work against a fake objective with no model at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, Protocol

from skipsearch.config import Candidate

Kind = Literal["surrogate", "timed"]


@dataclass(frozen=True)
class Measurement:
    """One evaluation of one candidate.

    ``speedup`` is the figure a search maximises: predicted by the cost model for a
    surrogate evaluation, measured against the autoregressive baseline (same process,
    interleaved prompt by prompt) for a timed one.
    """

    kind: Kind
    speedup: float
    predicted_speedup: float | None = None  # the cost model's figure (also kept for timed ones)
    tokens_per_s: float | None = None  # timed only
    baseline_tokens_per_s: float | None = None  # timed only: our autoregressive path, same run
    tau: float | None = None  # mean tokens per verify step (predicted or measured)
    acceptance_rate: float | None = None  # accepted / drafted
    alpha: float | None = None  # surrogate: per-position agreement with the full model ("matchness")
    cost_ratio: float | None = None  # c: one draft step / one full step
    seconds: float = 0.0  # what this evaluation cost, wall time
    notes: str | None = None  # why a timed figure is not to be trusted (another worker shared the machine)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> Measurement:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


class Objective(Protocol):
    """Evaluates candidates. ``evaluate`` may raise; the study marks such a trial failed."""

    def evaluate(self, candidate: Candidate, *, kind: Kind) -> Measurement: ...
