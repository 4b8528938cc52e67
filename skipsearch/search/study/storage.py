"""The storage a study lives in: Optuna's RDB storage with an atomic claim of an enqueued trial, the writes other
workers may refuse (retried, or survived in one line), and the heartbeats that keep a running trial alive."""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from datetime import datetime

import optuna
import sqlalchemy

from skipsearch.search.study.record import ERROR_ATTR, MODEL_ATTR, PRECISION_KEY, one_line

_STATES = optuna.trial.TrialState
# Liveness, by Optuna's RDBStorage heartbeats: a running trial records one every HEARTBEAT_SECONDS;
# one whose last beat is older than GRACE_SECONDS has lost its worker (killed, machine gone), and
# ``fail_stale_trials`` marks it failed. Nothing else ever fails another process's trial.
HEARTBEAT_SECONDS = 5
GRACE_SECONDS = 30
WRITE_ATTEMPTS = 5  # tries of one storage write that a busy storage refused ("database is locked", a deadlock)
SQLITE_TIMEOUT_SECONDS = 60  # how long an SQLite write waits for another worker's lock (sqlite3's default is 5)
# The storage each study was opened with: we construct it, so its public methods are ours to call.
_STORAGES: weakref.WeakKeyDictionary[optuna.Study, optuna.storages.BaseStorage] = weakref.WeakKeyDictionary()


def keep_storage(study: optuna.Study, storage: optuna.storages.BaseStorage) -> None:
    """Remember the storage ``study`` was opened with (``open_study``)."""
    _STORAGES[study] = storage


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage | None:
    """The storage ``study`` was opened with; None for one this process did not open."""
    return _STORAGES.get(study)


class ClaimingRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDBStorage, with an atomic claim of a waiting (enqueued) trial.

    ``Study.ask`` pops a WAITING trial by reading its state and then setting it RUNNING. Optuna locks
    the row with SELECT ... FOR UPDATE, which SQLite ignores: two workers could both read WAITING and
    both run the trial, and the slower one then wrote to a trial the faster one had finished
    (``UpdateFinishedTrialError``; issue 22). Here the claim is one conditional UPDATE
    (``... WHERE state = WAITING``), which exactly one worker wins on every backend.

    A trial is also given its first heartbeat the moment it starts RUNNING, created or claimed: ``Study.ask``
    runs the sampler after that (TPE's seconds on a long study), and a worker killed there had left a RUNNING
    trial with no heartbeat, which Optuna never judges stale, holding the budget and its twin for ever."""

    def _create_new_trial(self, study_id: int, template_trial=None):  # what Optuna's cached storage calls
        frozen = super()._create_new_trial(study_id, template_trial)
        if frozen.state == _STATES.RUNNING:
            self.record_heartbeat(frozen._trial_id)
        return frozen

    def set_trial_state_values(self, trial_id: int, state: optuna.trial.TrialState,
                               values=None) -> bool:
        if state != _STATES.RUNNING or values is not None:
            return super().set_trial_state_values(trial_id, state=state, values=values)
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(self.scoped_session) as session:
            won = session.query(models.TrialModel).filter(
                models.TrialModel.trial_id == trial_id, models.TrialModel.state == _STATES.WAITING,
            ).update({models.TrialModel.state: _STATES.RUNNING}, synchronize_session=False)
            if won == 1:  # the start time, in the same transaction (Optuna's model converts it to UTC)
                models.TrialModel.find_or_raise_by_id(trial_id, session).datetime_start = datetime.now()
        if won == 1:
            self.record_heartbeat(trial_id)
        return won == 1


def rdb_storage(url: str) -> ClaimingRDBStorage:
    """The storage every worker opens ``url`` with: atomic claims, heartbeats, a patient SQLite lock."""
    engine_kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_SECONDS}} if url.startswith("sqlite") else None
    return ClaimingRDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_SECONDS,
                              grace_period=GRACE_SECONDS)


def storage_conflict(error: BaseException) -> bool:
    """Whether ``error`` is the storage refusing a write because of another worker, not a bug here: the
    trial was finished by another worker, or the database was busy (locked, a deadlock, a serialisation
    failure). Optuna wraps driver errors in ``StorageInternalError``."""
    if isinstance(error, optuna.exceptions.UpdateFinishedTrialError):
        return True
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InternalError)):
            return True
        error = error.__cause__ or error.__context__
    return False


def _finished_elsewhere(error: BaseException) -> bool:
    return isinstance(error, optuna.exceptions.UpdateFinishedTrialError)


def finish_trial(study: optuna.Study, trial: optuna.Trial | int, *, value: float | None = None,
                 error: str | None = None) -> str | None:
    """Finish ``trial`` (an asked trial, or the number of one this process added): COMPLETE with
    ``value``, or FAIL with ``error``.

    Returns None when done, else the storage conflict that prevented it, in one line. A trial that is
    already finished (another worker failed it as lost, or claimed it too) is never written again;
    a busy storage is tried WRITE_ATTEMPTS times."""
    problem, number = None, trial if isinstance(trial, int) else trial.number
    for attempt in range(WRITE_ATTEMPTS):
        try:
            if error is not None:
                if isinstance(trial, int):
                    set_trial_attr(study, number, ERROR_ATTR, error)
                else:
                    trial.set_user_attr(ERROR_ATTR, error)
                study.tell(trial, state=_STATES.FAIL)
            else:
                study.tell(trial, value)
            return None
        except Exception as e:
            if not storage_conflict(e):
                raise
            problem = one_line(e)
            if _finished_elsewhere(e):
                break
            time.sleep(0.2 * (attempt + 1))
    return f"trial {number} not recorded: {problem}"


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    # Heartbeats are "experimental" in Optuna and "supposed to be used with Study.optimize"; they serve
    # ask/tell as well when the runner beats itself (``heartbeat``), which is what these warnings doubt.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        yield


def _trial_id(study: optuna.Study, number: int) -> int:
    storage = _STORAGES[study]
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def set_trial_attr(study: optuna.Study, number: int, key: str, value) -> None:
    """Set a user attr on trial ``number``, which this process added (a claim) or runs."""
    _STORAGES[study].set_trial_user_attr(_trial_id(study, number), key, value)


@contextlib.contextmanager
def heartbeat(study: optuna.Study, number: int) -> Iterator[None]:
    """Keep trial ``number`` alive for other workers while this block runs (RDB storages only).

    The first beat is recorded before the block starts: a trial with none is never judged lost."""
    storage = storage_of(study)
    if not isinstance(storage, optuna.storages.RDBStorage):
        yield
        return
    trial_id = _trial_id(study, number)
    storage.record_heartbeat(trial_id)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                storage.record_heartbeat(trial_id)
            except Exception:  # a transient database error: the next beat tries again
                pass

    thread = threading.Thread(target=beat, name=f"skipsearch-heartbeat-{number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def stamp_model(study: optuna.Study, *, name: str, num_layers: int, fingerprint: str | None,
                precision: str = "native") -> None:
    """Record the model a search runs on, once: re-ranking or planning from the study checks it. A quantized
    target's precision is recorded beside it (a study without one ran on the native target)."""
    if MODEL_ATTR not in study.user_attrs:
        made = {"name": name, "num_layers": num_layers, "fingerprint": fingerprint}
        if precision != "native":
            made[PRECISION_KEY] = precision
        try:
            study.set_user_attr(MODEL_ATTR, made)
        except Exception as e:  # a busy storage: the record is a convenience, the space already names the depth
            if not storage_conflict(e):
                raise
