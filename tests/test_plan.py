"""The planner maths: closed forms against Monte-Carlo, the paper's special cases, costs, bad input, the CLI."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from conftest import assert_one_line_error
from typer.testing import CliRunner

from skipsearch.cli import app
from skipsearch.config import ConfigError
from skipsearch.methods.hierarchical.closed_form import (
    PlanInputs,
    block_distribution,
    composed_expected_tokens,
    curve_at,
    expected_tokens,
    format_plan,
    paper_cycle_cost,
    paper_tokens_distribution,
    parse_curve,
    plan_row,
    plan_table,
    round_distribution,
    simulate_composed,
    simulate_paper,
    time_improvement,
)

runner = CliRunner()
GRID = list(itertools.product((0.0, 0.35, 0.8, 1.0), (0.0, 0.5, 0.9, 1.0), (1, 2, 4), (0, 1, 3)))
CYCLES = 60_000


def _within(samples: np.ndarray, expected: float, sigmas: float = 5.0) -> bool:
    se = samples.std(ddof=1) / math.sqrt(len(samples))
    return abs(samples.mean() - expected) <= sigmas * se + 1e-9


def _eq1(alpha: float, gamma: int) -> float:
    """Eq. 1, (1 − α^{γ+1})/(1 − α), written as the sum it is so that α = 1 is defined."""
    return sum(alpha**i for i in range(gamma + 1))


# -- closed forms against the simulators -----------------------------------------------------------------
@pytest.mark.parametrize(("alpha", "beta", "m", "n"), GRID)
def test_theorem_3_2_matches_a_simulation_of_algorithm_2(alpha, beta, m, n):
    samples = simulate_paper(alpha, beta, m, n, cycles=CYCLES, seed=m * 10 + n)
    assert _within(samples, expected_tokens(alpha, beta, m, n)), (samples.mean(), expected_tokens(alpha, beta, m, n))


@pytest.mark.parametrize(("alpha", "beta", "m", "n"), GRID)
def test_composed_closed_form_matches_a_simulation_of_the_decoder(alpha, beta, m, n):
    tokens, blocks = simulate_composed(alpha, beta, m, n, cycles=CYCLES, seed=m * 10 + n)
    assert _within(tokens, composed_expected_tokens(alpha, beta, m, n))
    row = plan_row(PlanInputs(alpha, beta, 0.5, 0.5), m, n)
    assert _within(blocks, row.block_tokens)
    # the exact block distribution too: its histogram, cell by cell
    dist = np.array(block_distribution(beta, m, n))
    seen = np.bincount(blocks, minlength=len(dist)) / len(blocks)
    assert np.all(np.abs(seen - dist) <= 5 * np.sqrt(dist * (1 - dist) / len(blocks)) + 1e-9)


def test_the_simulators_would_notice_a_wrong_formula():
    # the oracle has power: a plausible mistake (Q = α·β^(n+1)) is far outside the tolerance
    samples = simulate_paper(0.8, 0.6, 3, 2, cycles=CYCLES)
    wrong = (1 - 0.6**3) / 0.4 * (1 - (0.8 * 0.6**3) ** 3) / (1 - 0.8 * 0.6**3) + (0.8 * 0.6**3) ** 3
    assert not _within(samples, wrong)
    tokens, _ = simulate_composed(0.8, 0.6, 3, 2, cycles=CYCLES)
    assert not _within(tokens, expected_tokens(0.8, 0.6, 3, 2))  # the paper's process is not ours


@pytest.mark.parametrize(("alpha", "beta", "m", "n"), GRID)
def test_table_a1_is_a_distribution_whose_mean_is_theorem_3_2(alpha, beta, m, n):
    probs = paper_tokens_distribution(alpha, beta, m, n)
    assert len(probs) == m * (n + 1) + 1
    assert math.isclose(sum(probs), 1.0, rel_tol=1e-12)
    mean = sum((x + 1) * p for x, p in enumerate(probs))
    assert math.isclose(mean, expected_tokens(alpha, beta, m, n), rel_tol=1e-12, abs_tol=1e-12)


# -- the paper's special cases (§3.1), exactly -------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.55, 0.9, 1.0])
@pytest.mark.parametrize("m", [1, 2, 5, 9])
def test_n_zero_reduces_to_eq_1(alpha, m):
    for beta in (0.0, 0.3, 1.0):  # β drops out with no small tokens
        assert math.isclose(expected_tokens(alpha, beta, m, 0), _eq1(alpha, m), rel_tol=1e-12)
        assert math.isclose(composed_expected_tokens(alpha, beta, m, 0), _eq1(alpha, m), rel_tol=1e-12)


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.6, 0.95, 1.0])
@pytest.mark.parametrize("n", [0, 1, 3, 7])
def test_m_one_with_alpha_equal_beta_is_plain_sd_with_n_plus_1_guesses(beta, n):
    assert math.isclose(expected_tokens(beta, beta, 1, n), _eq1(beta, n + 1), rel_tol=1e-12)


def test_large_n_tends_to_one_over_one_minus_beta():
    assert math.isclose(expected_tokens(0.9, 0.5, 3, 80), 1 / (1 - 0.5), rel_tol=1e-9)


def test_composed_edge_cases():
    # α = 1: M_p takes every M_q token, so the cycle emits the block plus one
    assert composed_expected_tokens(1.0, 0.5, 3, 2) == pytest.approx(1 + 3 * (1 + 0.5 + 0.25))
    # β = 0: every round yields one M_q token, as if n were 0
    assert composed_expected_tokens(0.7, 0.0, 4, 3) == pytest.approx(_eq1(0.7, 4))
    assert sum(round_distribution(0.4, 3)) == pytest.approx(1.0)


# -- costs ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("alpha", "beta", "m", "n"), GRID[::5])
def test_free_verification_gives_the_paper_s_denominator(alpha, beta, m, n):
    inputs = PlanInputs(alpha, beta, 0.6, 0.3)
    row = plan_row(inputs, m, n)
    assert row.cost == pytest.approx(1 + m * 0.6 + m * n * 0.6 * 0.3, rel=1e-12)
    assert paper_cycle_cost(inputs, m, n) == pytest.approx(1 + m * 0.6 + m * n * 0.6 * 0.3, rel=1e-12)
    assert row.paper_speedup == pytest.approx(time_improvement(alpha, beta, 0.6, 0.3, m, n), rel=1e-12)
    assert row.paper_speedup == pytest.approx(expected_tokens(alpha, beta, m, n) / row.cost, rel=1e-12)


def test_verify_cost_is_charged_on_the_block_that_is_verified():
    v = (1.0, 1.2, 1.4, 1.7, 2.0, 2.3)
    inputs = PlanInputs(0.7, 0.6, 0.8, 0.9, verify=v, verify_medium=(1.0, 1.3, 1.5))
    m, n = 3, 2
    _, blocks = simulate_composed(0.7, 0.6, m, n, cycles=CYCLES)
    verify = np.array([curve_at(v, b + 1) for b in blocks])
    row = plan_row(inputs, m, n)
    medium_and_small = m * 0.8 * 1.5 + m * n * 0.8 * 0.9  # v_q(n+1) = 1.5
    assert _within(verify, row.cost - medium_and_small)


def test_curve_extends_linearly_and_free_is_one():
    assert curve_at((), 17) == 1.0
    assert curve_at((1.0, 1.5, 2.0), 2) == 1.5
    assert curve_at((1.0, 1.5, 2.0), 5) == pytest.approx(3.0)
    assert parse_curve("1, 1.25,1.5") == (1.0, 1.25, 1.5)
    assert parse_curve("") == ()


# -- the plan ---------------------------------------------------------------------------------------------
def test_plan_table_picks_the_best_and_compares_with_two_level_sd():
    plan = plan_table(PlanInputs(0.8, 0.6, 0.5, 0.5), max_m=5, max_n=3)
    assert len(plan.rows) == 5 * 4
    assert plan.best.speedup == max(r.speedup for r in plan.rows)
    assert plan.best_two_level.n == 0 and plan.best_two_level.speedup == max(r.speedup for r in plan.rows if r.n == 0)
    assert plan.best_three_level.n >= 1
    assert plan.third_level_pays == (plan.best_three_level.speedup > plan.best_two_level.speedup)


@pytest.mark.parametrize("cs", [0.1, 0.5, 0.9])
def test_break_even_cs_is_where_the_third_level_starts_to_pay(cs):
    base = dict(alpha=0.8, beta=0.7, c=0.5, verify=(1.0, 1.1, 1.25, 1.4))
    limit = plan_table(PlanInputs(cs=cs, **base), max_m=4, max_n=3).break_even_cs
    assert limit is not None
    assert plan_table(PlanInputs(cs=limit * 0.98, **base), max_m=4, max_n=3).third_level_pays
    assert not plan_table(PlanInputs(cs=limit * 1.02, **base), max_m=4, max_n=3).third_level_pays


def test_break_even_beta_is_where_the_third_level_starts_to_pay():
    base = dict(alpha=0.8, c=0.5, cs=0.5)
    beta = plan_table(PlanInputs(beta=0.1, **base), max_m=4, max_n=3).break_even_beta
    assert beta is not None and 0 < beta < 1
    assert plan_table(PlanInputs(beta=beta, **base), max_m=4, max_n=3).third_level_pays
    assert not plan_table(PlanInputs(beta=beta - 0.005, **base), max_m=4, max_n=3).third_level_pays


def test_an_expensive_small_draft_never_pays():
    plan = plan_table(PlanInputs(0.8, 0.3, 0.9, 1.0, verify=(1.0, 1.3, 1.6, 1.9, 2.2)), max_m=4, max_n=3)
    assert not plan.third_level_pays
    assert plan.break_even_cs is None or plan.break_even_cs < 1.0


# -- bad input --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: expected_tokens(1.1, 0.5, 2, 1), "alpha must be in [0, 1]"),
        (lambda: expected_tokens(-0.1, 0.5, 2, 1), "alpha must be in [0, 1]"),
        (lambda: expected_tokens(0.5, 1.5, 2, 1), "beta must be in [0, 1]"),
        (lambda: composed_expected_tokens(0.5, -1, 2, 1), "beta must be in [0, 1]"),
        (lambda: expected_tokens(0.5, 0.5, 0, 1), "m (medium tokens per cycle) must be an integer >= 1"),
        (lambda: expected_tokens(0.5, 0.5, True, 1), "m (medium tokens per cycle)"),
        (lambda: expected_tokens(0.5, 0.5, 2, -1), "n (small tokens per medium token) must be an integer >= 0"),
        (lambda: expected_tokens(0.5, 0.5, 2, 1.5), "n (small tokens"),
        (lambda: time_improvement(0.5, 0.5, -0.1, 0.5, 2, 1), "c must be a cost ratio >= 0"),
        (lambda: PlanInputs(0.5, 0.5, 0.5, float("nan")), "cs must be a cost ratio >= 0"),
        (lambda: PlanInputs(0.5, 0.5, 0.5, 0.5, verify=(1.0, -2.0)), "verify must list positive costs"),
        (lambda: plan_table(PlanInputs(0.5, 0.5, 0.5, 0.5), max_m=0), "m (medium tokens per cycle)"),
        (lambda: parse_curve("1,two"), "numbers separated by commas"),
    ],
)
def test_bad_inputs_are_one_line_config_errors(call, fragment):
    with pytest.raises(ConfigError) as info:
        call()
    assert fragment in str(info.value) and "\n" not in str(info.value)


# -- the CLI, analysis mode -------------------------------------------------------------------------------
def test_cli_plan_analysis_prints_the_table_and_the_verdict():
    result = runner.invoke(app, ["plan", "hierarchical", "--alpha", "0.8", "--beta", "0.6", "--c", "0.5", "--cs", "0.5",
                                 "--max-m", "3", "--max-n", "2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n| ") == 3 * 3 + 1  # header + one row per (m, n)
    assert "best two-level (n=0" in result.stdout and "best three-level" in result.stdout


def test_cli_plan_json_plot_and_report(tmp_path):
    png, md = tmp_path / "f.png", tmp_path / "sub" / "r.md"
    result = runner.invoke(app, ["plan", "hierarchical", "--alpha", "0.7", "--beta", "0.5", "--c", "0.6", "--cs", "0.4",
                                 "--verify", "1,1.2,1.4", "--max-m", "2", "--max-n", "1", "--json",
                                 "--plot", str(png), "--report", str(md)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["inputs"]["verify"] == [1.0, 1.2, 1.4] and len(data["rows"]) == 4
    expected = plan_table(PlanInputs(0.7, 0.5, 0.6, 0.4, verify=(1, 1.2, 1.4)), max_m=2, max_n=1)
    assert data["best"]["speedup"] == pytest.approx(expected.best.speedup)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| m | n |" in md.read_text()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        # bounds declared with the options (typer's min/max, shown in --help): typer's own one-line message
        (["--alpha", "1.2", "--beta", "0.6", "--c", "0.5", "--cs", "0.5"],
         "'--alpha': Input should be less than or equal to 1"),
        (["--alpha", "0.8", "--beta", "-0.1", "--c", "0.5", "--cs", "0.5"],
         "'--beta': Input should be greater than or equal to 0"),
        (["--alpha", "0.8", "--beta", "0.6", "--c", "0.5", "--cs", "0.5", "--max-m", "0"],
         "'--max-m': Input should be greater than or equal to 1"),
        (["--alpha", "0.8", "--beta", "0.6", "--c", "0.5", "--cs", "0.5", "--max-n", "-1"],
         "'--max-n': Input should be greater than or equal to 0"),
        (["--alpha", "0.8", "--beta", "0.6"], "analysis needs --c, --cs"),
        (["--alpha", "0.8", "--beta", "0.6", "--c", "0.5", "--cs", "0.5", "--validate"], "give either"),
        (["--alpha", "0.8", "--beta", "0.6", "--c", "0.5", "--cs", "0.5", "--verify", "1,x"], "separated by commas"),
        ([], "--medium and --small"),
        (["--medium", "profiles/smollm2-135m/example.yaml"], "both --medium and --small"),
    ],
)
def test_cli_plan_bad_input_is_one_line_and_exit_2(args, fragment):
    assert_one_line_error(runner.invoke(app, ["plan", "hierarchical", *args]), fragment)


# -- the CLI: two subcommands, and the old flat spelling for one release ------------------------------------
TPE = "profiles/smollm2-135m/cpu-float32-tpe.yaml"  # keeps its traces: re-planned with no model
H100 = "costs/roofline-h100-sxm-bfloat16.yaml"
ANALYSIS = ["--alpha", "0.8", "--beta", "0.6", "--c", "0.5", "--cs", "0.5", "--max-m", "2", "--max-n", "1"]


def _notices(result) -> list[str]:
    return [ln for ln in result.stderr.splitlines() if ln.startswith("notice: ")]


@pytest.mark.parametrize("argv", [["plan", "--help"], ["plan"]])
def test_plan_lists_its_subcommands_and_says_what_each_does(argv):
    result = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.replace("│", " ").split())
    assert "profile Re-plan a profile for a device's cost file" in text
    assert "hierarchical Plan hierarchical speculative decoding" in text
    assert "flat" not in text.split("Commands")[1]  # the old spelling's command is hidden


def test_each_subcommand_groups_its_options_into_panels():
    shown = {cmd: runner.invoke(app, ["plan", cmd, "--help"], env={"COLUMNS": "200"}).stdout
             for cmd in ("profile", "hierarchical")}
    for panel in ("Inputs", "Tracing (a profile that kept no record)", "Output"):
        assert f"─ {panel} ─" in shown["profile"], panel
    for panel in ("Analysis (given numbers, no model)", "Measured (two hand-picked profiles)", "From a study",
                  "Model and prompts", "Planner", "Output"):
        assert f"─ {panel}" in shown["hierarchical"], panel
    assert "--alpha" not in shown["profile"] and "--plot" not in shown["profile"]
    assert "--profile" not in shown["hierarchical"]


@pytest.mark.parametrize(("argv", "option"), [(["profile", "--profile", TPE, "--plot", "x.png"], "--plot"),
                                               (["hierarchical", "--profile", TPE], "--profile")])
def test_a_subcommand_refuses_the_other_s_options(argv, option):
    assert_one_line_error(runner.invoke(app, ["plan", *argv]), f"No such option: {option}")


def _same_but_one_notice(old, new, spelling: str) -> None:
    """The old spelling's run is the new one's, plus one ``notice:`` line on stderr that names ``spelling``."""
    assert old.exit_code == new.exit_code
    assert old.stdout == new.stdout
    notices = _notices(old)
    assert len(notices) == 1 and f"is now {spelling}" in notices[0], old.stderr
    assert [ln for ln in old.stderr.splitlines() if ln != notices[0]] == new.stderr.splitlines()
    assert _notices(new) == []


@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_the_old_analysis_spelling_runs_as_before_with_one_notice(as_json):
    old = runner.invoke(app, ["plan", *ANALYSIS, *as_json])
    new = runner.invoke(app, ["plan", "hierarchical", *ANALYSIS, *as_json])
    assert new.exit_code == 0, new.output
    _same_but_one_notice(old, new, "plan hierarchical --alpha")


def test_the_old_profile_spelling_re_plans_as_before_with_one_notice(tmp_path):
    args = ["--profile", TPE, "--costs", H100, "--json"]
    new = runner.invoke(app, ["plan", "profile", *args])
    assert new.exit_code == 0, new.output
    assert json.loads(new.stdout)
    _same_but_one_notice(runner.invoke(app, ["plan", *args]), new, "plan profile --profile")
    # and both write the same profile
    from skipsearch.profile import load_profile

    for argv, name in ((["plan"], "old.yaml"), (["plan", "profile"], "new.yaml")):
        assert runner.invoke(app, [*argv, *args, "--out", str(tmp_path / name)]).exit_code == 0
    old, new = load_profile(tmp_path / "old.yaml"), load_profile(tmp_path / "new.yaml")
    assert old.draft == new.draft and old.measured == new.measured


def test_the_old_study_and_measured_spellings_reach_their_mode_with_one_notice(tmp_path):
    """Both fail before any model loads (no study there; --out over a file that is not a profile): the same one
    error line as the new spelling, after the notice."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for old, new, spelling in (
            (["--study", str(tmp_path / "none")], ["hierarchical", "--study", str(tmp_path / "none")],
             "plan hierarchical --study"),
            (["--medium", TPE, "--small", TPE, "--out", str(notes)],
             ["hierarchical", "--medium", TPE, "--small", TPE, "--out", str(notes)],
             "plan hierarchical --medium --small")):
        was, now = runner.invoke(app, ["plan", *old]), runner.invoke(app, ["plan", *new])
        assert_one_line_error(now, "no study at" if "--study" in old else "is not a skipsearch profile")
        _same_but_one_notice(was, now, spelling)
    assert notes.read_text() == "mine"


@pytest.mark.parametrize(("args", "fragment"), [
    ([*ANALYSIS, "--profile", TPE], "give either --alpha --beta --c --cs (analysis), --medium and --small (measured), "
                                    "--profile or --study"),
    (["--profile", TPE, "--study", "s"], "give one of --profile, --study, or --medium and --small"),
    (["--medium", TPE], "both --medium and --small (measured), --profile or --study"),
])
def test_the_old_spelling_with_a_mix_of_modes_is_its_old_one_line_error_and_no_notice(args, fragment):
    """A mix names no new spelling: the error line alone, worded as before."""
    assert_one_line_error(runner.invoke(app, ["plan", *args]), fragment)


# -- the verdict and its break-evens agree (issue 14, cause 14) -------------------------------------------
def test_plan_c_zero_never_says_pays_and_not_even_a_free_small_draft_pays():
    """With c = 0 an M_s step is free at any c_s: the c_s line must not contradict the verdict."""
    result = runner.invoke(app, ["plan", "hierarchical", "--alpha", "0.8", "--beta", "0.6", "--c", "0", "--cs",
                                 "0.5"])
    assert result.exit_code == 0, result.output
    assert "the third level pays here" in result.stdout
    assert "not even a free M_s" not in result.stdout
    assert "pays at any c_s" in result.stdout
    plan = plan_table(PlanInputs(0.8, 0.6, 0.0, 0.5))
    assert plan.third_level_pays and plan.break_even_cs is None
    # and the verdict really does not move with c_s
    assert all(plan_table(PlanInputs(0.8, 0.6, 0.0, cs)).third_level_pays for cs in (0.0, 1.0, 50.0))


@pytest.mark.parametrize("seed", range(3))
def test_the_verdict_and_both_break_evens_never_disagree(seed):
    rng = np.random.default_rng(seed)
    for _ in range(15):
        alpha, beta = (float(x) for x in rng.choice([0.0, 0.3, 0.6, 0.8, 0.95, 1.0], 2))
        c, cs = float(rng.choice([0.0, 0.2, 0.6, 1.0])), float(rng.choice([0.0, 0.3, 0.9]))
        verify = () if rng.random() < 0.5 else tuple(np.cumsum([1.0, *rng.uniform(0.0, 0.5, 5)]))
        inputs = PlanInputs(alpha, beta, c, cs, verify=verify)
        plan = plan_table(inputs, max_m=3, max_n=2)
        pays = plan.third_level_pays
        if c > 0 and plan.break_even_cs is not None:
            assert pays == (cs < plan.break_even_cs)
        elif c > 0:
            assert not pays and not plan_table(PlanInputs(alpha, beta, c, 0.0, verify=verify), max_m=3,
                                               max_n=2).third_level_pays
        if plan.break_even_beta is not None:
            assert pays or beta < plan.break_even_beta  # "pays when β >= b" holds at the given β
            for b in (plan.break_even_beta, 1.0):
                assert plan_table(PlanInputs(alpha, b, c, cs, verify=verify), max_m=3, max_n=2).third_level_pays
        else:
            assert not plan_table(PlanInputs(alpha, 1.0, c, cs, verify=verify), max_m=3, max_n=2).third_level_pays
        text = format_plan(plan)
        assert ("pays here" in text) == pays and ("not even a free M_s" not in text or not pays)
        assert "not even β = 1 pays" not in text or not pays
