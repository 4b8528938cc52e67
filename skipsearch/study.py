"""The search loop and its record: an Optuna study that any strategy proposes into.

The study is the only state a search has. Every trial carries the config it evaluated and the
measurement it got as JSON user attrs, so a search resumes where it stopped, several workers
can share one storage, and ``show``/``compare`` read any strategy's study alike.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import optuna
import sqlalchemy

from skipsearch.config import DraftConfig, ExitRule
from skipsearch.measure import Kind, Measurement, Objective
from skipsearch.strategies import Strategy

_STATES = optuna.trial.TrialState
_COUNTED = (_STATES.COMPLETE, _STATES.FAIL, _STATES.RUNNING)  # what the budget counts, over all workers
STRATEGY_ATTR, SPACE_ATTR, SEED_ATTR = "strategy", "space", "seed"  # study user attrs
CONFIG_ATTR, MEASUREMENT_ATTR, ERROR_ATTR, REUSED_ATTR = "config", "measurement", "error", "reused_from"  # trial's
EVALUATING_ATTR = "evaluating"  # trial's: set when a shared study's trial starts measuring its config
KIND_ATTR = "kind"  # trial's: "surrogate" or "timed", set before evaluation so other workers see it
OPEN_ATTEMPTS = 5  # tries to create-or-load a study that other workers may be creating right now
TWIN_POLL_SECONDS = 0.2  # how often a worker looks whether another's evaluation of its config is done
# How long a worker waits for another's evaluation of the same config before doing it itself: a
# worker killed mid-trial leaves its trial RUNNING in a shared storage for good.
TWIN_TIMEOUT_SECONDS = 300.0


class StudyError(RuntimeError):
    """A study that cannot be opened, resumed or run. The message is one line for users."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class TrialRecord:
    number: int
    state: str  # Optuna's state name: COMPLETE, FAIL, RUNNING, ...
    config: DraftConfig | None  # None when the trial failed before it had a config
    measurement: Measurement | None
    error: str | None  # one line, for FAIL trials


@dataclass(frozen=True)
class SearchSummary:
    trials_total: int  # in the study, every worker's included
    trials_run_here: int  # by this call
    failed: int  # by this call
    best: TrialRecord | None
    seconds: float


# -- (de)serialisation of what a trial records ---------------------------------------------------


def config_to_dict(config: DraftConfig) -> dict:
    return {"skip_attn": list(config.skip_attn), "skip_mlp": list(config.skip_mlp),
            "max_draft_tokens": config.max_draft_tokens, "exit": asdict(config.exit)}


def config_from_dict(raw: dict) -> DraftConfig:
    return DraftConfig(skip_attn=tuple(raw["skip_attn"]), skip_mlp=tuple(raw["skip_mlp"]),
                       max_draft_tokens=raw["max_draft_tokens"], exit=ExitRule(**raw["exit"]))


def _space_dict(strategy: Strategy) -> dict:
    return json.loads(json.dumps(asdict(strategy.space)))  # tuples as lists, as the storage gives them back


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# -- opening ---------------------------------------------------------------------------------------


def open_study(*, study_dir: str | Path | None = None, storage: str | None = None, study_name: str | None = None,
               strategy: Strategy, direction: str = "maximize") -> optuna.Study:
    """Create or resume a study. Storage is ``<study_dir>/study.db`` (SQLite) unless ``storage``
    names any Optuna RDB URL; with neither, the study lives in memory. A study remembers the
    strategy and search space that made it and refuses to be resumed with others.

    With ``storage`` (shared by workers), each worker's sampler gets its own random stream: two
    workers seeded alike would otherwise propose the same points from the same history. The seed
    then makes a single-worker search reproducible, not a distributed one (whose trial order
    depends on timing anyway)."""
    shared = storage is not None
    if storage is None and study_dir is not None:
        try:
            Path(study_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StudyError(f"cannot create study directory '{study_dir}': {e.strerror or e}") from None
        storage = f"sqlite:///{Path(study_dir).resolve() / 'study.db'}"
    name = study_name or (Path(study_dir).resolve().name if study_dir is not None else "skipsearch")
    sampler = strategy.sampler()
    if shared:
        strategy.for_shared_study()
        sampler.reseed_rng()
    for attempt in range(OPEN_ATTEMPTS):
        try:
            rdb = None if storage is None else optuna.storages.RDBStorage(storage)
            study = optuna.create_study(storage=rdb, study_name=name, sampler=sampler,
                                        direction=direction, load_if_exists=True)
            break
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as e:
            # Workers started together race to create the schema or the study; the loser's CREATE
            # or INSERT fails (duplicate table, unique key). By the next attempt the winner has
            # committed: load it. Any other cause fails the same way every time and is shown.
            if attempt == OPEN_ATTEMPTS - 1:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise StudyError(f"cannot open storage '{_shown(storage)}': {first}") from None
            time.sleep(0.2 * (attempt + 1))
        except Exception as e:  # sqlalchemy and driver errors vary by backend; the user needs the first line
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise StudyError(f"cannot open storage '{_shown(storage)}': {first}") from None
    _check_or_stamp(study, strategy)
    return study


def load_records(*, study_dir: str | Path | None = None, storage: str | None = None,
                 study_name: str | None = None) -> tuple[str, list[TrialRecord]]:
    """Read an existing study without a strategy (for ``skipsearch study show``)."""
    if storage is None:
        if study_dir is None:
            raise StudyError("give a study directory or --storage")
        db = Path(study_dir) / "study.db"
        if not db.exists():
            raise StudyError(f"no study at '{study_dir}' (no study.db there)")
        storage = f"sqlite:///{db.resolve()}"
    name = study_name or (Path(study_dir).resolve().name if study_dir is not None else None)
    try:
        summaries = optuna.get_all_study_summaries(storage)
        if name is None and len(summaries) == 1:
            name = summaries[0].study_name
        study = optuna.load_study(study_name=name, storage=storage)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise StudyError(f"cannot read study '{name}' from '{_shown(storage)}': {first}") from None
    label = f"{name} [{study.user_attrs.get(STRATEGY_ATTR, '?')}]"
    return label, records(study)


def _shown(url: str | None) -> str:
    """The URL without its password, which must not reach a terminal or a log."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL at all: nothing in it to hide
        return str(url)


def _check_or_stamp(study: optuna.Study, strategy: Strategy) -> None:
    attrs, space = study.user_attrs, _space_dict(strategy)
    made_by = attrs.get(STRATEGY_ATTR)
    if made_by is not None and made_by != strategy.name:
        raise StudyError(f"study '{study.study_name}' was made by strategy '{made_by}', not '{strategy.name}': "
                         f"resume it with '{made_by}' or start another study")
    made_for = attrs.get(SPACE_ATTR)
    if made_for is not None and made_for != space:
        changed = ", ".join(f"{k} {made_for.get(k)!r} -> {v!r}" for k, v in space.items() if made_for.get(k) != v)
        raise StudyError(f"study '{study.study_name}' was made for another search space ({changed}): "
                         f"start another study")
    if made_by is None:
        study.set_user_attr(STRATEGY_ATTR, strategy.name)
        study.set_user_attr(SPACE_ATTR, space)
        study.set_user_attr(SEED_ATTR, strategy.seed)


# -- reading the record ---------------------------------------------------------------------------


def trial_config(t: optuna.trial.FrozenTrial) -> DraftConfig | None:
    """The config a trial evaluated (or is evaluating); None before it had one."""
    raw = t.user_attrs.get(CONFIG_ATTR)
    return config_from_dict(raw) if raw is not None else None


def _record(t: optuna.trial.FrozenTrial) -> TrialRecord:
    measurement = t.user_attrs.get(MEASUREMENT_ATTR)
    return TrialRecord(number=t.number, state=t.state.name, config=trial_config(t),
                       measurement=Measurement.from_dict(measurement) if measurement is not None else None,
                       error=t.user_attrs.get(ERROR_ATTR))


def records(study: optuna.Study) -> list[TrialRecord]:
    """Every trial that has started, in order (enqueued ones still waiting are left out)."""
    return [_record(t) for t in study.get_trials(deepcopy=False) if t.state != _STATES.WAITING]


study_table = records  # what ``skipsearch show`` renders


def _completed(study: optuna.Study, kind: str) -> list[TrialRecord]:
    done = (_record(t) for t in study.get_trials(deepcopy=False, states=(_STATES.COMPLETE,)))
    return [r for r in done if r.config is not None and r.measurement is not None and r.measurement.kind == kind]


def _ranked(study: optuna.Study, kind: str) -> list[TrialRecord]:
    return sorted(_completed(study, kind), key=lambda r: (-r.measurement.speedup, r.number))


def shortlist(study: optuna.Study, n: int, *, kind: Kind = "surrogate") -> list[DraftConfig]:
    """The best ``n`` distinct configs measured as ``kind``, best first."""
    out: list[DraftConfig] = []
    for r in _ranked(study, kind):
        if len(out) >= n:
            break
        if r.config not in out:
            out.append(r.config)
    return out


def best(study: optuna.Study, *, prefer: Kind = "timed") -> TrialRecord | None:
    """The best trial of the preferred kind, else the best of the other: a timed speedup is a
    measurement, a surrogate one a prediction, so one timed trial outranks any surrogate."""
    for kind in (prefer, "surrogate" if prefer == "timed" else "timed"):
        ranked = _ranked(study, kind)
        if ranked:
            return ranked[0]
    return None


# -- the loop -------------------------------------------------------------------------------------


def _earlier_twin(study: optuna.Study, config: DraftConfig, kind: str, number: int, *,
                  shared: bool = False) -> TrialRecord | None:
    """The completed trial that already measured ``config`` as ``kind``, if any.

    Workers sharing a study must not measure one config twice. Every trial announces its config
    (step 2 of ``run_search``) before it gets here. In a shared study it then waits one poll
    period, so that every twin announced before that is visible, and yields to any twin that is
    already evaluating, or to an announced twin with a lower number; the twin's measurement is
    reused when it completes. Only these two rules decide, so two workers never wait for each
    other, and one that announced more than a poll period after another finds it evaluating.
    If the twin fails (or hangs past TWIN_TIMEOUT_SECONDS), this trial evaluates the config itself.
    """
    if shared:
        time.sleep(TWIN_POLL_SECONDS)
    deadline = time.monotonic() + TWIN_TIMEOUT_SECONDS
    while True:
        yield_to = False
        for t in study.get_trials(deepcopy=False, states=(_STATES.COMPLETE, _STATES.RUNNING)):
            if t.number == number or t.user_attrs.get(CONFIG_ATTR) is None:
                continue
            r = _record(t)
            if r.config != config:
                continue
            if r.measurement is not None and r.measurement.kind == kind:
                return r
            if t.state == _STATES.RUNNING and t.user_attrs.get(KIND_ATTR) == kind and not t.user_attrs.get(ERROR_ATTR):
                yield_to = yield_to or t.user_attrs.get(EVALUATING_ATTR, False) or t.number < number
        if not yield_to or time.monotonic() > deadline:
            return None
        time.sleep(TWIN_POLL_SECONDS)


def _used(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=_COUNTED))


def run_search(study: optuna.Study, strategy: Strategy, objective: Objective, *, budget: int,
               kind: Kind = "surrogate",
               on_trial: Callable[[TrialRecord, TrialRecord | None], None] | None = None) -> SearchSummary:
    """Run trials until the study holds ``budget`` of them (over all workers and earlier runs).

    A trial whose evaluation raises is recorded as FAIL with its error and the search goes on.
    KeyboardInterrupt fails the running trial and propagates; everything completed stays.
    ``on_trial(record, best_so_far)`` is called after each trial.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise StudyError(f"budget must be an integer >= 1, got {budget!r}")
    _check_or_stamp(study, strategy)
    start, ran, failed = time.perf_counter(), 0, 0
    while _used(study) < budget:
        # 1. the strategy may fix the next trial's params (seeds, its own model's proposal)
        params = strategy.next_params(study)
        if params is not None:
            study.enqueue_trial(params)
        trial = study.ask()
        config = measurement = error = None
        try:
            # 2. params -> config, recorded before evaluation so a failed trial still shows it
            config = strategy.suggest(trial)
            trial.set_user_attr(CONFIG_ATTR, config_to_dict(config))
            trial.set_user_attr(KIND_ATTR, kind)
            # 3. evaluate, or reuse the measurement of the same config: a repeat costs nothing
            earlier = _earlier_twin(study, config, kind, trial.number, shared=strategy.shared)
            if earlier is not None:
                measurement = replace(earlier.measurement, seconds=0.0)
                trial.set_user_attr(REUSED_ATTR, earlier.number)
            else:
                if strategy.shared:
                    trial.set_user_attr(EVALUATING_ATTR, True)  # twins announced from now on wait for this one
                measurement = objective.evaluate(config, kind=kind)
            if not math.isfinite(measurement.speedup):
                raise ValueError(f"the objective returned speedup {measurement.speedup}")
            trial.set_user_attr(MEASUREMENT_ATTR, measurement.to_dict())
        except KeyboardInterrupt:
            trial.set_user_attr(ERROR_ATTR, "interrupted")
            study.tell(trial, state=_STATES.FAIL)
            raise
        except Exception as e:
            measurement, error = None, _one_line(e)
            trial.set_user_attr(ERROR_ATTR, error)
            study.tell(trial, state=_STATES.FAIL)
            failed += 1
        else:
            # 4. report the value the strategy learns from
            study.tell(trial, measurement.speedup)
        ran += 1
        if on_trial is not None:
            state = "FAIL" if error is not None else "COMPLETE"
            on_trial(TrialRecord(trial.number, state, config, measurement, error), best(study))
    return SearchSummary(trials_total=_used(study), trials_run_here=ran, failed=failed, best=best(study),
                         seconds=time.perf_counter() - start)
