"""Search workers as processes: killed, interrupted, and sharing a study. Storage behaviour, not the
model's, so every test runs `skipsearch optimize` on a tiny random checkpoint (conftest) in seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from skipsearch.search.study import GRACE_SECONDS

HERE = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}
_STATES = optuna.trial.TrialState


def _cmd(checkpoint: Path, study_dir: Path, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "skipsearch", "optimize", "--model", str(checkpoint), "--strategy", "tpe",
            "--n-prompts", "1", "--max-new-tokens", "8", "--dataset", "humaneval", "--study", str(study_dir),
            "--out", str(out), *args]


def _trials(study_dir: Path) -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{study_dir / 'study.db'}"
    try:
        return optuna.load_study(study_name=study_dir.name, storage=storage).get_trials(deepcopy=False)
    except Exception:  # not created yet
        return []


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
    assert predicate(), proc.stderr.read()[-2000:] if proc.poll() is not None else "timed out"


def test_sigkill_mid_search_then_the_same_command_resumes(tiny_checkpoint, tmp_path):
    """Kill -9 a running search; the same command resumes with every finished trial intact, and the killed
    trial is failed once its worker is provably gone (no heartbeat for the grace period)."""
    study_dir, out = tmp_path / "study", tmp_path / "p.yaml"
    cmd = _cmd(tiny_checkpoint, study_dir, out, "--objective", "surrogate")

    def finished() -> dict[int, dict]:
        return {t.number: dict(t.user_attrs) for t in _trials(study_dir) if t.state == _STATES.COMPLETE}

    proc = subprocess.Popen([*cmd, "--budget", "5000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    _wait_for(lambda: len(finished()) >= 4, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = finished()
    assert not out.exists()  # killed mid-search: nothing was written
    running = [t.number for t in _trials(study_dir) if t.state == _STATES.RUNNING]
    assert len(running) <= 1
    time.sleep(GRACE_SECONDS + 2)  # its heartbeat goes stale: only now is the worker provably gone
    counted = [t for t in _trials(study_dir) if t.state != _STATES.WAITING]  # enqueued seeds are not trials yet
    again = subprocess.run([*cmd, "--budget", str(len(counted) + 3)], capture_output=True, text=True, timeout=600,
                           env=ENV)
    assert again.returncode == 0, again.stderr[-2000:]
    trials = _trials(study_dir)
    after = {t.number: dict(t.user_attrs) for t in trials if t.state == _STATES.COMPLETE}
    assert all(after[n] == attrs for n, attrs in before.items())  # every finished trial intact
    assert len(after) == len(before) + 3
    assert _STATES.RUNNING not in {t.state for t in trials}
    from skipsearch.search.study import LOST, load_records

    errors = {r.number: r.error for r in load_records(study_dir=study_dir)[1]}
    for number in running:  # the killed trial: failed, and the record says why
        assert trials[number].state == _STATES.FAIL and errors[number] == LOST
    assert out.exists()


def test_a_second_search_on_a_live_study_neither_kills_the_first_nor_ships_its_timings(tmp_path):
    """Two `optimize` on one study at once: the second must not fail the first's live trial (it has a
    heartbeat), the first must not crash, and timings taken while both ran are flagged, never shipped."""
    from conftest import save_tiny_checkpoint, tiny_llama

    # 12 layers: enough distinct drafts that the second search times new ones rather than reusing twins
    tiny_checkpoint = save_tiny_checkpoint(tmp_path / "ckpt", tiny_llama(num_hidden_layers=12))
    study_dir = tmp_path / "study"
    # a Ctrl-C as a terminal sends it: SIGINT at its default in the child, even where this test runs as a
    # background job (a non-interactive shell starts those with SIGINT ignored, and Python then keeps ignoring it)
    first = subprocess.Popen([*_cmd(tiny_checkpoint, study_dir, tmp_path / "a.yaml", "--objective", "timed"),
                              "--budget", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for(lambda: sum(t.state == _STATES.COMPLETE for t in _trials(study_dir)) >= 3, first)
        # the budget counts the whole study, and the first search goes on adding trials while the second loads
        budget = len([t for t in _trials(study_dir) if t.state != _STATES.WAITING]) + 40
        second = subprocess.run([*_cmd(tiny_checkpoint, study_dir, tmp_path / "b.yaml", "--objective", "timed"),
                                 "--budget", str(budget)], capture_output=True, text=True, timeout=600, env=ENV)
        assert second.returncode == 0, second.stderr[-2000:]
        assert first.poll() is None, first.stderr.read()[-2000:]  # the first search is still running
    finally:
        first.send_signal(signal.SIGINT)
        try:
            _, err = first.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # say what it was doing, rather than only that it overran
            first.kill()
            _, err = first.communicate()
            pytest.fail(f"the first search did not stop within 120 s of Ctrl-C; its stderr ends: {err[-3000:]}")
    assert first.returncode == 130 and "Traceback" not in err, err[-2000:]  # Ctrl-C: the best so far is shipped
    assert (tmp_path / "a.yaml").exists() and (tmp_path / "b.yaml").exists()
    trials = _trials(study_dir)
    from skipsearch.search.study import LOST, load_records

    assert LOST not in {r.error for r in load_records(study_dir=study_dir)[1]}  # nobody was failed as lost
    # both searches ran trials (a seed still enqueued, or a trial the Ctrl-C failed before it was tagged, has none)
    workers = {t.user_attrs.get("worker") for t in trials if t.state == _STATES.COMPLETE}
    assert len(workers) == 2 and None not in workers
    notes = [str(t.user_attrs.get("measurement", {}).get("notes")) for t in trials]
    assert [n for n in notes if "another skipsearch worker" in n]  # timings taken while the other ran say so...
    from skipsearch.profile import load_profile

    shipped = load_profile(tmp_path / "b.yaml")
    assert shipped.measured.speedup is None or shipped.draft.max_draft_tokens == 0 or \
        "another skipsearch worker" not in str(shipped.measured.notes)  # ...and none of them is shipped


def test_two_workers_creating_one_sqlite_study_at_once_both_finish(tiny_checkpoint, tmp_path):
    study_dir = tmp_path / "study"
    procs = [subprocess.Popen([*_cmd(tiny_checkpoint, study_dir, tmp_path / f"w{i}.yaml", "--objective", "surrogate"),
                               "--budget", "6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0 and "Traceback" not in err, err[-2000:]
    trials = _trials(study_dir)
    assert all(t.state == _STATES.COMPLETE for t in trials if t.state != _STATES.WAITING)


@pytest.mark.parametrize("args, fragment", [
    (["--shortlist", "-1"], "--shortlist must be >= 1, got -1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["--budget", "0"], "--budget must be >= 1, got 0"),
])
def test_bad_counts_are_one_line_before_the_model_loads(tiny_checkpoint, tmp_path, args, fragment):
    from conftest import assert_one_line_error
    from typer.testing import CliRunner

    from skipsearch.cli import app

    result = CliRunner().invoke(app, _cmd(tiny_checkpoint, tmp_path / "s", tmp_path / "p.yaml", *args)[3:])
    assert_one_line_error(result, fragment)


def test_ctrl_c_in_the_first_trial_ships_without_measuring_the_cost_model(tiny_sm, monkeypatch, tmp_path):
    """Ctrl-C before anything was measured returns at once: the verdict never measures costs on the way out
    (it used to, which took 15 s on this CPU and minutes on a loaded one)."""
    from skipsearch.search import objective
    from skipsearch.search import optimize as opt

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    def never(*args, **kwargs):
        raise AssertionError("the cost model was measured after Ctrl-C")

    monkeypatch.setattr("skipsearch.engine.calibration.encode_prompt",
                        lambda tokenizer, prompt: [3, 17, 5, len(prompt.text) % 60])
    monkeypatch.setattr(opt, "run_search", interrupted)
    monkeypatch.setattr(objective, "measure_costs", never)
    result = opt.optimize(tiny_sm, opt.SearchSettings(budget=5, n_prompts=1, max_new_tokens=8,
                                                      study=str(tmp_path / "s")))
    assert result.interrupted and result.profile.draft.max_draft_tokens == 0
    assert "no draft candidate beat plain decoding" in result.verdict
