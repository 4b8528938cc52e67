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
    from skipsearch.engine.decoding import hf_generate

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
    from skipsearch.engine.decoding import generate, hf_generate
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
    from skipsearch.search.study import load_records

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


# -- the strategy options' flags, made from what the registered strategies declare ----------------------------------
def _optimize_help() -> str:
    """``optimize --help`` as one line of words: wide, so that no phrase wraps; the panels' borders left out."""
    shown = runner.invoke(app, ["optimize", "--help"], env={"COLUMNS": "1000"})
    assert shown.exit_code == 0, shown.output
    return " ".join(shown.stdout.replace("│", " ").split())


def test_optimize_help_lists_every_strategy_and_each_ones_flags_in_its_panel():
    from skipsearch.search.strategies import REGISTRY

    text = _optimize_help()
    assert f"Search strategy: {', '.join(REGISTRY)} " in text and "precision" in REGISTRY
    for name, cls in REGISTRY.items():
        for option in cls.options:
            if option.on_command_line:
                assert option.spelling in text and name in text
    assert "Strategy options: fractal " in text and "auto|int8-dynamic" in text  # choices listed
    assert "fp16|int8|int4" in text and "(default: tpe 0, clasp 4)" in text


def test_every_existing_strategy_flag_still_parses():
    from skipsearch.cli.strategy_flags import strategy_options

    given = {"n_values": "3,5", "w_values": "1", "quantization": "none", "loi": 3, "vocab_sizes": "0,8",
             "schemes": "fp16, int8"}
    assert strategy_options(given) == (("n_values", (3, 5)), ("w_values", (1,)), ("quantization", "none"),
                                       ("loi", 3), ("vocab_sizes", (0, 8)), ("schemes", ("fp16", "int8")))
    assert_one_line_error(runner.invoke(app, ["optimize", "--strategy", "clasp", "--clasp-loi", "0"]), "--clasp-loi")
    assert_one_line_error(runner.invoke(app, ["optimize", "--strategy", "hybrid", "--schemes", ","]),
                          "--schemes must be comma-separated values")


def _toy_strategy():
    from skipsearch.config import NO_EXIT, DraftConfig
    from skipsearch.methods.ngram import METHOD as NGRAM
    from skipsearch.methods.ngram import NgramParams
    from skipsearch.search.strategies import Option
    from skipsearch.search.strategies._grid import GridStrategy

    class ToyStrategy(GridStrategy):
        """A test's strategy: ngram's suffix lengths on a grid, with three settings of its own."""

        name = "toy-grid"
        methods = (NGRAM,)
        options = (Option("spans", int, (1, 2), "toy suffix lengths", many=True, low=1),
                   Option("mode", str, "a", "toy mode", choices=("a", "b")),
                   Option("scale", float, 0.5, "toy scale", low=0))

        def __init__(self, space, *, method=None, seed=0, warm_start=(), spans=(1, 2), mode="a", scale=0.5):
            super().__init__(space, method=method, seed=seed, warm_start=warm_start)
            self.spans, self.mode, self.scale = tuple(spans), mode, scale

        def grid(self):
            return {"n": list(self.spans), "k": [2]}

        def candidate(self, point):
            return self.propose(DraftConfig(max_draft_tokens=point["k"], exit=NO_EXIT),
                                NgramParams(min_n=point["n"], max_n=point["n"]))

    return ToyStrategy


def test_a_registered_strategy_gets_its_flags_and_checks_with_no_edit_to_cli_or_api(tmp_path, monkeypatch):
    from skipsearch import api
    from skipsearch.config import ConfigError
    from skipsearch.search.space import SearchSpace
    from skipsearch.search.strategies import REGISTRY, make_strategy

    toy = _toy_strategy()
    monkeypatch.setitem(REGISTRY, toy.name, toy)
    text = _optimize_help()
    assert "Strategy options: toy-grid" in text and "toy-grid" in text.split("Search strategy:")[1][:200]
    assert "--spans" in text and "Toy suffix lengths (default: 1,2)" in text and "[a|b]" in text
    # the flags reach the strategy, parsed as declared: the search is stubbed where the model would load
    seen = []

    def stop(settings, **_):
        seen.append(settings)
        raise ConfigError("stopped before the model loads")

    monkeypatch.setattr(api, "optimize_study", stop)
    args = ["optimize", "--strategy", "toy-grid", "--study", str(tmp_path / "s")]
    assert_one_line_error(runner.invoke(app, [*args, "--spans", "3,1", "--mode", "b", "--scale", "2"]), "stopped")
    assert seen[0].strategy_options == (("spans", (3, 1)), ("mode", "b"), ("scale", 2.0))
    strategy = make_strategy(toy.name, SearchSpace(num_layers=8), **dict(seen[0].strategy_options))
    assert (strategy.spans, strategy.mode, strategy.scale) == ((3, 1), "b", 2.0)
    monkeypatch.undo()  # the real api again, and the toy still registered: its options are checked as declared
    monkeypatch.setitem(REGISTRY, toy.name, toy)
    assert_one_line_error(runner.invoke(app, [*args, "--spans", "0"]),
                          "strategy 'toy-grid': --spans must be comma-separated integers >= 1, got (0,)")
    assert_one_line_error(runner.invoke(app, [*args, "--n", "2"]), "strategy 'toy-grid' does not take --n")
    assert_one_line_error(runner.invoke(app, ["optimize", "--strategy", "tpe", "--study", str(tmp_path / "t"),
                                              "--mode", "b"]), "strategy 'tpe' does not take --mode")
    monkeypatch.undo()  # unregistered: its flags are gone
    assert "--spans" not in _optimize_help()
    assert_one_line_error(runner.invoke(app, [*args, "--spans", "1"]), "--spans")
