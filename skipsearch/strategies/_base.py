"""The one interface every search strategy implements, and the helpers skip-set strategies share.

As in Optuna's samplers, a strategy only proposes: the runner in ``skipsearch.study`` asks the
study for a trial, lets the strategy turn it into a DraftConfig, evaluates it, and keeps the record.
Everything a strategy remembers lives in the Optuna study, so a search resumes, and runs with
several workers, without any state of its own.

``Strategy`` holds what the runner and ``optimize`` call; how a strategy encodes a skip set as
parameters (``sublayer_slots``, ``bits``, ``suggest_k_and_exit``) and how it enqueues its seed points
(``enqueue_seeds``) are module functions here, used by the strategies that need them.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import optuna

from skipsearch.config import Candidate, DraftConfig
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.space import SearchSpace

if TYPE_CHECKING:
    from skipsearch.models import SkippableModel
    from skipsearch.surrogate import Calibration

SEEDED_ATTR = "seeded"  # study user attr: the seed points are already enqueued


class Strategy(ABC):
    name: ClassVar[str]  # the registry key, also recorded in the study
    method: ClassVar[str] = LAYER_SKIP.name  # the skipsearch.methods entry whose candidates it proposes
    warm_starts: ClassVar[bool] = True  # it can start from another profile's skip set (--warm-start)

    def __init__(self, space: SearchSpace, *, seed: int = 0, warm_start: Sequence[DraftConfig] = ()) -> None:
        self.space = space
        self.seed = seed
        # Repaired, because a warm start may come from a profile made under other settings.
        self.warm_start = tuple(space.repair(c) for c in warm_start)
        self.slots = sublayer_slots(space)

    @classmethod
    def objectives(cls) -> tuple[str, ...]:
        """The objectives it can search with, from its method's record: "surrogate" and "two-stage" need the
        method's surrogate (``Method.predict``); a method with none has every trial timed."""
        from skipsearch import methods

        return ("two-stage", "surrogate", "timed") if methods.get(cls.method).predict is not None else ("timed",)

    #: 0 alone; a random stream id per process when workers share a study (see ``for_shared_study``)
    worker: int = 0
    shared: bool = False  # other workers may be running trials in the same study

    def for_shared_study(self) -> None:
        """Give this worker its own random stream: workers seeded alike would otherwise propose
        the same points from the same history, and evaluate them twice."""
        self.worker = secrets.randbits(32)
        self.shared = True

    def sampler(self) -> optuna.samplers.BaseSampler:
        """The sampler for parameters the strategy leaves to Optuna (none are fixed by next_params)."""
        return optuna.samplers.RandomSampler(seed=self.seed)

    @abstractmethod
    def suggest(self, trial: optuna.Trial) -> Candidate:
        """Define this trial's parameters (``trial.suggest_*``) and return the candidate they mean,
        whose draft config the space must contain (strategies repair what they propose)."""

    def propose(self, draft: DraftConfig, params: Any = None) -> Candidate:
        """A candidate of this strategy's method: ``params`` is that method's Params (or None)."""
        return Candidate(self.method, draft, params.to_pairs() if params is not None else ())

    @property
    def max_trials(self) -> int | None:
        """The most distinct candidates it can propose (a grid's size), or None: no limit."""
        return None

    def prepare(self, sm: SkippableModel, calibration: Calibration, *, say: Callable[[str], None]) -> None:
        """Learn what the strategy needs from the model before the search (CLaSp: its DP's skip sets)."""
        return None  # most strategies need nothing but the space

    def companions(self, shipped: Candidate, tried: Sequence[Candidate]) -> tuple[tuple[str, Candidate, str], ...]:
        """Candidates of other methods to ship beside the shipped one, as (file-name suffix, candidate, notes for
        its profile). ``tried`` are the searched candidates, best first. optimize writes their profiles."""
        return ()

    def next_params(self, study: optuna.Study) -> dict[str, Any] | None:
        """Parameters to enqueue for the next trial, or None to let the sampler decide."""
        return None

    def seed_points(self) -> list[DraftConfig]:
        """The warm start first (the caller's own knowledge), then the probes derived from depth."""
        out: list[DraftConfig] = []
        for config in (*self.warm_start, *self.space.probe_configs()):
            if config not in out:
                out.append(config)
        return out



# -- encoding a skip set as trial parameters -------------------------------------------------------
def sublayer_slots(space: SearchSpace) -> tuple[tuple[str, int], ...]:
    """The sublayers a strategy decides on, as (sublayer, layer) slots: each one a bit of Draft&Verify's z."""
    layers = space.skippable_layers()
    attn = tuple(("attn", i) for i in layers if space.skips_attn)
    return attn + tuple(("mlp", i) for i in layers if space.skips_mlp)


def bits(space: SearchSpace, on: Callable[[str, int], bool]) -> tuple[list[bool], list[bool]]:
    """Per-layer attention and MLP bits from a predicate over the space's (sublayer, layer) slots."""
    attn, mlp = [False] * space.num_layers, [False] * space.num_layers
    for sub, i in sublayer_slots(space):
        (attn if sub == "attn" else mlp)[i] = bool(on(sub, i))
    return attn, mlp


def suggest_k_and_exit(trial: optuna.Trial, space: SearchSpace) -> tuple[int, float, bool]:
    """K, the exit threshold γ0 and the adaptive flag, as Optuna parameters "k", "threshold"
    and "adaptive" (the last two only where the space leaves them open)."""
    k = trial.suggest_categorical("k", list(space.max_draft_tokens))
    lo, hi, step = space.threshold_grid()
    threshold = trial.suggest_float("threshold", lo, hi, step=step) if hi > lo else lo
    adaptive = space.adaptive_exit
    if adaptive is None:
        adaptive = trial.suggest_categorical("adaptive", [True, False])
    return k, threshold, adaptive


# -- seed points -------------------------------------------------------------------------------------
def enqueue_seeds(study: optuna.Study, configs: Sequence[DraftConfig],
                  encode: Callable[[DraftConfig], dict[str, Any]]) -> bool:
    """Enqueue ``configs`` (a strategy's ``seed_points``) once per study, however often the search is resumed.
    Returns whether this call enqueued them."""
    if study.user_attrs.get(SEEDED_ATTR):
        return False
    # Set first: a second worker starting at the same moment then sees it and does not seed again.
    study.set_user_attr(SEEDED_ATTR, True)
    for config in configs:
        # skip_if_exists: a second worker that raced past the attr check adds no twin seeds
        study.enqueue_trial(encode(config), skip_if_exists=True)
    return True
