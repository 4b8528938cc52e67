"""The study runner: storage, budget, resume, failures, interrupts and the measurement cache."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from skipsearch.config import Candidate, DraftConfig, ExitRule
from skipsearch.measure import Measurement
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies import REGISTRY, Strategy, make_strategy
from skipsearch.search.study import (
    SearchSummary,
    StudyError,
    TrialRecord,
    best,
    config_from_dict,
    config_to_dict,
    open_study,
    records,
    run_search,
    shortlist,
    study_table,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = SearchSpace(num_layers=8)


class Objective:
    """speedup grows with skipped attention; raises on the call numbers it is told to."""

    def __init__(self, *, fail_on=(), interrupt_on=None, timed_penalty=0.5) -> None:
        self.calls: list[tuple[DraftConfig, str]] = []
        self.fail_on, self.interrupt_on, self.timed_penalty = set(fail_on), interrupt_on, timed_penalty

    def evaluate(self, candidate: Candidate, *, kind: str) -> Measurement:
        config = candidate.draft
        n = len(self.calls)
        self.calls.append((config, kind))
        if n == self.interrupt_on:
            raise KeyboardInterrupt
        if n in self.fail_on:
            raise RuntimeError(f"out of memory\n  on call {n}")
        speedup = 1.0 + 0.1 * len(config.skip_attn) - 0.1 * len(config.skip_mlp)
        return Measurement(kind=kind, speedup=speedup - (self.timed_penalty if kind == "timed" else 0.0),
                           seconds=0.5)


@pytest.fixture
def fast_dir(tmp_path):
    """A directory in memory where there is one: SQLite commits each parameter, and on a slow disk
    each commit's fsync costs ~10 ms. The storage behaves the same either way."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and shutil.disk_usage(shm).free > 100e6):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="skipsearch-test-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def opened(fast_dir, name="tpe", *, seed=0, space=SPACE, **kwargs):
    strategy = make_strategy(name, space, seed=seed)
    return open_study(study_dir=fast_dir / "study-a", strategy=strategy, **kwargs), strategy


def test_sqlite_study_in_the_study_dir_and_budget_respected(fast_dir):
    study, strategy = opened(fast_dir)
    assert (fast_dir / "study-a" / "study.db").is_file() and study.study_name == "study-a"
    seen = []
    summary = run_search(study, strategy, Objective(), budget=7, on_trial=lambda r, b: seen.append((r, b)))
    assert isinstance(summary, SearchSummary)
    assert (summary.trials_total, summary.trials_run_here, summary.failed) == (7, 7, 0)
    recs = records(study)
    assert [r.number for r in recs] == list(range(7)) and {r.state for r in recs} == {"COMPLETE"}
    assert [r.number for r, _ in seen] == list(range(7))
    assert all(isinstance(r, TrialRecord) and r.measurement.kind == "surrogate" for r, _ in seen)
    assert seen[-1][1] == summary.best == max(recs, key=lambda r: (r.measurement.speedup, -r.number))
    # what `study show` lists: the best first, at most ``top`` rows, each trial's number and speedup
    rows = study_table(recs, top=3)
    ranked = sorted(recs, key=lambda r: (-r.measurement.speedup, r.number))
    assert len(rows) == 3 and [row[0] for row in rows] == [str(r.number) for r in ranked[:3]]
    assert rows[0][2] == f"{summary.best.measurement.speedup:.3f}x"


def test_study_show_lists_each_trial_with_its_method_and_parameters(fast_dir):
    from typer.testing import CliRunner

    from skipsearch.cli import app

    study, strategy = opened(fast_dir, "ngram", space=SearchSpace(num_layers=8, max_draft_tokens=(2, 4)))
    run_search(study, strategy, Objective(), budget=3)
    recs = records(study)
    rows = {int(row[0]): row[-1].split() for row in study_table(recs)}
    assert sorted(rows) == [r.number for r in recs]
    for r in recs:  # an ngram trial is shown as one, with its parameters, not as the layer-skip config it carries
        params = dict(r.candidate.params)
        assert rows[r.number][0] == "ngram" and f"K={r.config.max_draft_tokens}" in rows[r.number]
        assert {f"min_n={params['min_n']}", f"max_n={params['max_n']}"} <= set(rows[r.number])
        assert not any(word.startswith(("attn[", "mlp[")) for word in rows[r.number])
    result = CliRunner().invoke(app, ["study", "show", str(fast_dir / "study-a")])
    assert result.exit_code == 0, result.output
    assert "ngram" in result.stdout and "min_n=" in result.stdout and "attn[" not in result.stdout


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_rerun_with_a_larger_budget_resumes(fast_dir, name):
    study, strategy = opened(fast_dir, name)
    run_search(study, strategy, Objective(), budget=5)
    before = records(study)
    # A new process: a fresh strategy and study object on the same directory.
    study, strategy = opened(fast_dir, name)
    objective = Objective()
    summary = run_search(study, strategy, objective, budget=9)
    after = records(study)
    assert after[:5] == before
    assert [r.number for r in after] == list(range(9)) and summary.trials_run_here == 4
    assert len(objective.calls) <= 4
    assert run_search(study, strategy, Objective(), budget=9).trials_run_here == 0  # budget already spent
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert not waiting


def test_seed_points_are_enqueued_once_per_study(fast_dir):
    study, strategy = opened(fast_dir, "tpe")
    seeds = len(strategy.plan().seeds)
    run_search(study, strategy, Objective(), budget=3)
    study, strategy = opened(fast_dir, "tpe")
    run_search(study, strategy, Objective(), budget=seeds + 4)
    enqueued = [t for t in study.get_trials() if "fixed_params" in t.system_attrs]
    assert len(enqueued) == seeds


def test_budget_counts_trials_running_in_other_workers(fast_dir):
    study, strategy = opened(fast_dir)
    other_worker = optuna.load_study(study_name="study-a", storage=f"sqlite:///{fast_dir / 'study-a' / 'study.db'}")
    other_worker.ask()  # a trial another worker is still evaluating
    summary = run_search(study, strategy, Objective(), budget=4)
    assert (summary.trials_total, summary.trials_run_here) == (4, 3)
    assert [r.state for r in records(study)].count("RUNNING") == 1


def test_a_failing_evaluation_is_recorded_and_the_search_goes_on(fast_dir):
    study, strategy = opened(fast_dir)
    summary = run_search(study, strategy, Objective(fail_on={1}), budget=4)
    recs = records(study)
    assert [r.state for r in recs] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert recs[1].error == "RuntimeError: out of memory on call 1"
    assert recs[1].config is not None and recs[1].measurement is None
    assert (summary.failed, summary.trials_total) == (1, 4)


def test_a_non_finite_speedup_fails_the_trial(fast_dir):
    class NaN:
        def evaluate(self, candidate, *, kind):
            return Measurement(kind=kind, speedup=float("nan"))

    study, strategy = opened(fast_dir)
    run_search(study, strategy, NaN(), budget=2)
    assert [r.state for r in records(study)] == ["FAIL", "FAIL"]
    assert "speedup nan" in records(study)[0].error


def test_keyboard_interrupt_fails_the_trial_and_propagates(fast_dir):
    study, strategy = opened(fast_dir)
    with pytest.raises(KeyboardInterrupt):
        run_search(study, strategy, Objective(interrupt_on=2), budget=6)
    study, strategy = opened(fast_dir)  # what a later run finds on disk
    recs = records(study)
    assert [r.state for r in recs] == ["COMPLETE", "COMPLETE", "FAIL"]
    assert recs[2].error == "interrupted"
    assert all(r.measurement is not None for r in recs[:2])
    assert best(study) in recs[:2]
    assert run_search(study, strategy, Objective(), budget=6).trials_run_here == 3


def test_ctrl_c_inside_ask_fails_the_new_trial_rather_than_leaving_it_running(fast_dir, monkeypatch):
    """A Ctrl-C that lands while optuna makes the trial: the trial is failed as interrupted, never left RUNNING
    with no heartbeat (which no worker could ever judge lost, and which would hold the budget for ever)."""
    import os
    import signal

    study, strategy = opened(fast_dir)
    ask, asked = optuna.Study.ask, []

    def ask_then_ctrl_c(self, *args, **kwargs):
        trial = ask(self, *args, **kwargs)
        asked.append(trial.number)
        if len(asked) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # delivered at once, inside ask()
        return trial

    monkeypatch.setattr(optuna.Study, "ask", ask_then_ctrl_c)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        run_search(study, strategy, Objective(), budget=6)
    assert signal.getsignal(signal.SIGINT) is handler  # put back
    recs = records(opened(fast_dir)[0])
    assert [(r.state, r.error) for r in recs] == [("COMPLETE", None), ("FAIL", "interrupted")]


def test_resuming_with_another_strategy_is_refused(fast_dir):
    study, strategy = opened(fast_dir, "tpe")
    run_search(study, strategy, Objective(), budget=1)
    with pytest.raises(StudyError, match="made by strategy 'tpe', not 'bayes'") as info:
        opened(fast_dir, "bayes")
    assert "\n" not in str(info.value)
    with pytest.raises(StudyError, match="made by strategy 'tpe'"):
        run_search(study, make_strategy("bayes", SPACE, seed=0), Objective(), budget=2)


def test_resuming_with_another_search_space_is_refused(fast_dir):
    opened(fast_dir, "tpe")
    with pytest.raises(StudyError, match=r"another search space \(num_layers 8 -> 12\)"):
        opened(fast_dir, "tpe", space=SearchSpace(num_layers=12))


@pytest.mark.parametrize("url", ["foo://x", "sqlite:////nonexistent-dir/sub/x.db", "not a url"])
def test_bad_storage_is_a_one_line_study_error(url):
    with pytest.raises(StudyError, match=r"^cannot open storage '") as info:
        open_study(storage=url, strategy=make_strategy("tpe", SPACE, seed=0))
    assert url in str(info.value) and "\n" not in str(info.value)


def test_a_storage_password_is_not_shown():
    with pytest.raises(StudyError, match=r"^cannot open storage 'postgresql://me:\*\*\*@127.0.0.1:1/db': ") as info:
        open_study(storage="postgresql://me:s3cret@127.0.0.1:1/db", strategy=make_strategy("tpe", SPACE, seed=0))
    assert "s3cret" not in str(info.value)


def test_storage_url_and_default_names():
    strategy = make_strategy("tpe", SPACE, seed=0)
    assert open_study(strategy=strategy).study_name == "skipsearch"  # in memory
    assert open_study(strategy=strategy, study_name="mine").study_name == "mine"


def test_storage_url_overrides_the_study_dir(fast_dir):
    url = f"sqlite:///{fast_dir / 'elsewhere.db'}"
    study = open_study(study_dir=fast_dir / "d", storage=url, strategy=make_strategy("tpe", SPACE, seed=0))
    assert (fast_dir / "elsewhere.db").is_file() and study.study_name == "d"


@pytest.mark.parametrize("budget", [0, -3, True, 2.5])
def test_budget_must_be_a_positive_integer(fast_dir, budget):
    study, strategy = opened(fast_dir)
    with pytest.raises(StudyError, match="budget must be an integer >= 1"):
        run_search(study, strategy, Objective(), budget=budget)
    assert records(study) == []


def test_best_prefers_timed_trials(fast_dir):
    study, strategy = opened(fast_dir)
    assert best(study) is None
    run_search(study, strategy, Objective(), budget=4)
    top_surrogate = best(study)
    assert top_surrogate.measurement.kind == "surrogate"
    # Timed speedups are lower here (0.5 below the surrogate's), yet one timed trial wins.
    run_search(study, strategy, Objective(), budget=5, kind="timed")
    chosen = best(study)
    assert chosen.number == 4 and chosen.measurement.kind == "timed"
    assert chosen.measurement.speedup < top_surrogate.measurement.speedup
    assert best(study, prefer="surrogate") == top_surrogate


class InOrder(optuna.samplers.BaseSampler):
    """Proposes index = the trial's number, round the sequence."""

    def __init__(self, size: int) -> None:
        self.size = size

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return trial.number % self.size


class Fixed(Strategy):
    """Proposes a fixed sequence of configs: enough to exercise the runner."""

    name = "fixed"

    def __init__(self, space, *, seed=0, warm_start=(), sequence=()) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        self.sequence = list(sequence)

    def sampler(self):
        return InOrder(len(self.sequence))

    def suggest(self, trial):
        return self.propose(self.sequence[trial.suggest_int("index", 0, len(self.sequence) - 1)])


A = DraftConfig(skip_attn=(2, 3), max_draft_tokens=2, exit=ExitRule(threshold=0.5))
B = DraftConfig(skip_attn=(4,), skip_mlp=(5,), max_draft_tokens=3, exit=ExitRule(threshold=0.3, adaptive=False))


def test_duplicate_configs_reuse_the_measurement(fast_dir):
    strategy = Fixed(SPACE, sequence=[A, B, A, A])
    study = open_study(study_dir=fast_dir / "dup", strategy=strategy)
    objective = Objective()
    run_search(study, strategy, objective, budget=4)
    assert [c for c, _ in objective.calls] == [A, B]
    recs = records(study)
    assert [r.config for r in recs] == [A, B, A, A] and {r.state for r in recs} == {"COMPLETE"}
    assert recs[2].measurement.speedup == recs[0].measurement.speedup and recs[2].measurement.seconds == 0.0
    assert study.trials[3].user_attrs["reused_from"] == 0
    # A timed evaluation is another measurement: it is not served from the surrogate's.
    run_search(study, strategy, objective, budget=5, kind="timed")
    assert objective.calls[-1] == (A, "timed")


def test_shortlist_is_the_best_distinct_configs_of_a_kind(fast_dir):
    C = replace(A, skip_attn=(1, 2, 3))
    strategy = Fixed(SPACE, sequence=[A, B, C, A])
    study = open_study(study_dir=fast_dir / "s", strategy=strategy)
    run_search(study, strategy, Objective(), budget=4)
    assert [c.draft for c in shortlist(study, 5)] == [C, A, B]
    assert shortlist(study, 2) == [strategy.propose(C), strategy.propose(A)]
    assert shortlist(study, 3, kind="timed") == []


def test_a_shortlist_timed_on_another_machine_is_timed_again_here_and_ships_this_machines_figure(fast_dir):
    """A study resumed on another machine (one checked out with the repository, or shared) has its shortlist timed
    again: what ships is this machine's timing, never the other one's."""
    from skipsearch.search.study.shipping import ship

    C = replace(A, skip_attn=(1, 2, 3))
    strategy = Fixed(SPACE, sequence=[A, B, C])
    study = open_study(study_dir=fast_dir / "m", strategy=strategy)
    run_search(study, strategy, Objective(), budget=3)
    there = ship(study, Objective(timed_penalty=-1.0), strategy, shortlisted=2, interrupted=False,
                 machine="the other machine", say=lambda _: None)
    assert there.measurement.speedup == 2.3 and [r.machine for r in there.timed] == ["the other machine"] * 2
    # stopped before timing anything here: the best is the surrogate's prediction, not the other machine's timing
    untimed = ship(study, Objective(), strategy, shortlisted=None, interrupted=True, machine="this machine",
                   say=lambda _: None)
    assert untimed.best.measurement.kind == "surrogate" and untimed.measurement.kind == "surrogate"
    objective = Objective(timed_penalty=0.1)
    shipped = ship(study, objective, strategy, shortlisted=2, interrupted=False, machine="this machine",
                   say=lambda _: None)
    assert objective.calls == [(C, "timed"), (A, "timed"), (C, "timed")]  # the shortlist, then the re-check
    assert shipped.candidate.draft == C and shipped.measurement.speedup == pytest.approx(1.2)
    assert {r.machine for r in shipped.timed} == {"this machine"}
    # timed here already: a third run on this machine times nothing new (only the re-check before shipping)
    again = Objective(timed_penalty=0.1)
    ship(study, again, strategy, shortlisted=2, interrupted=False, machine="this machine", say=lambda _: None)
    assert again.calls == [(C, "timed")]


def test_candidates_of_other_methods_round_trip_through_the_study(fast_dir):
    from skipsearch.methods.ngram import METHOD as NGRAM
    from skipsearch.methods.ngram import NgramParams

    class Lookup(Fixed):
        methods = (NGRAM,)

        def suggest(self, trial):
            k = trial.suggest_int("index", 2, 3)
            return self.propose(DraftConfig(max_draft_tokens=k), NgramParams(min_n=1, max_n=k))

        def sampler(self):
            return optuna.samplers.RandomSampler(seed=self.seed)

    strategy = Lookup(SPACE, sequence=[A])
    study = open_study(study_dir=fast_dir / "n", strategy=strategy)
    run_search(study, strategy, Objective(), budget=3)
    for r in records(study):
        assert r.candidate.method == "ngram"
        assert dict(r.candidate.params) == {"min_n": 1, "max_n": r.config.max_draft_tokens}
    again = open_study(study_dir=fast_dir / "n", strategy=strategy)  # read back from SQLite by another handle
    assert [r.candidate for r in records(again)] == [r.candidate for r in records(study)]


def test_config_dict_round_trip_through_json():
    config = replace(B, exit=ExitRule(threshold=0.25, adaptive=True, target_acceptance=0.8, step=0.02))
    raw = json.loads(json.dumps(config_to_dict(config)))
    assert config_from_dict(raw) == config
    assert raw["skip_mlp"] == [5] and raw["exit"]["step"] == 0.02


# -- the worker race (issue 22) ---------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_two_workers_never_claim_one_enqueued_trial(fast_dir):
    """The race behind issue 22, made deterministic: worker B has read the waiting (enqueued) trial when worker
    A claims it. Optuna's read-then-write claim let both run it on SQLite (no SELECT ... FOR UPDATE), and the
    slower one then wrote to a trial the other had finished: UpdateFinishedTrialError."""
    study_a, strategy = opened(fast_dir)
    study_b, _ = opened(fast_dir)
    study_a.enqueue_trial({"k": 2})
    taken = []

    @sqlalchemy.event.listens_for(study_b._storage._backend.engine, "before_cursor_execute")
    def a_claims_first(conn, cursor, statement, *args):  # B has read the trial WAITING; A claims it now
        if statement.lstrip().upper().startswith("UPDATE TRIALS") and not taken:
            taken.append(study_a.ask().number)

    mine = study_b.ask().number
    assert taken == [0] and mine != 0
    assert study_a.trials[0].state == optuna.trial.TrialState.RUNNING


def test_a_trial_finished_by_another_worker_is_never_written_again(fast_dir):
    """Another worker fails this worker's running trial (as it does one it judges lost) between ask and tell:
    this worker records the conflict, writes nothing more to that trial, and goes on to the budget."""
    study, strategy = opened(fast_dir)
    other, _ = opened(fast_dir)  # a second handle on the same storage: another worker

    class FailedFromOutside(Objective):
        def evaluate(self, candidate, *, kind):
            m = super().evaluate(candidate, kind=kind)
            if len(self.calls) == 2:
                running = other.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                assert len(running) == 1
                other.tell(running[0].number, state=optuna.trial.TrialState.FAIL)
                self.victim = running[0].number
            return m

    objective = FailedFromOutside()
    summary = run_search(study, strategy, objective, budget=5)
    trials = study.get_trials(deepcopy=False)
    assert len(objective.calls) == 5 and summary.trials_run_here == 5 and summary.failed == 1
    assert len(summary.conflicts) == 1 and "already finished" in summary.conflicts[0]
    victim = trials[objective.victim]
    assert victim.state == optuna.trial.TrialState.FAIL and "error" not in victim.user_attrs
    assert "measurement" not in victim.user_attrs or victim.values is None
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) == 4


def test_a_busy_storage_is_retried_and_survived(fast_dir, monkeypatch):
    """A storage that refuses a write ("database is locked") is tried again; the search never crashes."""
    from skipsearch.search.study import storage as st

    study, strategy = opened(fast_dir)
    tell, refusals = study.tell, []

    def busy_tell(*args, **kwargs):
        if len(refusals) < 2:
            refusals.append(1)
            raise optuna.exceptions.StorageInternalError("commit") from sqlalchemy.exc.OperationalError(
                "UPDATE", {}, Exception("database is locked"))
        return tell(*args, **kwargs)

    monkeypatch.setattr(study, "tell", busy_tell)
    monkeypatch.setattr(st.time, "sleep", lambda s: None)
    summary = run_search(study, strategy, Objective(), budget=3)
    assert len(refusals) == 2 and summary.failed == 0 and summary.conflicts == ()
    ran = [t.state for t in study.trials if t.state != optuna.trial.TrialState.WAITING]  # seeds not yet run wait
    assert ran == [optuna.trial.TrialState.COMPLETE] * 3


def test_a_precision_search_by_tpe_resumes_with_a_strategy_made_anew(fast_dir):
    # The study records the strategy's name (tpe) and each trial its candidate's method (precision): a strategy made
    # again with the same options proposes for the same method, and goes on with the study.
    first = make_strategy("tpe", SPACE, seed=0, schemes=("fp16",))
    study = open_study(study_dir=fast_dir / "p", strategy=first)
    run_search(study, first, Objective(), budget=3)
    again = make_strategy("tpe", SPACE, seed=0, schemes=("fp16",))
    study = open_study(study_dir=fast_dir / "p", strategy=again)
    summary = run_search(study, again, Objective(), budget=6)
    recs = records(study)
    assert (summary.trials_total, summary.trials_run_here) == (6, 3) and {r.state for r in recs} == {"COMPLETE"}
    assert {r.candidate.method for r in recs} == {"precision"} and study.user_attrs["strategy"] == "tpe"



def test_a_timed_search_records_its_machine_and_reuses_no_timing_from_another(fast_dir):
    """A timed search (fractal's grid, a timed objective) records the machine that timed each trial, as the
    shortlist's timing does: shipping counts only this machine's timings. A twin timed on another machine is
    timed again here, not reused; one timed on this machine is."""
    strategy = Fixed(SPACE, sequence=[A, B])
    study = open_study(study_dir=fast_dir / "m", strategy=strategy)
    objective = Objective(timed_penalty=0.0)
    run_search(study, strategy, objective, budget=2, kind="timed", machine="zen3")
    assert [r.machine for r in records(study)] == ["zen3", "zen3"] and len(objective.calls) == 2
    # resumed on another machine: A and B are timed again there
    run_search(study, strategy, objective, budget=4, kind="timed", machine="xeon")
    assert [c for c, _ in objective.calls[2:]] == [A, B]
    assert [r.machine for r in records(study)] == ["zen3", "zen3", "xeon", "xeon"]
    assert best(study, machine="xeon").machine == "xeon"
    # and on the first machine again: its own timings are reused, nothing is timed
    run_search(study, strategy, objective, budget=6, kind="timed", machine="zen3")
    assert len(objective.calls) == 4 and study.trials[4].user_attrs["reused_from"] == 0


@pytest.mark.parametrize("enqueued", [False, True], ids=["created", "claimed"])
def test_a_worker_killed_inside_ask_leaves_no_trial_running_for_ever(fast_dir, enqueued):
    """``Study.ask`` starts the trial, then runs the sampler (seconds of TPE on a long study), all before the
    runner's heartbeat: a worker killed there had left a RUNNING trial with no heartbeat, which Optuna never
    judges stale. The trial's first beat now comes with its start, so it is failed once its grace is over."""
    import time

    from skipsearch.search.study import fail_lost_trials
    from skipsearch.search.study.storage import storage_of

    study, _ = opened(fast_dir)
    if enqueued:
        study.enqueue_trial({})
    trial = study.ask()  # ... and the worker dies here, before the runner's heartbeat starts
    backend = storage_of(study)
    backend.grace_period = 1
    time.sleep(2.5)  # SQLite's clock counts whole seconds
    fail_lost_trials(study)
    assert study.trials[trial.number].state == optuna.trial.TrialState.FAIL


class Together(Objective):
    """An objective that also times a shortlist together (ModelObjective.time_all): one call, one baseline."""

    def __init__(self, *, fail_together=False, **kw) -> None:
        super().__init__(**kw)
        self.together: list[list[DraftConfig]] = []
        self.fail_together = fail_together

    def time_all(self, candidates):
        self.together.append([c.draft for c in candidates])
        if self.fail_together:
            raise RuntimeError("out of memory")
        return [replace(self.evaluate(c, kind="timed"), notes=None) for c in candidates]


def test_the_shortlist_is_timed_together_and_each_candidate_keeps_its_own_figure(fast_dir):
    """The shortlist is timed in one run with one baseline (a shortlist of three: four decodings of the calibration,
    not six); each candidate is recorded with its own measurement, and the best is re-checked alone. When the run
    together fails, each is timed alone, so a failure is recorded against the candidate that failed."""
    from skipsearch.search.study.shipping import ship

    C = replace(A, skip_attn=(1, 2, 3))
    strategy = Fixed(SPACE, sequence=[A, B, C])
    study = open_study(study_dir=fast_dir / "t", strategy=strategy)
    run_search(study, strategy, Objective(), budget=3)
    objective = Together(timed_penalty=0.1)
    shipped = ship(study, objective, strategy, shortlisted=3, interrupted=False, machine="here", say=lambda _: None)
    assert objective.together == [[C, A, B]]
    assert {r.candidate.draft: round(r.measurement.speedup, 3) for r in shipped.timed} == {C: 1.2, A: 1.1, B: 0.9}
    assert shipped.candidate.draft == C and objective.calls[-1] == (C, "timed")  # the re-check, alone
    failing = Together(timed_penalty=0.1, fail_together=True, fail_on={0})
    study = open_study(study_dir=fast_dir / "f", strategy=strategy)
    run_search(study, strategy, Objective(), budget=3)
    shipped = ship(study, failing, strategy, shortlisted=3, interrupted=False, machine="here", say=lambda _: None)
    errors = {r.candidate.draft: r.error for r in records(study) if r.state == "FAIL"}
    assert errors == {C: "out of memory on call 0"} and {r.candidate.draft for r in shipped.timed} == {A, B}
