"""The pictures: ``skipsearch bench --plot`` (speedup per method and peer, by workload) and ``skipsearch study show
--plot`` (search history, predicted against measured, the cost-acceptance front), drawn from what the commands hold,
and their bad output paths as one line. Nothing here loads a model."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from conftest import assert_one_line_error
from typer.testing import CliRunner

from skipsearch import bench as bn
from skipsearch.bench.plot import bench_figure, plot_reports, read_report
from skipsearch.cli import app
from skipsearch.config import Candidate, ConfigError, DraftConfig
from skipsearch.measure import Measurement
from skipsearch.search.study import ERROR_ATTR, KIND_ATTR, MEASUREMENT_ATTR, WORKER_ATTR, candidate_attrs, load_records
from skipsearch.search.study.plot import cost_acceptance_front, study_figure

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 10_000, f"{path}: {len(data)} bytes"


# -- bench -------------------------------------------------------------------------------------------------
def _row(method, family, speedup, *, prompts=4, identical=4):
    return bn.BenchRow(method, family, "", prompts, identical, 100, 1.0, 100.0, speedup, None, None, None, None, None,
                       None, None, None)


def _report() -> bn.BenchReport:
    settings = bn.BenchSettings("m", "cpu", "float32", "d", "heldout", 4, 32, 1, 1, 0, "memory")
    rows = (_row("hf-greedy", "hf", 1.0), _row("hf-prompt-lookup", "hf", 1.2),
            _row("layer-skip:a", "skipsearch", 1.6), _row("hf-early-exit", "hf", None, identical=3))
    code = (_row("hf-greedy", "hf", 1.0, prompts=2), _row("hf-prompt-lookup", "hf", 1.5, prompts=2),
            _row("layer-skip:a", "skipsearch", 1.9, prompts=2), _row("hf-early-exit", "hf", None, prompts=2,
                                                                      identical=1))
    return bn.BenchReport(settings, (("device_name", "cpu"),), rows, (("code", code),), (), (), 1.0)


def test_committed_bench_reports_draw_as_a_png(tmp_path):
    """scripts/plot_bench.py and the documentation's figure: every row of committed reports, drawn from their JSON."""
    reports = sorted(ROOT.glob("studies/bench-*.json"))[:2]
    assert reports, "no committed bench report to draw"
    out = plot_reports(reports, tmp_path / "bench.png", labels=["a", "b"][: len(reports)])
    assert_png(out)


def test_the_bench_figure_has_a_panel_per_workload_and_a_bar_per_usable_row():
    from skipsearch.bench.report import report_to_dict

    fig = bench_figure([report_to_dict(_report())], labels=["run"])
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["all prompts (4 prompts)", "code (2 prompts)"]
    for ax, expected in zip(panels, ([1.0, 1.2, 1.6], [1.0, 1.5, 1.9]), strict=True):
        assert [round(p.get_width(), 3) for p in ax.patches] == expected  # the flagged row has no bar ...
        assert "output differs" in [t.get_text() for t in ax.texts]  # ... and says why
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["hf-greedy", "hf-prompt-lookup", "layer-skip:a",
                                                                    "hf-early-exit"]


def test_a_file_that_is_not_a_bench_report_is_one_line(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    with pytest.raises(ConfigError, match="not a skipsearch bench JSON report"):
        read_report(other)
    with pytest.raises(ConfigError, match="cannot read"):
        read_report(tmp_path / "missing.json")


def _bench_without_a_model(monkeypatch, calls):
    from skipsearch import api
    from skipsearch.api.benchmark import BenchRun

    def fake(options, **_):
        calls.append(options)
        return BenchRun(report=_report(), profiles=(), command=("skipsearch", "bench"))

    monkeypatch.setattr(api, "bench_profiles", fake)


def test_bench_plot_writes_the_png_of_its_run(tmp_path, monkeypatch):
    calls = []
    _bench_without_a_model(monkeypatch, calls)
    out = tmp_path / "bench.png"
    result = runner.invoke(app, ["bench", "--peers", "hf-greedy", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert len(calls) == 1 and f"wrote {out}" in result.stdout
    assert_png(out)
    # an earlier plot is replaced only with --force
    assert_one_line_error(runner.invoke(app, ["bench", "--plot", str(out)]), "--force replaces it")
    assert runner.invoke(app, ["bench", "--plot", str(out), "--force"]).exit_code == 0


def _unwritable_dir(tmp_path: Path) -> Path:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return locked


@pytest.mark.parametrize(("where", "fragment"), [
    (lambda tmp: tmp, "is a directory"),
    (lambda tmp: _unwritable_dir(tmp) / "out.png", "is not writable"),
    (lambda tmp: (tmp / "file.txt", (tmp / "file.txt").write_text("x"))[0] / "out.png", "is not a directory"),
    (lambda tmp: (tmp / "notes.png", (tmp / "notes.png").write_text("my notes"))[0], "is not a PNG plot"),
])
def test_a_bad_plot_path_is_one_line_before_any_work(tmp_path, monkeypatch, where, fragment):
    calls = []
    _bench_without_a_model(monkeypatch, calls)
    path = where(tmp_path)
    try:
        assert_one_line_error(runner.invoke(app, ["bench", "--plot", str(path)]), fragment)
        assert calls == []  # refused before the bench ran
        study = _tiny_study(tmp_path / "study-dir")
        assert_one_line_error(runner.invoke(app, ["study", "show", str(study), "--plot", str(path)]), fragment)
    finally:
        for locked in tmp_path.glob("locked"):
            locked.chmod(0o700)
    if path.name == "notes.png":
        assert path.read_text() == "my notes"  # kept, even with --force: it is not a plot
        assert_one_line_error(runner.invoke(app, ["bench", "--plot", str(path), "--force"]), "is not a PNG plot")


# -- study -------------------------------------------------------------------------------------------------
def _tiny_study(folder: Path) -> Path:
    """A study directory as ``skipsearch optimize`` leaves one: an Optuna study named after it in ``study.db``, each
    trial carrying the user attrs the study runner writes (worker, candidate, kind, measurement; an error when it
    failed)."""
    if (folder / "study.db").exists():
        return folder
    folder.mkdir(parents=True)
    study = optuna.create_study(study_name=folder.name, storage=f"sqlite:///{folder / 'study.db'}",
                                direction="maximize")
    trials = [  # (skipped attention layers, kind, speedup, predicted, c, alpha)
        ((1,), "surrogate", 1.05, 1.05, 0.90, 0.80), ((1, 2), "surrogate", 1.12, 1.12, 0.80, 0.75),
        ((2, 3, 4), "surrogate", 0.97, 0.97, 0.70, 0.50), ((3,), "surrogate", 1.08, 1.08, 0.85, 0.70),
        ((1, 2), "timed", 1.09, 1.12, 0.80, 0.75), ((1,), "timed", 1.02, 1.05, 0.90, 0.80),
    ]
    for skip, kind, speedup, predicted, c, alpha in trials:
        trial = study.ask()
        trial.set_user_attr(WORKER_ATTR, "host:1")
        for key, value in candidate_attrs(Candidate("layer-skip", DraftConfig(skip_attn=skip, max_draft_tokens=3),
                                                    ())).items():
            trial.set_user_attr(key, value)
        trial.set_user_attr(KIND_ATTR, kind)
        trial.set_user_attr(MEASUREMENT_ATTR, Measurement(kind=kind, speedup=speedup, predicted_speedup=predicted,
                                                          cost_ratio=c, alpha=alpha, tau=1.5).to_dict())
        study.tell(trial, speedup)
    failed = study.ask()
    failed.set_user_attr(ERROR_ATTR, "RuntimeError: out of memory")
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    return folder


def test_the_study_figure_draws_every_trial_in_its_panel(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    label, recs = load_records(study_dir=_tiny_study(tmp_path / "tiny"))
    fig = study_figure(recs, title=label)
    history, versus, front = fig.axes[:3]
    assert "7 trials, 6 measured, 1 failed" in fig.get_suptitle()
    assert sorted(len(c.get_offsets()) for c in history.collections) == [2, 4]  # timed and surrogate trials
    (timed,) = versus.collections
    assert sorted(map(tuple, timed.get_offsets().tolist())) == [(1.05, 1.02), (1.12, 1.09)]  # (predicted, measured)
    assert sum(len(c.get_offsets()) for c in front.collections) == 6
    empty = study_figure([])  # a study whose first trial has not finished yet
    assert ["no trial measured yet" in [t.get_text() for t in ax.texts] for ax in empty.axes[:1]] == [True]
    # the front: the trials no other beats on both lower cost and higher acceptance
    assert cost_acceptance_front([(0.9, 0.8), (0.8, 0.75), (0.7, 0.5), (0.85, 0.7), (0.8, 0.75)]) == [
        (0.7, 0.5), (0.8, 0.75), (0.9, 0.8)]


def test_study_show_plot_writes_the_png_and_names_the_dashboard(tmp_path):
    folder = _tiny_study(tmp_path / "tiny")
    out = tmp_path / "study.png"
    result = runner.invoke(app, ["study", "show", str(folder), "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout
    assert_png(out)
    assert_one_line_error(runner.invoke(app, ["study", "show", str(folder), "--plot", str(out)]), "--force replaces")
    assert runner.invoke(app, ["study", "show", str(folder), "--plot", str(out), "--force"]).exit_code == 0
    assert "optuna-dashboard sqlite:///" in runner.invoke(app, ["study", "show", "--help"]).stdout


def test_a_study_without_cost_or_acceptance_still_draws(tmp_path):
    """A fractal study records neither c nor α: its third panel says so instead of failing."""
    recs = load_records(study_dir=ROOT / "studies" / "smollm2-135m-fractal")[1]
    assert recs and all(r.measurement.cost_ratio is None for r in recs if r.measurement)
    fig = study_figure(recs)
    assert any("no trial recorded both c and α" in t.get_text() for t in fig.axes[2].texts)


def test_committed_study_draws_as_a_png(tmp_path):
    label, recs = load_records(study_dir=ROOT / "studies" / "smollm2-135m-tpe")
    from skipsearch.search.study.plot import plot_study

    assert_png(plot_study(recs, tmp_path / "s.png", title=label))


@pytest.mark.parametrize(("figures", "drawn"), [
    ({"speedup": float("inf"), "predicted_speedup": float("nan"), "cost_ratio": float("inf"), "alpha": 0.5}, True),
    ({"speedup": 1e308, "predicted_speedup": -1e308, "cost_ratio": 1e308, "alpha": -1e308}, False),
])
def test_a_study_with_figures_no_plot_can_place_draws_without_them_or_is_one_line(tmp_path, figures, drawn):
    """A trial another machine wrote with infinite or absurd figures: left out of the picture, or one line."""
    folder = _tiny_study(tmp_path / "tiny")
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{folder / 'study.db'}")
    attrs = study.trials[0].user_attrs
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE, value=1.0, params={}, distributions={},
        user_attrs={**attrs, MEASUREMENT_ATTR: {"kind": "timed", **figures}}))
    out = tmp_path / "study.png"
    result = runner.invoke(app, ["study", "show", str(folder), "--plot", str(out)])
    if drawn:
        assert result.exit_code == 0, result.output
        assert_png(out)
    else:
        assert_one_line_error(result, "cannot draw")
        assert not out.exists()
