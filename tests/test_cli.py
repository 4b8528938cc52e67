"""The CLI end to end: every bad input is one line on stderr and exit 2; the real model path works."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import assert_one_line_error
from typer.testing import CliRunner

from skipsearch.cli import app

runner = CliRunner()
EXAMPLE = "profiles/smollm2-135m/example.yaml"


def _write(tmp_path, text: str):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return str(p)


def test_profile_validate_and_show_example():
    ok = runner.invoke(app, ["profile", "validate", EXAMPLE])
    assert ok.exit_code == 0 and "valid" in ok.stdout
    shown = runner.invoke(app, ["profile", "show", EXAMPLE])
    assert shown.exit_code == 0
    assert "smollm2-135m" in shown.stdout and "5, 9, 13, 17, 21" in shown.stdout


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: "schema_version: [\n", "malformed YAML"),
        (lambda d: {**d, "schema_version": 9}, "schema_version 9"),
        (lambda d: {k: v for k, v in d.items() if k != "draft"}, "draft"),
        (lambda d: {**d, "draft": {**d["draft"], "skip_attn": [31]}}, "layer index 31"),
        (lambda d: {**d, "method": "warp-drive"}, "warp-drive"),
    ],
)
def test_profile_validate_bad_inputs(tmp_path, mutate, fragment):
    good = yaml.safe_load(open(EXAMPLE))
    bad = mutate(good)
    path = _write(tmp_path, bad if isinstance(bad, str) else yaml.safe_dump(bad))
    assert_one_line_error(runner.invoke(app, ["profile", "validate", path]), fragment)


def test_decode_bad_profile_fails_before_model_load(tmp_path):
    path = _write(tmp_path, "schema_version: 1\nmodel: {name: smollm2-135m, num_layers: 30}\n")
    result = runner.invoke(app, ["decode", "--profile", path, "--prompt", "hi"])
    assert_one_line_error(result, "missing required key method")


def test_decode_unknown_model():
    assert_one_line_error(runner.invoke(app, ["decode", "--model", "llama-2-13b", "--prompt", "hi"]), "unknown model")


def test_decode_needs_exactly_one_prompt_source():
    assert_one_line_error(runner.invoke(app, ["decode", "--model", "smollm2-135m"]), "--prompt")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--budget", "0"], "budget"),
        (["--strategy", "annealing"], "unknown strategy"),
        (["--dataset", "no-such-set"], "unknown dataset"),
        (["--objective", "vibes"], "unknown objective"),
    ],
)
def test_optimize_bad_inputs(tmp_path, args, fragment):
    result = runner.invoke(app, ["optimize", "--study", str(tmp_path / "s"), *args])
    assert_one_line_error(result, fragment)


def test_study_show_missing_study(tmp_path):
    assert_one_line_error(runner.invoke(app, ["study", "show", str(tmp_path / "nothing")]), "no study")


@pytest.mark.model
def test_decode_json_is_greedy_identical(real_sm, tmp_path):
    from skipsearch.decoding import hf_generate

    prompts = tmp_path / "p.jsonl"
    rows = [{"prompt": "def fib(n):"}, {"prompt": "Name a color.", "chat": True}]
    prompts.write_text("\n".join(json.dumps(r) for r in rows))
    result = runner.invoke(
        app, ["decode", "--profile", EXAMPLE, "--prompts-file", str(prompts), "--json", "--max-new-tokens", "24"]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["token_ids"] == list(hf_generate(real_sm, row["prompt_token_ids"], max_new_tokens=24))
        assert row["stats"]["new_tokens"] == len(row["token_ids"])


@pytest.mark.model
def test_optimize_end_to_end_then_decode(real_sm, tmp_path):
    from skipsearch.decoding import generate, hf_generate
    from skipsearch.profile import load_profile

    out = tmp_path / "best.yaml"
    args = ["optimize", "--budget", "6", "--n-prompts", "2", "--max-new-tokens", "12", "--shortlist", "2",
            "--study", str(tmp_path / "study"), "--out", str(out), "--dataset", "humaneval"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    prof = load_profile(out, num_layers=real_sm.num_layers, fingerprint=real_sm.fingerprint)
    assert prof.search is not None and prof.search.trials >= 6
    assert prof.measured is not None and prof.measured.source == "optimize"
    ids = real_sm.tokenizer("def add(a, b):").input_ids
    assert generate(real_sm, ids, config=prof.draft, max_new_tokens=24).token_ids == hf_generate(
        real_sm, ids, max_new_tokens=24
    )
    # the study resumes: the same command again adds no trials (budget reached) and still writes a profile
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    shown = runner.invoke(app, ["study", "show", str(tmp_path / "study")])
    assert shown.exit_code == 0 and "timed" in shown.stdout


@pytest.mark.model
def test_sigkill_mid_search_then_the_same_command_resumes(tmp_path):
    """Kill -9 a running `skipsearch optimize`; the same command then resumes with every finished trial."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import optuna

    study_dir = tmp_path / "study"
    cmd = [sys.executable, "-m", "skipsearch", "optimize", "--model", "smollm2-135m", "--strategy", "tpe",
           "--objective", "surrogate", "--n-prompts", "1", "--max-new-tokens", "8", "--study", str(study_dir),
           "--out", str(tmp_path / "p.yaml")]
    storage = f"sqlite:///{study_dir / 'study.db'}"

    def finished() -> dict[int, dict]:
        try:
            trials = optuna.load_study(study_name="study", storage=storage).get_trials(deepcopy=False)
        except Exception:  # not created yet
            return {}
        return {t.number: dict(t.user_attrs) for t in trials if t.state == optuna.trial.TrialState.COMPLETE}

    proc = subprocess.Popen([*cmd, "--budget", "500"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while len(finished()) < 4 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = finished()
    assert len(before) >= 4, proc.stderr.read().decode()[-2000:]
    assert not (tmp_path / "p.yaml").exists()  # killed mid-search: nothing was written

    counted = [t for t in optuna.load_study(study_name="study", storage=storage).trials
               if t.state != optuna.trial.TrialState.WAITING]  # enqueued seeds do not count towards the budget
    budget = len(counted) + 3
    again = subprocess.run([*cmd, "--budget", str(budget)], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    study = optuna.load_study(study_name="study", storage=storage)
    after = {t.number: dict(t.user_attrs) for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert all(after[n] == attrs for n, attrs in before.items())  # every finished trial intact
    assert len(after) == len(before) + 3  # the killed trial counts as failed; three more finished
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.RUNNING not in states  # the killed trial is marked failed, not left running
    assert (tmp_path / "p.yaml").exists()
