"""The one interface every search strategy implements, and the helpers skip-set strategies share.

As in Optuna's samplers, a strategy only proposes: the runner in ``skipsearch.search.study`` asks the
study for a trial, lets the strategy turn it into a candidate, evaluates it, and keeps the record.
Everything a strategy remembers lives in the Optuna study, so a search resumes, and runs with
several workers, without any state of its own.

``Strategy`` is five methods, as small as Optuna's ``BaseSampler``: ``sampler`` (the Optuna sampler that
proposes its parameters: TPE, a grid, Draft&Verify's GP), ``plan`` (data: the seed points the runner
enqueues once per study, and a grid's size), ``prepare`` (what it learns from the model first),
``suggest`` (a trial's parameters -> its candidate) and ``companions`` (data: the candidates of other
methods to ship beside the searched one). And two declarations: ``methods`` (the methods whose candidates it
can propose, as their records) and ``options`` (the settings it takes beyond the space, seed and warm start, as
``Option`` data: ``make_strategy`` checks what it is given against them, and ``skipsearch optimize`` makes its
flags from them). A strategy object proposes for one method, given when it is made and never changed:
``method``. How a strategy encodes a skip set as parameters
(``sublayer_slots``, ``bits``, ``suggest_k_and_exit``) and its default seed points (``seed_points``) are
module functions here, used by the strategies that need them.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import optuna

from skipsearch.config import Candidate, ConfigError, DraftConfig
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.search.space import SearchSpace

if TYPE_CHECKING:
    from skipsearch.engine.surrogate import Calibration
    from skipsearch.methods import Method
    from skipsearch.model.skippable import SkippableModel


@dataclass(frozen=True)
class Option:
    """A setting a strategy takes beyond the space, seed and warm start, declared as data, as an Optuna sampler's
    keyword-only settings are: ``make_strategy`` checks a value against it (``check``), and ``skipsearch optimize``
    makes the flag from it, with its help, default, bound and choices."""

    name: str  # the constructor's keyword, e.g. "n_values"
    type: type  # int, float or str: the value's, or each item's where ``many``; any other: for library callers only
    default: Any  # the constructor's default, shown in --help (None: the help says what it means)
    help: str  # a phrase for --help, e.g. "draft windows to try, e.g. 3,5,7"
    many: bool = False  # a tuple of one or more values: comma-separated on the command line (3,5,7)
    low: float | None = None  # the smallest value allowed (each item's, where ``many``)
    # The values allowed, listed in --help. The method's params check them (their messages name the profile's
    # field), so the declaration does not check them twice.
    choices: tuple[str, ...] = ()
    flag: str = ""  # its command-line spelling; "" is --<name with dashes>
    method: Method | None = None  # given, the strategy proposes this method's candidates (tpe's schemes: precision)

    @property
    def spelling(self) -> str:
        """The command-line flag, e.g. --vocab-sizes."""
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def on_command_line(self) -> bool:
        """Whether a flag can spell it (an object such as CLaSp's precomputed skip sets cannot)."""
        return self.type in (int, float, str)

    def check(self, strategy: str, value: Any) -> None:
        """A one-line ConfigError naming the strategy and the flag when ``value`` is not of the declared type and bound
        (an object no flag can spell is the strategy's to check)."""
        if not self.on_command_line:
            return
        one_or_more = isinstance(value, (tuple, list)) and len(value) > 0
        if self.many and not one_or_more or not all(map(self._fits, value if self.many else (value,))):
            kind = {int: "integer", float: "number", str: "string"}[self.type]
            what = f"comma-separated {kind}s" if self.many else {int: "an integer", float: "a number", str: "a string"}[
                self.type]
            bound = f" >= {self.low:g}" if self.low is not None else ""
            raise ConfigError(f"strategy '{strategy}': {self.spelling} must be {what}{bound}, got {value!r:.40}")

    def _fits(self, v: Any) -> bool:
        if self.type is str:
            return isinstance(v, str)
        number = not isinstance(v, bool) and isinstance(v, (int, float) if self.type is float else int)
        return number and (self.low is None or v >= self.low)


@dataclass(frozen=True)
class Seed:
    """A point a strategy has evaluated first: its draft config, and the trial that evaluates it."""

    config: DraftConfig
    params: Mapping[str, Any]  # the trial's parameters, fixed; empty: the config rides in ``user_attrs``
    user_attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What a strategy asks of the runner before it searches."""

    seeds: tuple[Seed, ...] = ()  # enqueued once per study, however often it resumes and whoever runs it
    max_trials: int | None = None  # the most distinct candidates it can propose (a grid's size); None: no limit


@dataclass(frozen=True)
class Companion:
    """A candidate of another method to ship beside the searched one (e.g. CLaSp's dynamic profile)."""

    suffix: str  # the file-name suffix of its profile: <out><suffix>.yaml
    candidate: Candidate
    notes: str  # for its profile's measured.notes


class Strategy(ABC):
    name: ClassVar[str]  # the registry key, also recorded in the study
    # The methods whose candidates it can propose, as their records: the first, unless an option given names
    # another (``Option.method``). Every one of its candidates is of the one method it was made for.
    methods: ClassVar[tuple[Method, ...]] = (LAYER_SKIP,)
    options: ClassVar[tuple[Option, ...]] = ()  # what it takes beyond the space, seed and warm start
    warm_starts: ClassVar[bool] = True  # it can start from another profile's skip set (--warm-start)
    # for a quantized target (model/target.py), the options that keep its drafts off copies of the fp32 weights
    # the target does not hold (a trimmed head): given in place of the defaults
    quantized_target: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, space: SearchSpace, *, method: Method | None = None, seed: int = 0,
                 warm_start: Sequence[DraftConfig] = ()) -> None:
        method = method if method is not None else self.methods[0]
        if not any(method is m for m in self.methods):
            raise ValueError(f"strategy '{self.name}' proposes no {method.name} candidates")
        self._method = method
        self.space = space
        self.seed = seed
        # Repaired, because a warm start may come from a profile made under other settings.
        self.warm_start = tuple(space.repair(c) for c in warm_start)
        self.slots = sublayer_slots(space)

    @property
    def method(self) -> Method:
        """The method whose candidates it proposes, fixed when it was made."""
        return self._method

    @classmethod
    def method_for(cls, options: Mapping[str, Any]) -> Method:
        """The method it proposes for, given ``options``: the one a given option names (``Option.method``), else
        its first."""
        named = [o.method for o in cls.options if o.method is not None and o.name in options]
        return named[0] if named else cls.methods[0]

    def objectives(self) -> tuple[str, ...]:
        """The objectives it can search with, from its method's record: "surrogate" and "two-stage" need the
        method's surrogate (``Method.predict``); a method with none has every trial timed."""
        return ("two-stage", "surrogate", "timed") if self.method.predict is not None else ("timed",)

    #: 0 alone; a random stream id per process when workers share a study (see ``for_shared_study``)
    worker: int = 0
    shared: bool = False  # other workers may be running trials in the same study

    def for_shared_study(self) -> None:
        """Give this worker its own random stream: workers seeded alike would otherwise propose
        the same points from the same history, and evaluate them twice."""
        self.worker = secrets.randbits(32)
        self.shared = True

    # -- the interface -----------------------------------------------------------------------------
    def sampler(self) -> optuna.samplers.BaseSampler:
        """The Optuna sampler that proposes the parameters ``suggest`` asks for (seeds' are fixed)."""
        return optuna.samplers.RandomSampler(seed=self.seed)

    def plan(self) -> Plan:
        """The seed points and the grid's size (default: none, no limit)."""
        return Plan()

    def prepare(self, sm: SkippableModel, calibration: Calibration, *, say: Callable[[str], None]) -> None:
        """Learn what the strategy needs from the model before the search (CLaSp: its DP's skip sets)."""
        return None  # most strategies need nothing but the space

    @abstractmethod
    def suggest(self, trial: optuna.Trial) -> Candidate:
        """Define this trial's parameters (``trial.suggest_*``) and return the candidate they mean,
        whose draft config the space must contain (strategies repair what they propose)."""

    def companions(self, shipped: Candidate, tried: Sequence[Candidate]) -> tuple[Companion, ...]:
        """Candidates of other methods to ship beside the shipped one. ``tried`` are the searched candidates,
        best first. optimize writes their profiles."""
        return ()

    # -- for the strategies --------------------------------------------------------------------------
    def propose(self, draft: DraftConfig, params: Any = None) -> Candidate:
        """A candidate of this strategy's method: ``params`` is that method's Params (or None)."""
        return self.method.candidate(draft, params)



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
def seed_points(space: SearchSpace, warm_start: Sequence[DraftConfig]) -> list[DraftConfig]:
    """A skip-set search's seed points: the warm start first (the caller's own knowledge), then the probes
    derived from depth."""
    out: list[DraftConfig] = []
    for config in (*warm_start, *space.probe_configs()):
        if config not in out:
            out.append(config)
    return out
