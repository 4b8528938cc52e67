"""What Optuna's SQLite storage costs a surrogate search, without any model: the README search's 540-point grid
(3 parameters), each trial asked, its 3 parameters suggested, 6 user attributes set (as the runner sets them),
told, and the study's trials read twice (the runner's twin check and ranking), on a new SQLite study in /tmp.

    .venv/bin/python studies/startup/optuna_overhead.py [wal]

wal: the same with SQLite's write-ahead log (PRAGMA journal_mode=WAL, synchronous=NORMAL), for comparison."""

import collections
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

import optuna
from sqlalchemy import event

optuna.logging.set_verbosity(optuna.logging.WARNING)
wal = sys.argv[1:] == ["wal"]
folder = Path(tempfile.mkdtemp())
storage = optuna.storages.RDBStorage(f"sqlite:///{folder}/study.db")
if wal:
    @event.listens_for(storage.engine, "connect")
    def _wal(connection, _):
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()
    storage.engine.dispose()


class Grid(optuna.samplers.GridSampler):  # as skipsearch's: the runner stops at the grid's size itself
    def after_trial(self, study, trial, state, values):
        return None


grid = {"fallback": list(range(6)), "k": list(range(10)), "n": list(range(9))}
study = optuna.create_study(storage=storage, sampler=Grid(grid, seed=0), study_name="overhead")
spent, began = collections.Counter(), time.perf_counter()


@contextlib.contextmanager
def timed(what: str):
    t = time.perf_counter()
    yield
    spent[what] += time.perf_counter() - t


for i in range(540):
    with timed("ask"):
        trial = study.ask()
    with timed("suggest (3)"):
        for name, values in grid.items():
            trial.suggest_categorical(name, values)
    with timed("user attrs (6)"):
        for j in range(6):
            trial.set_user_attr(f"attr{j}", i)
    with timed("tell"):
        study.tell(trial, float(i))
    with timed("reads (2)"):
        for _ in range(2):
            study.get_trials(deepcopy=False)
total = time.perf_counter() - began
print(f"{'wal' if wal else 'default'}: 540 trials in {total:.1f} s ({1000 * total / 540:.0f} ms a trial): "
      + ", ".join(f"{k} {v:.1f} s" for k, v in spent.items()), flush=True)
shutil.rmtree(folder)
