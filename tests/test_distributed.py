"""Several worker processes sharing one study in a real PostgreSQL server.

The server comes from Debian's `postgresql` package (`.ci/run` installs it). Where it is not
installed these tests skip, unless SKIPSEARCH_REQUIRE_POSTGRES=1 (set by `.ci/run`) makes that
a failure, so CI cannot pass without having run them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest
from pg import Server, find_bindir

from skipsearch.search.study import load_records, open_study

pytestmark = pytest.mark.postgres
HERE = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def pg_url():
    bindir = find_bindir()
    if bindir is None:
        if os.environ.get("SKIPSEARCH_REQUIRE_POSTGRES") == "1":
            pytest.fail("PostgreSQL is not installed (apt-get install postgresql), and SKIPSEARCH_REQUIRE_POSTGRES=1")
        pytest.skip("PostgreSQL is not installed: apt-get install postgresql")
    server = Server(bindir)
    try:
        yield server.start()
    finally:
        server.stop()


def _evaluated(logs: list[Path]) -> list[list[dict]]:
    return [[json.loads(line) for line in log.read_text().splitlines()] if log.exists() else [] for log in logs]


@pytest.mark.parametrize("strategy", ["tpe", "bayes"])
def test_two_workers_share_one_study_with_no_duplicate_trials(pg_url, tmp_path, strategy):
    budget, name = 40, f"two-workers-{strategy}"
    logs = [tmp_path / f"worker{i}.jsonl" for i in range(2)]
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "distributed_worker.py"), pg_url, name, strategy, str(budget),
                          str(log)], env=ENV, stderr=subprocess.PIPE, text=True)
        for log in logs
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]

    study = optuna.load_study(study_name=name, storage=pg_url)
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state.name for t in trials)
    # every trial finished; the budget is met, overshot by at most one trial per extra worker
    assert set(states) == {"COMPLETE"}, states
    assert budget <= len(trials) <= budget + 1
    numbers = [t.number for t in trials]
    assert len(set(numbers)) == len(numbers)
    # both workers took part, and no config was evaluated twice, by one worker or across the two
    per_worker = _evaluated(logs)
    assert all(per_worker), [len(w) for w in per_worker]
    evaluated = [json.dumps(c, sort_keys=True) for w in per_worker for c in w]
    assert len(evaluated) == len(set(evaluated)), Counter(evaluated).most_common(3)
    # every trial's config was evaluated by a worker; repeats reuse the first measurement
    configs = {json.dumps(t.user_attrs["config"], sort_keys=True) for t in trials}
    assert configs == set(evaluated)
    reused = [t for t in trials if "reused_from" in t.user_attrs]
    assert len(evaluated) + len(reused) == len(trials)
    assert all(t.user_attrs["config"] == trials[t.user_attrs["reused_from"]].user_attrs["config"] for t in reused)


def test_a_bad_storage_url_is_one_clear_line(tmp_path):
    from skipsearch.search.space import SearchSpace
    from skipsearch.search.strategies import make_strategy
    from skipsearch.search.study import StudyError

    strategy = make_strategy("tpe", SearchSpace(num_layers=6))
    with pytest.raises(StudyError, match=r"cannot open storage 'postgresql\+psycopg2://u:\*\*\*@127.0.0.1:1/x'") as e:
        open_study(storage="postgresql+psycopg2://u:secret@127.0.0.1:1/x", study_name="s", strategy=strategy)
    assert "secret" not in str(e.value) and "\n" not in str(e.value)


def test_two_optimize_processes_share_a_postgres_study(pg_url, tiny_checkpoint, tmp_path):
    """`skipsearch optimize` itself, twice at once (a tiny random checkpoint: the storage is under test, not
    the model): one study, nothing timed twice, both workers ship a profile."""
    name = "cli-two-workers"
    cmd = [sys.executable, "-m", "skipsearch", "optimize", "--model", str(tiny_checkpoint), "--strategy", "tpe",
           "--budget", "8", "--n-prompts", "1", "--max-new-tokens", "8", "--shortlist", "2", "--dataset", "humaneval",
           "--storage", pg_url, "--study-name", name]
    procs = [subprocess.Popen([*cmd, "--out", str(tmp_path / f"w{i}.yaml")], env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
    _, recs = load_records(storage=pg_url, study_name=name)
    surrogate = [r for r in recs if r.measurement is not None and r.measurement.kind == "surrogate"]
    timed = [r for r in recs if r.measurement is not None and r.measurement.kind == "timed"]
    assert 8 <= len(surrogate) <= 9
    assert timed and len({r.config for r in timed}) == len(timed)  # no config timed twice
    assert all(r.state in ("COMPLETE", "FAIL") for r in recs)
    for i in range(2):
        assert (tmp_path / f"w{i}.yaml").exists()
