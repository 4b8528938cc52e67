"""The search loop and its record: an Optuna study that any strategy proposes into.

The study is the only state a search has. Every trial carries the config it evaluated and the
measurement it got as JSON user attrs, so a search resumes where it stopped, several workers
can share one storage, and ``show``/``compare`` read any strategy's study alike.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path

import optuna
import sqlalchemy

from skipsearch.config import Candidate, DraftConfig, ExitRule
from skipsearch.measure import Kind, Measurement, Objective
from skipsearch.strategies import Strategy

_STATES = optuna.trial.TrialState
_COUNTED = (_STATES.COMPLETE, _STATES.FAIL, _STATES.RUNNING)  # what the budget counts, over all workers
STRATEGY_ATTR, SPACE_ATTR, SEED_ATTR = "strategy", "space", "seed"  # study user attrs
CONFIG_ATTR, MEASUREMENT_ATTR, ERROR_ATTR, REUSED_ATTR = "config", "measurement", "error", "reused_from"  # trial's
EVALUATING_ATTR = "evaluating"  # trial's: set when a shared study's trial starts measuring its config
KIND_ATTR = "kind"  # trial's: "surrogate" or "timed", set before evaluation so other workers see it
METHOD_ATTR, PARAMS_ATTR = "method", "params"  # trial's: the candidate's method and method params
WORKER_ATTR = "worker"  # trial's: "host:pid" of the process that runs it
MODEL_ATTR = "model"  # study's: {name, num_layers, fingerprint} of the model the search ran on
OPEN_ATTEMPTS = 5  # tries to create-or-load a study that other workers may be creating right now
TWIN_POLL_SECONDS = 0.2  # how often a worker looks whether another's evaluation of its config is done
# Liveness, by Optuna's RDBStorage heartbeats: a running trial records one every HEARTBEAT_SECONDS;
# one whose last beat is older than GRACE_SECONDS has lost its worker (killed, machine gone), and
# ``fail_stale_trials`` marks it failed. Nothing else ever fails another process's trial.
HEARTBEAT_SECONDS = 5
GRACE_SECONDS = 30
WRITE_ATTEMPTS = 5  # tries of one storage write that a busy storage refused ("database is locked", a deadlock)
SQLITE_TIMEOUT_SECONDS = 60  # how long an SQLite write waits for another worker's lock (sqlite3's default is 5)
# The storage each study was opened with: we construct it, so its public methods are ours to call.
_STORAGES: weakref.WeakKeyDictionary[optuna.Study, optuna.storages.BaseStorage] = weakref.WeakKeyDictionary()


class StudyError(RuntimeError):
    """A study that cannot be opened, resumed or run. The message is one line for users."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class TrialRecord:
    number: int
    state: str  # Optuna's state name: COMPLETE, FAIL, RUNNING, ...
    candidate: Candidate | None  # None when the trial failed before it had one
    measurement: Measurement | None
    error: str | None  # one line, for FAIL trials

    @property
    def config(self) -> DraftConfig | None:
        """The candidate's draft config (skip sets, K, exit rule)."""
        return self.candidate.draft if self.candidate is not None else None


@dataclass(frozen=True)
class SearchSummary:
    trials_total: int  # in the study, every worker's included
    trials_run_here: int  # by this call
    failed: int  # by this call
    best: TrialRecord | None
    seconds: float
    conflicts: tuple[str, ...] = ()  # storage conflicts this call survived, one line each (see ``finish_trial``)


# -- (de)serialisation of what a trial records ---------------------------------------------------


def config_to_dict(config: DraftConfig) -> dict:
    return {"skip_attn": list(config.skip_attn), "skip_mlp": list(config.skip_mlp),
            "max_draft_tokens": config.max_draft_tokens, "exit": asdict(config.exit)}


def config_from_dict(raw: dict) -> DraftConfig:
    return DraftConfig(skip_attn=tuple(raw["skip_attn"]), skip_mlp=tuple(raw["skip_mlp"]),
                       max_draft_tokens=raw["max_draft_tokens"], exit=ExitRule(**raw["exit"]))


def candidate_attrs(candidate: Candidate) -> dict:
    """The user attrs a trial records its candidate in (JSON: every storage keeps them)."""
    return {CONFIG_ATTR: config_to_dict(candidate.draft), METHOD_ATTR: candidate.method,
            PARAMS_ATTR: candidate.plain_params()}


def _space_dict(strategy: Strategy) -> dict:
    return json.loads(json.dumps(asdict(strategy.space)))  # tuples as lists, as the storage gives them back


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# -- storage ---------------------------------------------------------------------------------------


class ClaimingRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDBStorage, with an atomic claim of a waiting (enqueued) trial.

    ``Study.ask`` pops a WAITING trial by reading its state and then setting it RUNNING. Optuna locks
    the row with SELECT ... FOR UPDATE, which SQLite ignores: two workers could both read WAITING and
    both run the trial, and the slower one then wrote to a trial the faster one had finished
    (``UpdateFinishedTrialError``; issue 22). Here the claim is one conditional UPDATE
    (``... WHERE state = WAITING``), which exactly one worker wins on every backend."""

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
            problem = _one_line(e)
            if _finished_elsewhere(e):
                break
            time.sleep(0.2 * (attempt + 1))
    return f"trial {number} not recorded: {problem}"


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
            with _quiet_optuna():
                backend = optuna.storages.InMemoryStorage() if storage is None else rdb_storage(storage)
                study = optuna.create_study(storage=backend, study_name=name, sampler=sampler,
                                            direction=direction, load_if_exists=True)
            break
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.OperationalError) as e:
            # Workers started together race to create the schema or the study; the loser's CREATE
            # or INSERT fails (duplicate table, unique key; SQLite says "already exists" or "locked").
            # By the next attempt the winner has committed: load it. Other causes fail every time.
            racing = not isinstance(e, sqlalchemy.exc.OperationalError) or any(
                word in str(e) for word in ("already exists", "database is locked"))
            if attempt == OPEN_ATTEMPTS - 1 or not racing:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise StudyError(f"cannot open storage '{_shown(storage)}': {first}") from None
            time.sleep(0.2 * (attempt + 1))
        except Exception as e:  # sqlalchemy and driver errors vary by backend; the user needs the first line
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise StudyError(f"cannot open storage '{_shown(storage)}': {first}") from None
    _STORAGES[study] = backend
    _check_or_stamp(study, strategy)
    fail_lost_trials(study)
    return study


def check_storage(*, study_dir: str | Path | None = None, storage: str | None = None) -> None:
    """What can be wrong with a study's storage that needs no model, checked before one loads (one line each):
    a database driver that is not installed, a study file that is truncated or not a database, a study that
    cannot be written (read-only file or folder). Nothing is created or written."""
    import sqlite3
    import urllib.parse

    if storage is not None:
        try:
            url = sqlalchemy.engine.make_url(storage)
        except Exception:  # noqa: BLE001 - not a URL at all
            raise StudyError(f"'{_shown(storage)}' is not a database URL (e.g. sqlite:///study.db, "
                             f"postgresql://...)") from None
        try:
            url.get_dialect().import_dbapi()  # the driver, imported; nothing connects
        except ImportError as e:
            raise StudyError(f"cannot use '{_shown(storage)}': its database driver is not installed ({e}); install "
                             f"it (pip install -e '.[postgres]' for psycopg2), or name an installed one in the "
                             f"URL") from None
        except Exception as e:  # noqa: BLE001 - an unknown dialect: sqlalchemy says which
            raise StudyError(f"cannot use '{_shown(storage)}': {_one_line(e)}") from None
        if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
            return
        db = Path(url.database)
    elif study_dir is not None:
        _check_study_path(study_dir)
        db = Path(study_dir) / "study.db"
    else:
        return
    if not db.exists():
        folder = next((q for q in [db.parent, *db.parent.parents] if q.exists()), None)
        if folder is not None and not os.access(folder, os.W_OK | os.X_OK):
            raise StudyError(f"cannot create the study in '{db.parent}': '{folder}' is read-only")
        return
    try:
        conn = sqlite3.connect(f"file:{urllib.parse.quote(str(db.resolve()))}?mode=ro", uri=True)
        try:
            conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
            ok = conn.execute("PRAGMA quick_check").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise StudyError(f"study file '{db}' is unreadable ({e}): it is truncated or not a study; move it away "
                         f"to start afresh") from None
    if ok is None or ok[0] != "ok":
        raise StudyError(f"study file '{db}' is damaged (quick_check: {ok[0] if ok else 'no answer'}); move it away "
                         f"to start afresh")
    if not os.access(db, os.W_OK) or not os.access(db.parent, os.W_OK | os.X_OK):
        raise StudyError(f"study file '{db}' is read-only (SQLite also needs to write its folder): a search "
                         f"writes every trial; make it writable, or read it with `skipsearch study show`")


def _check_study_path(study_dir: str | Path) -> None:
    """A study folder that is a file, or whose study.db is not a regular file (a folder, a named pipe that SQLite
    would wait on for ever), in one line."""
    folder, db = Path(study_dir), Path(study_dir) / "study.db"
    if folder.exists() and not folder.is_dir():
        raise StudyError(f"'{study_dir}' is a file, not a study folder")
    if db.exists() and not db.is_file():
        raise StudyError(f"study file '{db}' is not a regular file: move it away to start afresh")


# -- liveness: heartbeats and lost trials ------------------------------------------------------------


@contextlib.contextmanager
def _quiet_optuna() -> Iterator[None]:
    # Heartbeats are "experimental" in Optuna and "supposed to be used with Study.optimize"; they serve
    # ask/tell as well when the runner beats itself (``heartbeat``), which is what these warnings doubt.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        yield


def fail_lost_trials(study: optuna.Study) -> None:
    """Fail the RUNNING trials whose worker is provably gone (no heartbeat for GRACE_SECONDS)."""
    if isinstance(_STORAGES.get(study), optuna.storages.RDBStorage):
        with _quiet_optuna():
            try:
                optuna.storages.fail_stale_trials(study)
            except Exception as e:  # a busy storage: the next look tries again
                if not storage_conflict(e):
                    raise


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


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
    storage = _STORAGES.get(study)
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


def other_local_workers(study: optuna.Study) -> list[str]:
    """Other live skipsearch workers on this machine, seen through the study's running trials.

    Their decoding shares this machine's cores and memory bandwidth, so timings taken now are not
    the machine's own: the caller flags or refuses them."""
    host, me = socket.gethostname(), worker_id()
    fail_lost_trials(study)
    running = study.get_trials(deepcopy=False, states=(_STATES.RUNNING,))
    found = {t.user_attrs.get(WORKER_ATTR) for t in running}
    return sorted(w for w in found if w and w != me and w.split(":", 1)[0] == host)


def share_cores(workers: int) -> str | None:
    """Give this process its share of the machine's cores when ``workers`` skipsearch workers run on it: each
    taking every core (torch's default) oversubscribes them, and all of them crawl (on 2 cores, two default
    workers took over 4x as long as one). Returns the one line that says so, or None when nothing changed
    (one worker, or already at most its share, e.g. under OMP_NUM_THREADS=1)."""
    try:
        import torch
    except ImportError:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    fair, have = max(1, cores // max(workers, 1)), torch.get_num_threads()
    if workers <= 1 or have <= fair:
        return None
    torch.set_num_threads(fair)
    return (f"{workers} skipsearch workers share this machine's {cores} cores: this one now uses {fair} torch "
            f"thread(s), not {have}")


def contention(study: optuna.Study) -> str | None:
    """Why a timing taken now would not be this machine's own, or None."""
    others = other_local_workers(study)
    if others:
        return f"timed while another skipsearch worker ran on this machine ({', '.join(others)})"
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores + 0.5:  # this process accounts for about one
        return f"timed under load average {load:.1f} on {cores} cores"
    return None


def stamp_model(study: optuna.Study, *, name: str, num_layers: int, fingerprint: str | None) -> None:
    """Record the model a search runs on, once: re-ranking or planning from the study checks it."""
    if MODEL_ATTR not in study.user_attrs:
        try:
            study.set_user_attr(MODEL_ATTR, {"name": name, "num_layers": num_layers, "fingerprint": fingerprint})
        except Exception as e:  # a busy storage: the record is a convenience, the space already names the depth
            if not storage_conflict(e):
                raise


def check_study_model(label: str, attrs: dict, *, model: str, num_layers: int, fingerprint: str | None = None,
                      force: bool = False) -> None:
    """Refuse, in one line, a study made for another model than ``model`` (``num_layers`` deep): its skip sets
    name other layers, and its timings are another model's. A study that recorded its model's fingerprint is
    also checked by it (``force`` lets a different fingerprint of the same depth through)."""
    made = attrs.get(MODEL_ATTR) if isinstance(attrs.get(MODEL_ATTR), dict) else {}
    space = attrs.get(SPACE_ATTR) if isinstance(attrs.get(SPACE_ATTR), dict) else {}
    layers = made.get("num_layers", space.get("num_layers"))
    if layers is not None and layers != num_layers:
        who = f" ({made['name']})" if made.get("name") else ""
        raise StudyError(f"study {label} was made for a {layers}-layer model{who}, not {model} ({num_layers} layers): "
                         f"give its --model, or another study")
    if not force and fingerprint and made.get("fingerprint") and made["fingerprint"] != fingerprint:
        raise StudyError(f"study {label} was made for model {made.get('name')} (fingerprint {made['fingerprint']}), "
                         f"not {model} ({fingerprint}): give its --model, or --force to use it anyway")


def load_records(*, study_dir: str | Path | None = None, storage: str | None = None,
                 study_name: str | None = None) -> tuple[str, list[TrialRecord]]:
    """Read an existing study without a strategy (for ``skipsearch study show``)."""
    label, recs, _ = load_study(study_dir=study_dir, storage=storage, study_name=study_name)
    return label, recs


def load_study(*, study_dir: str | Path | None = None, storage: str | None = None,
               study_name: str | None = None) -> tuple[str, list[TrialRecord], dict]:
    """``load_records``, and the study's user attrs (its strategy, space and model).

    Reading never writes: the storage is looked at first (SQLite opened read-only) and must hold
    Optuna's tables, and Optuna is then told not to create any, so pointing this at some other
    database leaves it exactly as it was.
    """
    if storage is None:
        if study_dir is None:
            raise StudyError("give a study directory or --storage")
        db = Path(study_dir) / "study.db"
        _check_study_path(study_dir)
        if not db.is_file():
            raise StudyError(f"no study at '{study_dir}' (no study.db there)")
        storage = f"sqlite:///{db.resolve()}"
    # A study directory's study is named after it, unless the directory was renamed since: then
    # its only study is the one.
    default = Path(study_dir).resolve().name if study_dir is not None else None
    name = study_name
    engine_kwargs = _check_optuna_storage(storage)
    try:
        rdb = optuna.storages.RDBStorage(storage, engine_kwargs=engine_kwargs, skip_table_creation=True)
        names = [s.study_name for s in optuna.get_all_study_summaries(rdb, include_best_trial=False)]
        if name is None and default not in names and len(names) != 1:
            held = f"{len(names)} studies ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
            raise StudyError(f"'{_shown(storage)}' holds {held if names else 'no study'}: give --study-name")
        name = name or (default if default in names else names[0])
        if name not in names:
            raise StudyError(f"no study '{name}' in '{_shown(storage)}' (it holds: {', '.join(names) or 'none'})")
        study = optuna.load_study(study_name=name, storage=rdb)
    except StudyError:
        raise
    except Exception as e:  # sqlalchemy, driver and Optuna errors vary by backend: the first line says it
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise StudyError(f"cannot read study '{name or '?'}' from '{_shown(storage)}': {first}") from None
    try:
        recs = records(study)
    except Exception as e:  # noqa: BLE001 - a trial's attrs in another shape: KeyError, TypeError, ...
        raise StudyError(f"study '{name}' in '{_shown(storage)}' has trials skipsearch did not write "
                         f"({_one_line(e)})") from None
    label = f"{name} [{study.user_attrs.get(STRATEGY_ATTR, '?')}]"
    return label, recs, dict(study.user_attrs)


def _check_optuna_storage(url: str) -> dict:
    """Refuse a storage that is not an Optuna one, without writing to it; return the engine
    arguments to read it with (a bounded connect timeout, so an unreachable server fails in seconds)."""
    import sqlite3
    import urllib.parse

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception:  # noqa: BLE001 - ArgumentError, ValueError: not a URL at all
        raise StudyError(f"'{_shown(url)}' is not a database URL (e.g. sqlite:///study.db, postgresql://...)") from None
    shown = _shown(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database
        if not path or path == ":memory:" or not Path(path).is_file():
            raise StudyError(f"no study at '{shown}' (no such database file)")
        try:  # mode=ro: SQLite itself refuses any write, and never creates the file
            conn = sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=ro", uri=True)
            try:
                tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            finally:
                conn.close()
        except sqlite3.Error as e:
            raise StudyError(f"'{path}' is not an Optuna study (not a SQLite database: {e})") from None
        engine_kwargs: dict = {}
    else:
        engine_kwargs = {"connect_args": {"connect_timeout": 5}} if parsed.get_backend_name() in (
            "postgresql", "mysql") else {}
        try:
            engine = sqlalchemy.create_engine(url, **engine_kwargs)
            try:
                tables = set(sqlalchemy.inspect(engine).get_table_names())
            finally:
                engine.dispose()
        except ImportError as e:
            raise StudyError(f"cannot read '{shown}': its database driver is not installed ({e}); install it, "
                             f"or name an installed one in the URL, e.g. postgresql+psycopg2://") from None
        except Exception as e:  # noqa: BLE001 - server unreachable, login refused: the first line says which
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise StudyError(f"cannot read '{shown}': {first}") from None
    if not {"studies", "trials", "version_info"} <= tables:
        where = parsed.database if parsed.get_backend_name() == "sqlite" else shown
        raise StudyError(f"'{where}' is not an Optuna study (it has no Optuna tables)")
    return engine_kwargs


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


def trial_candidate(t: optuna.trial.FrozenTrial) -> Candidate | None:
    """The candidate a trial evaluated (or is evaluating); None before it had one.

    Studies made before methods were recorded hold layer-skip configs only: their trials have no method."""
    raw = t.user_attrs.get(CONFIG_ATTR)
    if raw is None:
        return None
    from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP  # the default of old studies

    return Candidate(t.user_attrs.get(METHOD_ATTR, LAYER_SKIP.name), config_from_dict(raw),
                     t.user_attrs.get(PARAMS_ATTR) or ())


LOST = "lost: its worker stopped sending heartbeats"


def _record(t: optuna.trial.FrozenTrial) -> TrialRecord:
    measurement = t.user_attrs.get(MEASUREMENT_ATTR)
    error = t.user_attrs.get(ERROR_ATTR)
    if t.state == _STATES.FAIL and error is None:
        # skipsearch records an error before it fails a trial; only Optuna's stale-heartbeat check, for a
        # worker that was killed, fails one without (its attrs are frozen by then).
        error = LOST
    return TrialRecord(number=t.number, state=t.state.name, candidate=trial_candidate(t),
                       measurement=Measurement.from_dict(measurement) if measurement is not None else None,
                       error=error)


def records(study: optuna.Study) -> list[TrialRecord]:
    """Every trial that has started, in order (enqueued ones still waiting are left out)."""
    return [_record(t) for t in study.get_trials(deepcopy=False) if t.state != _STATES.WAITING]


STUDY_COLUMNS = ("#", "kind", "speedup", "predicted", "tau", "accept", "candidate")


def study_table(recs: list[TrialRecord], *, top: int = 10) -> list[tuple[str, ...]]:
    """What ``skipsearch study show`` lists (STUDY_COLUMNS): the ``top`` measured trials, timed ones first, best
    first, each as one row of text. A candidate is shown whole, method and parameters with its draft config:
    an ngram trial is ``ngram min_n=1 max_n=3 K=4``, not the layer-skip config it carries."""
    from skipsearch.methods.summary import candidate_summary

    done = [r for r in recs if r.measurement is not None]
    rows = []
    for r in sorted(done, key=lambda r: (r.measurement.kind != "timed", -r.measurement.speedup))[:top]:
        m = r.measurement
        rows.append((str(r.number), m.kind, f"{m.speedup:.3f}x", f"{m.predicted_speedup or 0:.3f}x",
                     f"{m.tau or 0:.2f}", "-" if m.acceptance_rate is None else f"{m.acceptance_rate:.2f}",
                     candidate_summary(r.candidate) if r.candidate is not None else "-"))
    return rows


def _completed(study: optuna.Study, kind: str) -> list[TrialRecord]:
    done = (_record(t) for t in study.get_trials(deepcopy=False, states=(_STATES.COMPLETE,)))
    return [r for r in done if r.config is not None and r.measurement is not None and r.measurement.kind == kind]


def _ranked(study: optuna.Study, kind: str) -> list[TrialRecord]:
    return sorted(_completed(study, kind), key=lambda r: (-r.measurement.speedup, r.number))


def shortlist(study: optuna.Study, n: int, *, kind: Kind = "surrogate") -> list[Candidate]:
    """The best ``n`` distinct candidates measured as ``kind``, best first."""
    out: list[Candidate] = []
    for r in _ranked(study, kind):
        if len(out) >= n:
            break
        if r.candidate not in out:
            out.append(r.candidate)
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


def _earlier_twin(study: optuna.Study, candidate: Candidate, kind: str, number: int, *,
                  shared: bool = False) -> TrialRecord | None:
    """The completed trial that already measured ``config`` as ``kind``, if any.

    Workers sharing a study must not measure one config twice. Every trial announces its config
    (step 2 of ``run_search``) before it gets here. In a shared study it then waits one poll
    period, so that every twin announced before that is visible, and yields to any twin that is
    already evaluating, or to an announced twin with a lower number; the twin's measurement is
    reused when it completes. Only these two rules decide, so two workers never wait for each
    other, and one that announced more than a poll period after another finds it evaluating.
    If the twin fails, or its worker is lost (no heartbeat for GRACE_SECONDS), this trial evaluates
    the candidate itself.
    """
    if shared:
        time.sleep(TWIN_POLL_SECONDS)
    while True:
        yield_to = False
        for t in study.get_trials(deepcopy=False, states=(_STATES.COMPLETE, _STATES.RUNNING)):
            if t.number == number or t.user_attrs.get(CONFIG_ATTR) is None:
                continue
            r = _record(t)
            if r.candidate != candidate:
                continue
            if r.measurement is not None and r.measurement.kind == kind:
                return r
            if t.state == _STATES.RUNNING and t.user_attrs.get(KIND_ATTR) == kind and not t.user_attrs.get(ERROR_ATTR):
                yield_to = yield_to or t.user_attrs.get(EVALUATING_ATTR, False) or t.number < number
        if not yield_to:
            return None
        time.sleep(TWIN_POLL_SECONDS)
        fail_lost_trials(study)


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
    start, ran, failed, conflicts = time.perf_counter(), 0, 0, []
    neighbours = 0  # other live workers on this machine, last seen
    while True:
        fail_lost_trials(study)  # a dead worker's trial must not hold the budget, nor a twin, for ever
        if _used(study) >= budget:
            break
        try:
            # 1. the strategy may fix the next trial's params (seeds, its own model's proposal)
            params = strategy.next_params(study)
            if params is not None:
                study.enqueue_trial(params)
            with _quiet_optuna():
                trial = study.ask()
        except Exception as e:  # a busy storage: look again (a persistent one ends the search in one line)
            if not storage_conflict(e):
                raise
            conflicts.append(f"could not start a trial: {_one_line(e)}")
            if len(conflicts) > 10 * WRITE_ATTEMPTS:
                raise StudyError(f"the storage keeps refusing writes: {conflicts[-1]}") from None
            time.sleep(0.2 * min(len(conflicts), WRITE_ATTEMPTS))
            continue
        candidate = measurement = error = None
        try:
            with heartbeat(study, trial.number):
                trial.set_user_attr(WORKER_ATTR, worker_id())
                if isinstance(_STORAGES.get(study), optuna.storages.RDBStorage):
                    others = len(other_local_workers(study))
                    if others > neighbours:  # more workers on these cores than before: take this one's share
                        shared = share_cores(others + 1)
                        if shared:
                            warnings.warn(shared, RuntimeWarning, stacklevel=2)
                    neighbours = others
                # 2. params -> candidate, recorded before evaluation so a failed trial still shows it
                candidate = strategy.suggest(trial)
                for key, value in candidate_attrs(candidate).items():
                    trial.set_user_attr(key, value)
                trial.set_user_attr(KIND_ATTR, kind)
                # 3. evaluate, or reuse the measurement of the same candidate: a repeat costs nothing
                earlier = _earlier_twin(study, candidate, kind, trial.number, shared=strategy.shared)
                if earlier is not None:
                    measurement = replace(earlier.measurement, seconds=0.0)
                    trial.set_user_attr(REUSED_ATTR, earlier.number)
                else:
                    if strategy.shared:
                        trial.set_user_attr(EVALUATING_ATTR, True)  # twins announced from now on wait for this one
                    busy = contention(study) if kind == "timed" else None
                    measurement = objective.evaluate(candidate, kind=kind)
                    busy = busy or (contention(study) if kind == "timed" else None)
                    if busy:  # recorded, and never shipped: see optimize's verdict
                        measurement = replace(measurement, notes=busy)
                if not math.isfinite(measurement.speedup):
                    raise ValueError(f"the objective returned speedup {measurement.speedup}")
                trial.set_user_attr(MEASUREMENT_ATTR, measurement.to_dict())
        except KeyboardInterrupt:
            finish_trial(study, trial, error="interrupted")  # a conflict here changes nothing: stopping
            raise
        except Exception as e:
            # Our own writes may have met another worker: it finished this trial (it judged us lost), or the
            # storage was busy. Either way the trial is failed here if it still can be, never written again.
            measurement, error = None, _one_line(e)
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
            on_trial(TrialRecord(trial.number, state, candidate, measurement, error), best(study))
    return SearchSummary(trials_total=_used(study), trials_run_here=ran, failed=failed, best=best(study),
                         seconds=time.perf_counter() - start, conflicts=tuple(conflicts))
