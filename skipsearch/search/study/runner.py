"""The search loop: trials asked of the study, proposed by the strategy, evaluated by the objective (or reused
from a twin another worker measured) and told, until the study holds the budget."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace

import optuna

from skipsearch.config import Candidate
from skipsearch.interrupts import held_interrupt
from skipsearch.measure import Kind, Measurement, Objective
from skipsearch.search.strategies import Seed, Strategy
from skipsearch.search.study.opening import check_or_stamp
from skipsearch.search.study.record import (
    CONFIG_ATTR,
    ERROR_ATTR,
    EVALUATING_ATTR,
    KIND_ATTR,
    MACHINE_ATTR,
    MEASUREMENT_ATTR,
    REUSED_ATTR,
    SEEDED_ATTR,
    WORKER_ATTR,
    SearchSummary,
    StudyError,
    TrialRecord,
    best,
    candidate_attrs,
    one_line,
    trial_candidate,
    trial_record,
)
from skipsearch.search.study.storage import (
    WRITE_ATTEMPTS,
    finish_trial,
    heartbeat,
    quiet_optuna,
    storage_conflict,
    storage_of,
)
from skipsearch.search.study.workers import contention, fail_lost_trials, other_local_workers, share_cores, worker_id

_STATES = optuna.trial.TrialState
_COUNTED = (_STATES.COMPLETE, _STATES.FAIL, _STATES.RUNNING)  # what the budget counts, over all workers
TWIN_POLL_SECONDS = 0.2  # how often a worker looks whether another's evaluation of its config is done


def _earlier_twin(study: optuna.Study, candidate: Candidate, kind: str, number: int, *,
                  shared: bool = False, machine: str | None = None,
                  seen: dict[int, Candidate] | None = None) -> TrialRecord | None:
    """The completed trial that already measured ``config`` as ``kind``, if any.

    Workers sharing a study must not measure one config twice. Every trial announces its config
    (step 2 of ``run_search``) before it gets here. In a shared study it then waits one poll
    period, so that every twin announced before that is visible, and yields to any twin that is
    already evaluating, or to an announced twin with a lower number; the twin's measurement is
    reused when it completes. Only these two rules decide, so two workers never wait for each
    other, and one that announced more than a poll period after another finds it evaluating.
    If the twin fails, or its worker is lost (no heartbeat for GRACE_SECONDS), this trial evaluates
    the candidate itself. A timing from another machine than ``machine`` is no twin. ``seen`` keeps the
    candidates read so far by trial number (a trial's candidate never changes once recorded): a search of hundreds
    of trials reads each once, not once per later trial.
    """
    if shared:
        time.sleep(TWIN_POLL_SECONDS)
    while True:
        yield_to = False
        for t in study.get_trials(deepcopy=False, states=(_STATES.COMPLETE, _STATES.RUNNING)):
            if t.number == number or t.user_attrs.get(CONFIG_ATTR) is None:
                continue
            if kind == "timed" and t.user_attrs.get(MACHINE_ATTR) != machine:
                continue
            theirs = seen.get(t.number) if seen is not None else None
            if theirs is None:
                theirs = trial_candidate(t)
                if seen is not None and theirs is not None:
                    seen[t.number] = theirs
            if theirs != candidate:
                continue
            r = trial_record(t)
            if r.measurement is not None and r.measurement.kind == kind:
                return r
            if t.state == _STATES.RUNNING and t.user_attrs.get(KIND_ATTR) == kind and not t.user_attrs.get(ERROR_ATTR):
                yield_to = yield_to or t.user_attrs.get(EVALUATING_ATTR, False) or t.number < number
        if not yield_to:
            return None
        time.sleep(TWIN_POLL_SECONDS)
        fail_lost_trials(study)


def seed_study(study: optuna.Study, seeds: Sequence[Seed]) -> bool:
    """Enqueue a strategy's seed points once per study, however often the search is resumed and however many
    workers share it. Returns whether this call enqueued them."""
    if study.user_attrs.get(SEEDED_ATTR):
        return False
    # Set first: a second worker starting at the same moment then sees it and does not seed again.
    study.set_user_attr(SEEDED_ATTR, True)
    for seed in seeds:
        # skip_if_exists: a second worker that raced past the attr check adds no twin seeds (a seed whose config
        # rides in its user attrs, with no params, has none to compare)
        study.enqueue_trial(dict(seed.params), user_attrs=dict(seed.user_attrs) or None,
                            skip_if_exists=bool(seed.params))
    return True


def _used(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=_COUNTED))


def _take_share(study: optuna.Study, neighbours: int) -> int:
    """With a shared storage, the other live workers on this machine now; more of them than last seen: this
    worker takes its share of the cores, with a warning."""
    if not isinstance(storage_of(study), optuna.storages.RDBStorage):
        return neighbours
    others = len(other_local_workers(study))
    if others > neighbours:  # more workers on these cores than before: take this one's share
        shared = share_cores(others + 1)
        if shared:
            warnings.warn(shared, RuntimeWarning, stacklevel=3)
    return others


def _measure(study: optuna.Study, trial: optuna.Trial, candidate: Candidate, strategy: Strategy,
             objective: Objective, *, kind: Kind, machine: str | None, seen: dict[int, Candidate]) -> Measurement:
    """The candidate's measurement: an earlier twin's (at no cost), else the objective's, noting other work that
    ran on the machine while a timed one was measured."""
    earlier = _earlier_twin(study, candidate, kind, trial.number, shared=strategy.shared, machine=machine,
                            seen=seen)
    if earlier is not None:
        trial.set_user_attr(REUSED_ATTR, earlier.number)
        return replace(earlier.measurement, seconds=0.0)
    if strategy.shared:
        trial.set_user_attr(EVALUATING_ATTR, True)  # twins announced from now on wait for this one
    busy = contention(study) if kind == "timed" else None
    measurement = objective.evaluate(candidate, kind=kind)
    busy = busy or (contention(study) if kind == "timed" else None)
    if busy:  # recorded, and never shipped: see optimize's verdict
        measurement = replace(measurement, notes=busy)
    return measurement


def _refused(error: Exception, conflicts: list[str]) -> None:
    """A trial could not start: a busy storage is noted and waited out (one that keeps refusing ends the search in
    one line); any other error is raised."""
    if not storage_conflict(error):
        raise error
    conflicts.append(f"could not start a trial: {one_line(error)}")
    if len(conflicts) > 10 * WRITE_ATTEMPTS:
        raise StudyError(f"the storage keeps refusing writes: {conflicts[-1]}") from None
    time.sleep(0.2 * min(len(conflicts), WRITE_ATTEMPTS))


def _announce(trial: optuna.Trial, candidate: Candidate, *, kind: Kind, machine: str | None) -> None:
    """Record what the trial measures before it does (a failed trial still shows it; twins wait on it): the
    candidate, the kind and, for a timing, the machine."""
    for key, value in candidate_attrs(candidate).items():
        trial.set_user_attr(key, value)
    trial.set_user_attr(KIND_ATTR, kind)
    if kind == "timed":
        trial.set_user_attr(MACHINE_ATTR, machine)


def run_search(study: optuna.Study, strategy: Strategy, objective: Objective, *, budget: int,
               kind: Kind = "surrogate", machine: str | None = None,
               on_trial: Callable[[TrialRecord, TrialRecord | None], None] | None = None) -> SearchSummary:
    """Run trials until the study holds ``budget`` of them (over all workers and earlier runs).

    A trial whose evaluation raises is recorded as FAIL with its error and the search goes on.
    KeyboardInterrupt fails the running trial and propagates; everything completed stays.
    ``on_trial(record, best_so_far)`` is called after each trial. A timed trial records ``machine``
    (``hardware.machine_key``): shipping counts only this machine's timings.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise StudyError(f"budget must be an integer >= 1, got {budget!r}")
    check_or_stamp(study, strategy)
    start, ran, failed, conflicts = time.perf_counter(), 0, 0, []
    neighbours = 0  # other live workers on this machine, last seen
    seen: dict[int, Candidate] = {}  # the study's trials' candidates, read once (_earlier_twin)
    seeds = strategy.plan().seeds
    while True:
        fail_lost_trials(study)  # a dead worker's trial must not hold the budget, nor a twin, for ever
        if _used(study) >= budget:
            break
        pending: list[int] = []  # a Ctrl-C held back while the trial is made; it fails the trial below
        try:
            # 1. the strategy's seed points go first (enqueued once per study); then its sampler proposes
            with held_interrupt(pending):
                if seeds:
                    seed_study(study, seeds)
                    seeds = ()
                with quiet_optuna():
                    trial = study.ask()
        except Exception as e:  # a busy storage: look again (a persistent one ends the search in one line)
            if pending:
                raise KeyboardInterrupt from None
            _refused(e, conflicts)
            continue
        candidate = measurement = error = None
        try:
            if pending:
                raise KeyboardInterrupt
            with heartbeat(study, trial.number):
                trial.set_user_attr(WORKER_ATTR, worker_id())
                neighbours = _take_share(study, neighbours)
                # 2. params -> candidate, recorded before evaluation so a failed trial still shows it
                candidate = strategy.suggest(trial)
                _announce(trial, candidate, kind=kind, machine=machine)
                # 3. evaluate, or reuse the measurement of the same candidate: a repeat costs nothing
                measurement = _measure(study, trial, candidate, strategy, objective, kind=kind, machine=machine,
                                       seen=seen)
                if not math.isfinite(measurement.speedup):
                    raise ValueError(f"the objective returned speedup {measurement.speedup}")
                trial.set_user_attr(MEASUREMENT_ATTR, measurement.to_dict())
        except KeyboardInterrupt:
            finish_trial(study, trial, error="interrupted")  # a conflict here changes nothing: stopping
            raise
        except Exception as e:
            # Our own writes may have met another worker: it finished this trial (it judged us lost), or the
            # storage was busy. Either way the trial is failed here if it still can be, never written again.
            measurement, error = None, one_line(e)
            conflict = finish_trial(study, trial, error=error)
            if storage_conflict(e) or conflict:
                conflicts.append(conflict or f"trial {trial.number}: {error}")
            failed += 1
        else:
            # 4. report the value the strategy learns from
            conflict = finish_trial(study, trial, value=measurement.speedup)
            if conflict:
                conflicts.append(conflict)
                measurement, error = None, conflict
                failed += 1
        ran += 1
        if on_trial is not None:
            state = "FAIL" if error is not None else "COMPLETE"
            on_trial(TrialRecord(trial.number, state, candidate, measurement, error,
                                 machine=machine if kind == "timed" else None), best(study, machine=machine))
    return SearchSummary(trials_total=_used(study), trials_run_here=ran, failed=failed,
                         best=best(study, machine=machine), seconds=time.perf_counter() - start,
                         conflicts=tuple(conflicts))
