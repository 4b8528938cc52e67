"""Opening a study: created or resumed for a strategy and its search space, checked against the model it was
made for, or read without writing (``study show``, re-ranking, planning); its storage checked before a model
loads."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import optuna
import sqlalchemy

from skipsearch.search.strategies import Strategy
from skipsearch.search.study.record import (
    MODEL_ATTR,
    PRECISION_KEY,
    SEED_ATTR,
    SPACE_ATTR,
    STRATEGY_ATTR,
    StudyError,
    TrialRecord,
    one_line,
    records,
)
from skipsearch.search.study.storage import keep_storage, quiet_optuna, rdb_storage
from skipsearch.search.study.workers import fail_lost_trials

OPEN_ATTEMPTS = 5  # tries to create-or-load a study that other workers may be creating right now


def _space_dict(strategy: Strategy) -> dict:
    return json.loads(json.dumps(asdict(strategy.space)))  # tuples as lists, as the storage gives them back


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
            with quiet_optuna():
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
    keep_storage(study, backend)
    check_or_stamp(study, strategy)
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
            raise StudyError(f"cannot use '{_shown(storage)}': {one_line(e)}") from None
        if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
            return
        db = Path(url.database)
    elif study_dir is not None:
        _check_study_path(study_dir)
        db = Path(study_dir) / "study.db"
    else:
        return
    if db.exists() and not db.is_file():  # a folder, or a named pipe that SQLite would wait on for ever
        raise StudyError(f"study file '{db}' is not a regular file: move it away to start afresh")
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


def check_study_precision(label: str, attrs: dict, precision: str) -> None:
    """Refuse, in one line, a study whose trials ran on another target precision than ``precision``
    (model/target.py; a study that recorded none ran on the native target): its timings are another model's."""
    made = attrs.get(MODEL_ATTR) if isinstance(attrs.get(MODEL_ATTR), dict) else {}
    if made and made.get(PRECISION_KEY, "native") != precision:
        raise StudyError(f"study {label}'s trials ran on the {made.get(PRECISION_KEY, 'native')} target, not the "
                         f"{precision} one: give another --study")


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
                         f"({one_line(e)})") from None
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
        if path and path != ":memory:" and Path(path).exists() and not Path(path).is_file():
            raise StudyError(f"study file '{path}' is not a regular file: it holds no study")
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


def check_or_stamp(study: optuna.Study, strategy: Strategy) -> None:
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
