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
    assert_one_line_error(runner.invoke(app, ["decode", "--model", "no-such-model", "--prompt", "hi"]), "unknown model")


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
    from skipsearch.study import load_records

    before = len(load_records(study_dir=tmp_path / "study")[1])
    out.unlink()
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert len(load_records(study_dir=tmp_path / "study")[1]) == before >= 6
    assert load_profile(out).search.trials == before
    shown = runner.invoke(app, ["study", "show", str(tmp_path / "study")])
    assert shown.exit_code == 0 and "timed" in shown.stdout


@pytest.mark.parametrize(("args", "fragment"), [
    (["decode", "--prompt", "hi", "--max-new-tokens", "0"], "Invalid value for '--max-new-tokens'"),
    (["bench", "--bogus"], "No such option: --bogus"),
    (["optimize", "--budget", "many"], "Invalid value for '--budget'"),
])
def test_typers_own_usage_errors_are_one_line_and_exit_2(args, fragment):
    assert_one_line_error(runner.invoke(app, args), fragment)


def test_methods_lists_every_registered_method_with_its_search():
    from skipsearch import methods

    result = runner.invoke(app, ["methods"])
    assert result.exit_code == 0
    rows = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert set(rows) == set(methods.names())
    for name in methods.names():
        strategy = methods.get(name).strategy
        assert (f"--strategy {strategy}" if strategy else "skipsearch plan") in rows[name]


def test_models_lists_the_aliases():
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0 and "llama-2-13b " in result.stdout and "meta-llama/Llama-2-13b-hf" in result.stdout
