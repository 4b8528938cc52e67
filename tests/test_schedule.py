"""A draft length per batch size (skipsearch.files.schedule): the profile's ``schedule`` key round-trips and every bad
schedule is one line; old profiles stay valid; the planner picks K = 0 where a synthetic cost file makes
speculation lose and a positive K where it pays; ``plan --profile --costs`` writes a schedule from a batched cost
file and says in one line when the cost file has none."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from typer.testing import CliRunner

from skipsearch.cli import app
from skipsearch.files.cost_profile import load_costs, save_costs
from skipsearch.files.costs import BatchCosts, BatchedCosts
from skipsearch.files.errors import ProfileError
from skipsearch.files.schedule import (
    BatchRange,
    DraftPoint,
    Schedule,
    batch_draft_steps,
    cycle_speedup,
    parse_batch_sizes,
    plan_schedule,
    schedule_from_dict,
)
from skipsearch.profile import SCHEMA_VERSION, load_profile, profile_from_dict, profile_to_dict, save_profile

runner = CliRunner()
SHIPPED_COSTS = "costs/cpu-float32.yaml"
LOOKUP_PROFILE = "profiles/smollm2-135m/cpu-float32-code-1t.yaml"  # a lookup with a traced fallback: it re-plans
TOKENS = (1, 2, 3, 4, 6, 9, 13)


def grid(*, sizes=(1, 2, 4, 8, 16, 32), step=0.01, per_row_token=0.0, drafts=()) -> BatchedCosts:
    """A synthetic batched grid: a forward of B x T tokens costs ``step`` plus ``per_row_token`` per token of the
    B x T (0: memory-bound at every size; large: each verified token costs real compute)."""
    rows = tuple(BatchCosts(b, tuple(step + per_row_token * b * t for t in TOKENS),
                            tuple((s, v * (step + per_row_token * b)) for s, v in drafts)) for b in sizes)
    return BatchedCosts(TOKENS, rows, kernel="eager", context_tokens=64)


def test_a_schedule_round_trips_through_a_profile(tmp_path):
    prof = load_profile(LOOKUP_PROFILE)
    sched = Schedule((BatchRange(1, 3, 4, predicted=1.8), BatchRange(4, 7, 2, predicted=1.2, measured=1.1),
                      BatchRange(8, 16, 0, predicted=1.0)), considered=(0, 1, 2, 4), basis="synthetic")
    path = save_profile(dataclasses.replace(prof, schedule=sched), tmp_path / "p.yaml")
    back = load_profile(path)
    assert back.schedule == sched
    assert [back.schedule.k_for(b) for b in (1, 3, 4, 8, 16, 17, 100)] == [4, 4, 2, 0, 0, 0, 0]
    assert "schedule" in back.describe() and "B 1-3: K 4" in back.describe()
    assert yaml.safe_load(path.read_text())["schema_version"] == SCHEMA_VERSION


def test_decode_batch_size_runs_the_schedules_k_else_the_profiles_own():
    from skipsearch.api.decode import batch_k

    prof = load_profile(LOOKUP_PROFILE)
    own = prof.draft.max_draft_tokens
    assert [batch_k(prof, b) for b in (1, 4, 64)] == [own] * 3  # no schedule: the profile's K at every size
    sched = Schedule((BatchRange(1, 3, own + 1), BatchRange(4, 16, 0)), considered=(0, own + 1))
    scheduled = dataclasses.replace(prof, schedule=sched)
    assert [batch_k(scheduled, b) for b in (1, 3, 4, 16, 17)] == [own + 1, own + 1, 0, 0, 0]
    assert batch_k(None, 8) == 0


def test_a_profile_without_a_schedule_stays_valid(tmp_path):
    raw = yaml.safe_load(open(LOOKUP_PROFILE).read())
    assert "schedule" not in raw
    prof = profile_from_dict(raw)
    assert prof.schedule is None and "schedule" not in profile_to_dict(prof)
    old = {**raw, "schema_version": 4}
    assert profile_from_dict(old).schedule is None


def _ranges(*rows) -> dict:
    return {"ranges": [dict(zip(("start", "end", "k"), r, strict=True)) for r in rows], "considered": [0, 2]}


@pytest.mark.parametrize("raw, fragment", [
    (_ranges((1, 4, 2), (3, 8, 0)), "overlaps the range before it"),
    (_ranges((5, 2, 2)), "start 5 is after end 2"),
    (_ranges((1, 4, -1)), "schedule.ranges[0].k must be in 0..4095, got -1"),
    (_ranges((5, 8, 0), (1, 4, 2)), "comes before the range before it"),
    (_ranges((1, 4.5, 2)), "schedule.ranges[0].end must be an integer, got 4.5"),
    (_ranges((1, "4", 2)), "schedule.ranges[0].end must be an integer"),
    (_ranges((1, 4, True)), "schedule.ranges[0].k must be an integer"),
    (_ranges((0, 4, 2)), "schedule.ranges[0].start must be in 1..4096, got 0"),
    ({"ranges": []}, "schedule.ranges must list at least one range"),
    ({"ranges": [{"start": 1, "end": 2}]}, "missing required key k"),
    ({"ranges": [{"start": 1, "end": 2, "k": 1, "why": 3}]}, "unknown key 'why'"),
    ({**_ranges((1, 2, 1)), "considered": "all"}, "schedule.considered must list"),
    ({"ranges": [{"start": 1, "end": 2, "k": 1, "predicted": -1}]}, "predicted must be a positive number"),
])
def test_a_bad_schedule_is_one_line(tmp_path, raw, fragment):
    with pytest.raises(ProfileError) as e:
        schedule_from_dict(raw, source="p.yaml")
    assert fragment in str(e.value) and "\n" not in str(e.value)
    text = yaml.safe_load(open(LOOKUP_PROFILE).read())
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**text, "schedule": raw}))
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert fragment in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_the_planner_drops_speculation_where_the_verify_turns_compute_bound():
    points = [DraftPoint(1, 1.7, 0.1), DraftPoint(2, 2.2, 0.2), DraftPoint(4, 2.8, 0.4)]  # c = 0.1, K drafted
    # memory-bound at every size: a verify of k tokens costs one step, so the longest useful draft wins everywhere
    flat = plan_schedule(points, grid())
    assert [r.k for r in flat.ranges] == [4] and (flat.ranges[0].start, flat.ranges[0].end) == (1, 32)
    assert flat.considered == (0, 1, 2, 4)
    assert flat.ranges[0].predicted == pytest.approx(2.8 / (1 + 4 * 0.1), rel=1e-3)
    # each verified token costs a tenth of a step per row: speculation pays at B = 1 and loses by B = 32
    steep = grid(per_row_token=0.001)
    sched = plan_schedule(points, steep)
    assert sched.k_for(1) > 0 and sched.k_for(32) == 0
    assert sched.ranges[0].start == 1 and sched.ranges[-1].end == 32  # the last range ends at the largest B
    for a, b in zip(sched.ranges, sched.ranges[1:], strict=False):  # contiguous, sorted, one K per range
        assert b.start == a.end + 1 and a.k != b.k
    for r in sched.ranges:  # each range's K is the best at its first grid point, K = 0 where none beats plain by 3%
        best = max(cycle_speedup(p, steep, r.start) for p in points)
        assert (r.k == 0) == (best <= 1.03)


def test_a_draft_in_a_priced_scheme_grows_as_that_scheme_does():
    flat, cheap = grid(drafts=(("int8", 0.5),)), DraftPoint(2, 2.0, 2 * 0.5, scheme="int8")
    assert cycle_speedup(cheap, flat, 16) == pytest.approx(2.0 / (2 * 0.5 + 1.0))
    dearer = dataclasses.replace(flat, rows=tuple(dataclasses.replace(r, draft_seconds=(("int8", 0.5 * 0.01 * (
        1 + r.batch_size / 4)),)) for r in flat.rows))  # the draft grows with B, the full step does not
    assert cycle_speedup(cheap, dearer, 16) < cycle_speedup(cheap, dearer, 1)


def test_a_batch_drafts_as_long_as_its_longest_drafting_row():
    # a draft that always runs all K steps: a batch of any size runs K too
    assert batch_draft_steps(3.0, 3, 1) == pytest.approx(3.0) and batch_draft_steps(3.0, 3, 16) == pytest.approx(3.0)
    # a hybrid whose rows draft with the model in a quarter of the cycles (a lookup hit: none): at B = 1 the mean,
    # then the bound K(1 - (1 - 1/4)^B) of a batch's longest row, which grows towards K and never past it
    runs = [batch_draft_steps(1.0, 4, b) for b in (1, 2, 4, 8, 16, 64)]
    assert runs[0] == pytest.approx(1.0) and runs[1] == pytest.approx(4 * (1 - 0.75 ** 2))
    assert all(a < b for a, b in zip(runs, runs[1:], strict=False)) and runs[-1] <= 4.0
    assert batch_draft_steps(0.0, 4, 8) == 0.0 and batch_draft_steps(1.0, 0, 8) == 0.0  # a lookup drafts nothing
    # priced: at B = 1 the point's own cost; at B = 8 the longest row's steps at c(8) (flat here: c(B) = c(1))
    flat = grid(drafts=(("fp16", 0.5),))
    hybrid = DraftPoint(4, 2.5, 1.0 * 0.5, scheme="fp16")  # one model step per cycle on average, c = 0.5
    assert cycle_speedup(hybrid, flat, 1) == pytest.approx(2.5 / (0.5 + 1.0))
    assert cycle_speedup(hybrid, flat, 8) == pytest.approx(2.5 / (batch_draft_steps(1.0, 4, 8) * 0.5 + 1.0))
    always = DraftPoint(4, 2.5, 4 * 0.5, scheme="fp16")  # drafts all K every cycle: no growth from the batch
    assert cycle_speedup(always, flat, 8) == pytest.approx(cycle_speedup(always, flat, 1))


def test_the_planner_uses_a_measured_c_of_b_and_an_old_grid_without_one_keeps_the_fallback(tmp_path):
    points = [DraftPoint(2, 2.2, 2 * 0.1, scheme="fp16"), DraftPoint(4, 2.8, 4 * 0.1, scheme="fp16")]
    # an old schema-3 file: a memory-bound grid with no draft column; it loads, and the draft keeps its batch-1
    # share of a step at every B (the fallback), so speculation pays everywhere and the basis says why
    old = dataclasses.replace(load_costs(SHIPPED_COSTS), batched=grid())
    raw = yaml.safe_load(save_costs(old, tmp_path / "old.yaml").read_text())
    assert raw["schema_version"] == 3 and all("draft_seconds" not in r for r in raw["batched"]["rows"])
    fallback = plan_schedule(points, load_costs(tmp_path / "old.yaml").batched, basis="old.yaml")
    assert fallback.k_for(1) > 0 and fallback.k_for(32) > 0
    assert fallback.basis.startswith("old.yaml; ") and "the grid has no c(B) of fp16" in fallback.basis
    # the same grid with a measured c(B) that grows with B while the full step does not: drafting stops paying
    measured = dataclasses.replace(old.batched, rows=tuple(dataclasses.replace(
        r, draft_seconds=(("fp16", 0.001 * r.batch_size),)) for r in old.batched.rows))
    sched = plan_schedule(points, measured)
    assert sched.k_for(1) > 0 and sched.k_for(32) == 0
    assert "the grid's c(B) of fp16 per step" in sched.basis and "longest-drafting row" in sched.basis
    assert sched.ranges[0].predicted == pytest.approx(2.8 / (1 + 4 * 0.1), rel=1e-3)  # at B = 1, c(1) is the unit


@pytest.mark.parametrize("text", ["1,,2", "a,b", "4,2", "0,1", "1,1", "1,2.5", ""])
def test_bad_batch_sizes_are_one_value_error(text):
    with pytest.raises(ValueError) as e:
        parse_batch_sizes(text)
    assert "--batch-sizes" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, fragment", [("1,x", "must list integers"), ("2,4", "must include 1"),
                                             ("8,4,1", "ascending and distinct")])
def test_costs_batch_sizes_bad_input_is_one_line_exit_2(text, fragment):
    result = runner.invoke(app, ["costs", "--batch-sizes", text])
    assert result.exit_code == 2
    assert fragment in result.output and len(result.output.strip().splitlines()) == 1


def test_plan_writes_a_schedule_from_a_batched_cost_file(tmp_path):
    costs = load_costs(SHIPPED_COSTS)
    assert costs.batched is None  # an old (version-2) cost file still reads, without a grid
    batched = dataclasses.replace(costs, batched=grid(step=costs.costs.step_seconds,
                                                      per_row_token=costs.costs.step_seconds / 16))
    cpath = save_costs(batched, tmp_path / "batched.yaml")
    out = tmp_path / "out.yaml"
    result = runner.invoke(app, ["plan", "profile", "--profile", LOOKUP_PROFILE, "--costs", str(cpath), "--out",
                                 str(out)])
    assert result.exit_code == 0, result.output
    sched = load_profile(out).schedule
    assert sched is not None and sched.k_for(32) == 0 and 0 in sched.considered and str(cpath) in sched.basis
    assert sched.k_for(1) > 0  # the lookup pays at batch 1 on this CPU, as the profile's own re-plan says
    assert "schedule (draft length per batch size)" in result.output
    # the same cost file without its grid: today's re-plan, and one line that no schedule was planned
    plain = tmp_path / "plain.yaml"
    result = runner.invoke(app, ["plan", "profile", "--profile", LOOKUP_PROFILE, "--costs", SHIPPED_COSTS, "--out",
                                 str(plain)])
    assert result.exit_code == 0, result.output
    assert load_profile(plain).schedule is None
    assert sum("no schedule planned" in line for line in result.output.splitlines()) == 1
