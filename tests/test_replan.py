"""Search once, deploy anywhere: traces kept in profiles, re-planning for other costs, re-ranking a study,
the α/c Pareto front, and the hierarchical planner choosing its levels from a study."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import yaml
from clocks import ManualClock, work_clock
from conftest import assert_one_line_error, make_tiny_model
from typer.testing import CliRunner

from skipsearch.api.planning import plan_from_study, study_front
from skipsearch.cli import app
from skipsearch.config import Candidate, DraftConfig, Trace
from skipsearch.engine import timing
from skipsearch.engine.surrogate import K_VALUES, calibrate, replay_all, trace_skip_sets
from skipsearch.files.cost_profile import (
    CostModelRef,
    CostProfile,
    cost_model_of,
    load_costs,
    planned_costs_of,
    save_costs,
)
from skipsearch.files.costs import Costs, planned_costs_to_dict
from skipsearch.files.errors import ProfileError
from skipsearch.files.records import decode_trace, encode_trace
from skipsearch.measure import Measurement
from skipsearch.methods.hierarchical import Hierarchy
from skipsearch.methods.hierarchical.closed_form import best_draft_length, pareto_front
from skipsearch.methods.hierarchical.planner import choose_pairs
from skipsearch.methods.hybrid import replay_recorded
from skipsearch.methods.layer_skip import acceptance_to_dict, record_acceptance
from skipsearch.methods.ngram import lookup_to_dict, record_lookup, replay_lookup
from skipsearch.methods.precision import PRECISION_KEY, precision_from_dict
from skipsearch.methods.precision.replan import precision_ratio, record_precision
from skipsearch.profile import load_profile, save_profile
from skipsearch.search import replan as device_replan
from skipsearch.search.objective import ModelObjective
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies import make_strategy
from skipsearch.search.study import TrialRecord, load_records, open_study, records, run_search

runner = CliRunner()
CPU = "costs/cpu-float32.yaml"
SKIPS = [((5, 9, 13), ()), ((3, 5, 7, 9, 11, 13, 15, 17), (10, 14)), ((15,), ())]
ALPHAS = [0.9, 0.6, 0.95]


def synthetic_traces(alpha: float, *, sequences: int = 4, length: int = 64, seed: int = 0) -> tuple[Trace, ...]:
    """i.i.d. matches with probability α; the draft is confident where it matches."""
    rng = random.Random(seed)
    out = []
    for _ in range(sequences):
        matches = tuple(rng.random() < alpha for _ in range(length))
        out.append(Trace(matches, tuple(0.9 if m else 0.35 for m in matches)))
    return tuple(out)


def write_synthetic_profile(path, *, k: int = 2) -> str:
    """A 30-layer layer-skip profile as optimize writes it, with three kept skip sets and the CPU costs."""
    traced = {s: synthetic_traces(a, seed=i) for i, (s, a) in enumerate(zip(SKIPS, ALPHAS, strict=True))}
    record = record_acceptance(traced, workload="synthetic")
    cpu = load_costs(CPU)
    raw = {"schema_version": 2, "model": {"name": "smollm2-135m", "num_layers": 30}, "method": "layer-skip",
           "draft": {"skip_attn": list(SKIPS[0][0]), "skip_mlp": [], "max_draft_tokens": k},
           "measured": {"source": "optimize", "device": "cpu", "predicted_speedup": 0.8,
                        "acceptance": acceptance_to_dict(record),
                        "costs": planned_costs_to_dict(planned_costs_of(cpu, source=CPU))}}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def free_costs(num_layers: int = 30) -> CostProfile:
    """A made-up device where verification is free (v ≡ 1) and a draft step costs about a tenth of a verify
    cycle (c ≈ 0.1): the opposite corner to this CPU."""
    return CostProfile(CostModelRef("smollm2-135m", num_layers), "gpu-synthetic", "bfloat16",
                       Costs(0.05, 0.0001, 0.0001, 0.0001, (1.0,) * 13))


# -- the record --------------------------------------------------------------------------------------------
def test_a_trace_survives_its_one_byte_encoding():
    tr = Trace((True, False, True), (0.0, 0.5, 1.0))
    back = decode_trace(encode_trace(tr))
    assert back.matches == tr.matches
    assert all(abs(a - b) <= 0.5 / 127 for a, b in zip(back.confidences, tr.confidences, strict=True))


def test_a_broken_acceptance_record_is_one_line_on_load(tmp_path):
    path = tmp_path / "p.yaml"
    write_synthetic_profile(path)
    raw = yaml.safe_load(path.read_text())
    raw["measured"]["acceptance"]["skip_sets"][0]["traces"] = ["not base64!"]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError, match="measured.acceptance.skip_sets\\[0\\].traces holds a string that is not"):
        load_profile(path)
    result = runner.invoke(app, ["profile", "validate", str(path)])
    assert_one_line_error(result, "not base64")


# -- re-planning a profile ------------------------------------------------------------------------------------
def test_replanning_for_free_verify_and_cheap_drafts_drafts_longer(tmp_path):
    """The closed forms say: flatter v and smaller c never shorten K. The replay must agree in direction."""
    prof = load_profile(write_synthetic_profile(tmp_path / "p.yaml"))
    cpu, free = load_costs(CPU), free_costs()
    on_cpu, plan_cpu = device_replan.replan_profile(prof, cpu, source="p", costs_source=CPU)
    on_free, plan_free = device_replan.replan_profile(prof, free, source="p", costs_source="free")
    assert on_free.draft.max_draft_tokens > on_cpu.draft.max_draft_tokens
    assert plan_free.predicted.speedup > plan_cpu.predicted.speedup
    # the closed forms, for the chosen skip set's α and each device's c and v, point the same way
    alpha = ALPHAS[SKIPS.index((on_free.draft.skip_attn, on_free.draft.skip_mlp))]
    k_cpu = best_draft_length(alpha, cpu.cost_model().draft_ratio(on_free.draft), cpu.costs.verify_ratio)
    k_free = best_draft_length(alpha, free.cost_model().draft_ratio(on_free.draft), free.costs.verify_ratio)
    assert k_free > k_cpu
    # cheap drafts favour skipping more: the pick is never a dearer skip set than the CPU's best draft
    assert free.cost_model().draft_ratio(on_free.draft) <= free.cost_model().draft_ratio(plan_cpu.best_draft)
    # what was measured stays apart; the new costs replace the old; the measured block says it is not timed
    extra = dict(on_free.measured.extra)
    assert extra["acceptance"] == dict(prof.measured.extra)["acceptance"]
    assert extra["costs"]["device"] == "gpu-synthetic" and extra["costs"]["source"] == "free"
    assert on_free.measured.notes.startswith("predicted, not timed") and on_free.measured.speedup is None
    assert on_free.measured.baseline == "predicted"
    assert load_profile(save_profile(on_free, tmp_path / "free.yaml")) == on_free


def test_a_profile_re_planned_for_measured_hardware_takes_that_hardware_as_its_own(tmp_path):
    """Re-planned for a measured cost file, a profile's figures are predictions for that file's machine: decode's
    hardware note compares the machine with it, not with where the profile was first searched."""
    from dataclasses import replace

    from skipsearch.profile import Environment

    prof = load_profile(write_synthetic_profile(tmp_path / "p.yaml"))
    prof = replace(prof, environment=Environment(cpu_model="Searched-On CPU", threads=1))
    there = Environment(cpu_model="Planned-For CPU", cpu_capability="AVX512", threads=2)
    measured = replace(free_costs(), environment=there)
    on_measured, _ = device_replan.replan_profile(prof, measured, source="p", costs_source="there")
    assert on_measured.environment == there
    without = free_costs()  # a cost file that names no hardware leaves the profile's as it was
    assert device_replan.replan_profile(prof, without, source="p", costs_source="x")[0].environment == prof.environment


def test_cli_plan_profile_writes_the_replanned_profile(tmp_path):
    src = write_synthetic_profile(tmp_path / "p.yaml")
    free = save_costs(free_costs(), tmp_path / "free.yaml")
    out = tmp_path / "gpu.yaml"
    result = runner.invoke(app, ["plan", "profile", "--profile", src, "--costs", str(free), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "re-planned for gpu-synthetic" in result.stdout and f"wrote profile {out}" in result.stderr
    assert load_profile(out).draft.max_draft_tokens >= 3
    # without --costs it re-plans for the costs the profile kept: the CPU's, where K stays short
    again = runner.invoke(app, ["plan", "profile", "--profile", src, "--json"])
    assert again.exit_code == 0, again.output


def test_cli_plan_refuses_mixed_modes_and_lookup_profiles_without_their_record(tmp_path):
    assert_one_line_error(runner.invoke(app, ["plan", "--profile", "x.yaml", "--study", "s"]),
                          "give one of --profile, --study")
    raw = {"schema_version": 2, "model": {"name": "smollm2-135m", "num_layers": 30}, "method": "ngram",
           "draft": {"max_draft_tokens": 3}, "method_params": {"min_n": 1, "max_n": 3}}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    result = runner.invoke(app, ["plan", "profile", "--profile", str(tmp_path / "old.yaml"), "--costs", CPU])
    assert_one_line_error(result, "keeps no lookup record")


# -- re-planning a prompt-lookup profile (issue 22) ---------------------------------------------------------------
def lookup_calibration(seed: int = 0):
    """Greedy continuations that repeat their prompt in long runs, with a new token now and then: the lookup hits
    often and matches a few to a dozen tokens."""
    from skipsearch.engine.surrogate import Calibration

    rng = random.Random(seed)
    prompts, conts = [], []
    for _ in range(4):
        prompt = tuple(rng.randrange(100, 400) for _ in range(40))
        cont = []
        while len(cont) < 96:
            start = rng.randrange(0, 30)
            cont += list(prompt[start:start + rng.randrange(2, 14)]) + [rng.randrange(400, 500)]
        prompts.append(prompt)
        conts.append(tuple(cont[:96]))
    return Calibration(tuple(prompts), tuple(conts), 96)


def write_lookup_profile(path, *, method: str = "ngram", k: int = 4, record: bool = True) -> str:
    cal = lookup_calibration()
    params = {"min_n": 1, "max_n": 3} if method == "ngram" else {"min_n": 1, "max_n": 3, "fallback": "none"}
    measured = {"source": "optimize", "device": "cpu", "speedup": 1.2}
    if record:
        measured["lookup"] = lookup_to_dict(record_lookup(cal, min_n=1, max_n=3, workload="synthetic"))
    raw = {"schema_version": 2, "model": {"name": "smollm2-135m", "num_layers": 30}, "method": method,
           "draft": {"max_draft_tokens": k, "exit": {"threshold": None}}, "measured": measured,
           "method_params": params}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def steep_costs(num_layers: int = 30) -> CostProfile:
    """A made-up device where a k-token verify costs k steps and more: long drafts never pay for themselves."""
    return CostProfile(CostModelRef("smollm2-135m", num_layers), "cpu-steep", "float32",
                       Costs(0.05, 0.0001, 0.0001, 0.0001, tuple(1.0 + 0.45 * (k - 1) for k in range(1, 14))))


@pytest.mark.parametrize("method", ["ngram", "hybrid"])
def test_replanning_a_lookup_profile_chooses_a_longer_k_where_verification_is_free(tmp_path, method):
    prof = load_profile(write_lookup_profile(tmp_path / "p.yaml", method=method))
    on_free, plan_free = device_replan.replan_profile(prof, free_costs(), source="p", costs_source="free")
    on_steep, plan_steep = device_replan.replan_profile(prof, steep_costs(), source="p", costs_source="steep")
    assert on_free.draft.max_draft_tokens > max(on_steep.draft.max_draft_tokens, plan_steep.best_draft.max_draft_tokens)
    assert on_free.method == method and on_free.method_params == prof.method_params
    assert plan_free.predicted.speedup > plan_steep.predicted.speedup
    # the replay is exact: under the same v(k) it reproduces the ngram surrogate's own prediction
    extra = dict(on_free.measured.extra)
    assert extra["lookup"] == dict(prof.measured.extra)["lookup"]
    assert load_profile(save_profile(on_free, tmp_path / "free.yaml")) == on_free


def test_the_lookup_replay_is_the_ngram_surrogate(tmp_path):
    """Replaying the record gives what ngram's own surrogate predicts from the tokens (lookup time aside: the
    surrogate times its lookups, here on a clock that stands still, so that a loaded machine adds nothing)."""
    from types import SimpleNamespace

    from skipsearch.methods import ngram

    cal, costs = lookup_calibration(), steep_costs().cost_model()
    rec = record_lookup(cal, min_n=1, max_n=3)
    for k in (1, 3, 8, 12):
        cand = Candidate("ngram", DraftConfig(max_draft_tokens=k), (("min_n", 1), ("max_n", 3)))
        objective = SimpleNamespace(cal=cal, costs=costs, sm=SimpleNamespace(num_layers=30))
        with timing.use_clock(ManualClock()):
            want = ngram.METHOD.predict(objective, cand)
        got = replay_lookup(rec, k, costs)
        assert got.tau == pytest.approx(want.tau) and got.acceptance_rate == pytest.approx(want.acceptance_rate)
        assert got.speedup == pytest.approx(want.speedup, rel=0.02)


def test_cli_plan_re_plans_a_lookup_profile_and_refuses_one_without_its_record(tmp_path):
    src = write_lookup_profile(tmp_path / "p.yaml", method="hybrid")
    free = save_costs(free_costs(), tmp_path / "free.yaml")
    out = tmp_path / "gpu.yaml"
    result = runner.invoke(app, ["plan", "profile", "--profile", src, "--costs", str(free), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "its lookup record" in result.stdout and load_profile(out).draft.max_draft_tokens > 4
    old = write_lookup_profile(tmp_path / "old.yaml", method="hybrid", record=False)
    assert_one_line_error(runner.invoke(app, ["plan", "profile", "--profile", old, "--costs", str(free)]),
                          "keeps no lookup record (measured.lookup): it was written before lookup profiles kept one; "
                          "run optimize again")


# -- the study: re-ranking, the front, the planner's pick ---------------------------------------------------
@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    """A real (tiny) study: TPE with the surrogate on a random 6-layer model."""
    sm = make_tiny_model(num_layers=6)
    cal = calibrate(sm, [[3, 9, 4, 1, 7, 22, 5], [2, 8, 1, 30, 11]], max_new_tokens=16)
    objective = ModelObjective(sm, cal)
    strategy = make_strategy("tpe", SearchSpace(num_layers=6, max_draft_tokens=(1, 2, 4)), seed=0)
    folder = tmp_path_factory.mktemp("study")
    study = open_study(study_dir=folder, strategy=strategy)
    with work_clock(sm):  # TPE follows the surrogate's values, which follow measured costs: the same under any load
        run_search(study, strategy, objective, budget=14)
    return sm, cal, objective, records(study)


def test_rerank_under_the_studys_own_costs_reproduces_its_predictions(tiny_study):
    sm, cal, objective, recs = tiny_study
    from skipsearch.engine.measuring import architecture_of
    from skipsearch.files.cost_profile import costs_from_model

    own = CostProfile(CostModelRef(sm.name, 6, architecture_of(sm)), "cpu", "float32",
                      costs_from_model(objective.costs))
    rr = device_replan.rerank_study(sm, cal, recs, own, costs_source="own", shortlist=2)
    evaluated = [r for r in rr.rows if r.trial is not None]
    assert evaluated and all(r.predicted.speedup == pytest.approx(r.study_predicted) for r in evaluated)
    assert [r.predicted.speedup for r in rr.rows] == sorted((r.predicted.speedup for r in rr.rows), reverse=True)
    assert 1 <= len(rr.record.skip_sets) <= 2
    # under free verification and cheap drafts every config is predicted faster
    free = device_replan.rerank_study(sm, cal, recs, free_costs(num_layers=6), costs_source="free", shortlist=2)
    best_here = {r.config: r.predicted.speedup for r in rr.rows}
    assert all(r.predicted.speedup > best_here.get(r.config, 0) for r in free.rows if r.trial is not None)
    profile, verdict = device_replan.reranked_profile(sm, free, free_costs(6), study="s", dataset="tiny", n_prompts=2,
                                                      max_new_tokens=16, seed=0)
    assert verdict.startswith("ships") and profile.draft == free.rows[0].config
    assert profile.measured.notes.startswith("predicted, not timed") and profile.measured.baseline == "predicted"
    assert profile.schedule is None  # a cost file without a batched grid plans no schedule
    from skipsearch.files.costs import BatchCosts, BatchedCosts

    flat = BatchedCosts((1, 2), tuple(BatchCosts(b, (0.05, 0.05)) for b in (1, 8)))  # memory-bound at both sizes
    batched = dataclasses.replace(free_costs(6), batched=flat)
    profile, _ = device_replan.reranked_profile(sm, free, batched, study="s", dataset="tiny", n_prompts=2,
                                                max_new_tokens=16, seed=0)
    assert profile.schedule is not None and profile.schedule.k_for(1) > 0 and profile.schedule.ranges[-1].end == 8


def test_keep_portable_records_traces_that_replay_to_the_objectives_prediction(tiny_study, tmp_path):
    sm, cal, objective, recs = tiny_study
    config = next(r.config for r in recs if r.config is not None and r.config.skip_attn + r.config.skip_mlp)
    from skipsearch.profile import Measured, ModelRef, Profile

    base = Profile(ModelRef.of(sm), "layer-skip", config, measured=Measured(source="optimize"))
    kept = device_replan.keep_portable(base, objective, [Candidate("layer-skip", config)])
    back = load_profile(save_profile(kept, tmp_path / "k.yaml"))
    rec, planned = device_replan.portable_parts(back, source="k")
    assert len(rec.skip_sets) == 1 and planned.source == "measured by optimize"
    again = replay_all(rec.skip_sets[0].decoded(), config, cost_model_of(planned.costs, 6))
    assert again.speedup == pytest.approx(objective.predict(Candidate("layer-skip", config)).speedup, rel=0.02)


def _record(number: int, skip_attn, skip_mlp, alpha: float, c: float) -> TrialRecord:
    m = Measurement(kind="surrogate", speedup=0.5, alpha=alpha, cost_ratio=c)
    return TrialRecord(number, "COMPLETE", Candidate("layer-skip", DraftConfig(skip_attn, skip_mlp, 2)), m, None)


def test_pareto_front_on_a_synthetic_study():
    rng = random.Random(3)
    recs = [_record(i, (1 + i % 5,), (i % 3 + 1,) if i % 2 else (), rng.random(), rng.uniform(0.3, 1.0))
            for i in range(15)]
    recs.append(_record(99, (1,), (), 0.99, 0.99))  # a repeat of an earlier skip set: the first record counts
    front = study_front(recs)
    firsts = {}
    for r in recs:
        firsts.setdefault((r.config.skip_attn, r.config.skip_mlp), r)
    points = [(r.measurement.alpha, r.measurement.cost_ratio) for r in firsts.values()]
    brute = [p for p in points if not any(q[0] >= p[0] and q[1] <= p[1] and q != p for q in points)]
    assert sorted((p.alpha, p.c) for p in front) == sorted(brute)
    assert [p.c for p in front] == sorted(p.c for p in front) and [p.alpha for p in front] == sorted(
        p.alpha for p in front)
    assert pareto_front([(0.5, 0.5), (0.5, 0.5), (0.4, 0.6)]) == (0,)


def test_pairs_keep_the_decoders_rules(tiny_study):
    sm, cal, objective, recs = tiny_study
    front = study_front(recs, objective.costs)
    traces = trace_skip_sets(sm, cal, [p.config for p in front])
    pairs = choose_pairs(front, traces, objective.costs, max_m=3, max_n=2)
    assert pairs
    for p in pairs:
        Hierarchy(p.medium, p.small, p.best.m, p.best.n)  # raises if the rules are broken
        assert 0 <= p.alpha <= 1 and 0 <= p.beta <= 1 and p.cs <= 1


def test_plan_study_chooses_drafts_from_that_study(tiny_study):
    sm, cal, objective, recs = tiny_study
    sp = plan_from_study(sm, cal, recs, study="tiny", dataset="tiny", max_m=3, max_n=2, cost_repeats=1)
    skip_sets = {(r.config.skip_attn, r.config.skip_mlp) for r in recs if r.config is not None}
    rep = sp.report
    assert (rep.medium.skip_attn, rep.medium.skip_mlp) in skip_sets
    assert (rep.small.skip_attn, rep.small.skip_mlp) in skip_sets
    assert (rep.medium, rep.small) == (sp.pairs[0].medium, sp.pairs[0].small)
    assert rep.validation and all(v.measured_speedup > 0 for v in rep.validation)


# -- the optimize hook ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "fragment"), [
    (["--budget", "0"], "--budget must be >= 1, got 0 (--budget 0 re-ranks a study and needs --costs)"),
    (["--budget", "3", "--costs", CPU], "give --budget 0"),
    (["--budget", "0", "--costs", "nope.yaml"], "nope.yaml: cannot read"),
    (["--budget", "0", "--costs", CPU, "--study", "/nonexistent/s"], "no study at"),
    (["--budget", "0", "--costs", CPU, "--target-precision", "int8", "--study", "/nonexistent/s"],
     "cost file was measured on smollm2-135m's native target; model smollm2-135m is the int8 target: measure its "
     "costs with skipsearch costs --target-precision int8"),
])
def test_cli_optimize_costs_input_is_checked_before_the_model_loads(args, fragment):
    assert_one_line_error(runner.invoke(app, ["optimize", *args]), fragment)



def test_the_whole_workflow_through_the_cli_on_a_tiny_checkpoint(tiny_checkpoint, tmp_path):
    """Search, measure costs, re-plan the profile, re-rank the study, plan --study: every command, end to end.
    Every timing reads the work clock (tests/clocks.py): the searches pick what they pick on any machine's load."""
    with work_clock():
        _whole_workflow(tiny_checkpoint, tmp_path)


def _whole_workflow(tiny_checkpoint, tmp_path):
    model, study = str(tiny_checkpoint), str(tmp_path / "study")
    common = ["--model", model, "--n-prompts", "2", "--max-new-tokens", "8", "--dataset", "mtbench"]
    costs = tmp_path / "costs" / "tiny.yaml"
    result = runner.invoke(app, ["costs", "--model", model, "--device", "cpu", "--samples", "1", "--max-new-tokens",
                                 "8", "--out", str(costs)])
    assert result.exit_code == 0, result.output
    assert load_costs(costs).model.num_layers == 4
    searched = tmp_path / "p.yaml"
    result = runner.invoke(app, ["optimize", *common, "--budget", "8", "--shortlist", "2", "--study", study,
                                 "--out", str(searched)])
    assert result.exit_code == 0, result.output
    rec, planned = device_replan.portable_parts(load_profile(searched), source="p")
    assert rec is not None and rec.skip_sets and planned.source == "measured by optimize"
    # 2. re-plan the profile for the measured costs: no model needed
    result = runner.invoke(app, ["plan", "profile", "--profile", str(searched), "--costs", str(costs),
                                 "--out", str(tmp_path / "r.yaml")])
    assert result.exit_code == 0, result.output
    assert load_profile(tmp_path / "r.yaml").measured.notes.startswith("predicted, not timed")
    # 3. re-rank the study under the cost file, no new trials, and time the best
    before = len(load_records(study_dir=study)[1])
    result = runner.invoke(app, ["optimize", *common, "--study", study, "--costs", str(costs), "--budget", "0",
                                 "--shortlist", "1", "--time-shortlist", "--out", str(tmp_path / "rr.yaml")])
    assert result.exit_code == 0, result.output
    assert "timed here" in result.stdout and load_profile(tmp_path / "rr.yaml").search.strategy == "rerank"
    assert len(load_records(study_dir=study)[1]) == before
    # 4. the hierarchical planner picks its levels from the study, and validates them
    result = runner.invoke(app, ["plan", "hierarchical", *common, "--study", study, "--max-m", "2", "--max-n", "1",
                                 "--out", str(tmp_path / "h.yaml")])
    assert result.exit_code == 0, result.output
    hier = load_profile(tmp_path / "h.yaml")
    from skipsearch.methods.hierarchical import hierarchy_from_profile

    h = hierarchy_from_profile(hier)
    found = {(r.config.skip_attn, r.config.skip_mlp) for r in load_records(study_dir=study)[1] if r.config}
    assert (h.medium.skip_attn, h.medium.skip_mlp) in found and (h.small.skip_attn, h.small.skip_mlp) in found
    assert "Predicted against measured" in result.stdout


def test_an_ngram_search_keeps_the_lookup_record_that_re_planning_needs(tiny_sm, monkeypatch, tmp_path):
    from skipsearch.search import optimize as opt

    monkeypatch.setattr("skipsearch.engine.calibration.encode_prompt",
                        lambda tokenizer, prompt: [3, 17, 5, 3, 17, 5, len(prompt.text) % 60])
    result = opt.optimize(tiny_sm, opt.SearchSettings(strategy="ngram", budget=3, n_prompts=2, max_new_tokens=16,
                                                      objective="surrogate", study=str(tmp_path / "s")))
    prof = load_profile(save_profile(result.profile, tmp_path / "p.yaml"))
    assert prof.method == "ngram" and "lookup" in dict(prof.measured.extra)
    new, plan = device_replan.replan_profile(prof, free_costs(tiny_sm.num_layers), source="p", costs_source="free")
    assert plan.options and new.method == "ngram"


# -- re-planning a precision draft, and a hybrid with a precision fallback -----------------------------------------
def scheme_costs(verify, *, num_layers: int = 30, device: str = "dev", schemes: bool = True,
                 speedups: tuple[tuple[str, float], ...] = (("fp16", 8.0),)) -> CostProfile:
    """A made-up device whose sublayers are most of a step and whose fp16 copy runs them 8x faster (a precision
    draft's c ≈ 0.16 at 30 layers), with the verify curve ``verify``; ``speedups``: (scheme, how much faster its
    copy runs a sublayer) for each scheme it prices."""
    from skipsearch.files.costs import SchemeCosts

    sub = 0.048 / (2 * num_layers)
    return CostProfile(CostModelRef("smollm2-135m", num_layers), device, "float32",
                       Costs(0.05, sub, sub, 0.002, tuple(verify), 0.001,
                             tuple(SchemeCosts(s, sub / x, sub / x, 0.0) for s, x in speedups) if schemes else ()))


FREE_V = (1.0,) * 13  # verification free: long drafts pay
STEEP_V = tuple(float(k) for k in range(1, 14))  # a k-token verify costs k steps: long drafts never pay


def write_precision_profile(path, *, method: str = "precision", record: bool = True, k: int = 4,
                            others: tuple[tuple[str, float], ...] = ()) -> str:
    """A 30-layer precision profile (or hybrid with a precision fallback) as optimize writes it: the precision
    draft's traces (and, for the hybrid, the lookup record over the same sequences); ``others``: (scheme, α) of the
    same draft traced in other schemes (on a CPU), as optimize keeps them since it traces those too."""
    from skipsearch.methods.precision import PrecisionParams, precision_to_dict

    pp = PrecisionParams(scheme="fp16")
    params = dict(pp.to_pairs())
    measured = {"source": "optimize", "device": "cpu", "speedup": 1.1}
    shape = {}
    if method == "hybrid":
        cal = lookup_calibration()
        params = {"min_n": 1, "max_n": 3, "fallback": "precision", **params}
        measured["lookup"] = lookup_to_dict(record_lookup(cal, min_n=1, max_n=3, workload="synthetic"))
        shape = {"sequences": len(cal.prompts), "length": len(cal.continuations[0])}
    traces = synthetic_traces(0.9, **shape)
    if record:
        rec = record_precision(traces, DraftConfig(), pp, workload="s",
                               others=tuple((s, synthetic_traces(a, seed=i + 1, **shape), "cpu")
                                            for i, (s, a) in enumerate(others)))
        measured[PRECISION_KEY] = precision_to_dict(rec)
    raw = {"schema_version": 2, "model": {"name": "smollm2-135m", "num_layers": 30}, "method": method,
           "draft": {"max_draft_tokens": k, "exit": {"threshold": None}}, "measured": measured,
           "method_params": params}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


@pytest.mark.parametrize("method", ["precision", "hybrid"])
def test_replanning_a_precision_draft_chooses_a_longer_k_where_verification_is_free(tmp_path, method):
    prof = load_profile(write_precision_profile(tmp_path / "p.yaml", method=method))
    on_free, plan_free = device_replan.replan_profile(prof, scheme_costs(FREE_V), source="p", costs_source="free")
    on_steep, plan_steep = device_replan.replan_profile(prof, scheme_costs(STEEP_V), source="p", costs_source="steep")
    assert on_free.draft.max_draft_tokens > max(on_steep.draft.max_draft_tokens, plan_steep.best_draft.max_draft_tokens)
    assert plan_free.predicted.speedup > plan_steep.predicted.speedup
    # a hybrid's fallback_k is re-chosen beside K (test_re_planning_a_hybrid_re_chooses_its_fallback_k_with_k)
    new_params = dict(on_free.method_params)
    assert new_params.pop("fallback_k", 1) <= on_free.draft.max_draft_tokens
    assert on_free.method == method and new_params == dict(prof.method_params)
    # c is the target's: (step - L·(attn + mlp) + L·(scheme attn + scheme mlp)) / step
    assert plan_free.predicted.cost_ratio == pytest.approx((0.002 + 0.048 / 8) / 0.05)
    assert dict(on_free.measured.extra)[PRECISION_KEY] == dict(prof.measured.extra)[PRECISION_KEY]
    assert load_profile(save_profile(on_free, tmp_path / "free.yaml")) == on_free
    assert "precision" in device_replan.format_replan(prof, on_free, plan_free, scheme_costs(FREE_V))


def test_re_planning_a_hybrid_re_chooses_its_fallback_k_with_k(tmp_path):
    """A searched fallback_k is re-chosen beside K from the same record: where verification is free, a fallback
    searched at 1 token drafts far longer; the replay at the chosen fallback_k is what the plan predicts."""
    path = tmp_path / "h.yaml"
    write_precision_profile(path, method="hybrid")
    raw = yaml.safe_load(path.read_text())
    raw["method_params"]["fallback_k"] = 1
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    prof = load_profile(str(path))
    new, plan = device_replan.replan_profile(prof, scheme_costs(FREE_V), source="h", costs_source="free")
    k, fk = new.draft.max_draft_tokens, dict(new.method_params)["fallback_k"]
    assert 1 < fk <= k
    kept = device_replan.replan_profile(load_profile(save_profile(new, tmp_path / "n.yaml")), scheme_costs(FREE_V),
                                        source="n", costs_source="free")[1]
    assert kept.predicted.speedup == pytest.approx(plan.predicted.speedup)
    # the same replay with the searched fallback_k (1) predicts less under the same costs
    cal = lookup_calibration()
    rec = record_lookup(cal, min_n=1, max_n=3)
    traces = synthetic_traces(0.9, sequences=len(cal.prompts), length=len(cal.continuations[0]))
    costs = scheme_costs(FREE_V).cost_model()

    def replayed(fallback_k):
        return replay_recorded(rec, k, costs, fallback=DraftConfig(max_draft_tokens=fallback_k), traces=traces,
                               c=plan.predicted.cost_ratio).speedup
    assert replayed(fk) == pytest.approx(plan.predicted.speedup)
    assert replayed(1) < plan.predicted.speedup


def test_the_hybrid_replay_without_a_fallback_is_the_lookup_replay():
    """Lookup first, fallback on a miss (hybrid.LookupThenFallback) with no fallback is prompt lookup alone."""
    rec = record_lookup(lookup_calibration(), min_n=1, max_n=3)
    costs = steep_costs().cost_model()
    for k in (1, 4, 12):
        a, b = replay_recorded(rec, k, costs), replay_lookup(rec, k, costs)
        assert (a.speedup, a.tau) == (b.speedup, b.tau)
    with_fb = replay_recorded(rec, 4, costs, fallback=DraftConfig(max_draft_tokens=4), c=0.1,
                                            traces=synthetic_traces(1.0, sequences=4, length=96))
    # every miss now drafts, and every draft matches
    assert with_fb.tau > replay_lookup(rec, 4, costs).tau


def test_a_trimmed_precision_head_is_priced_at_its_share_of_the_lm_head():
    from skipsearch.methods.layer_skip import LayerSkipParams
    from skipsearch.methods.precision import PrecisionParams

    params = PrecisionParams(scheme="fp16", quant_head=False)
    costs = scheme_costs(FREE_V).costs
    full, none = precision_ratio(costs, 30, DraftConfig(), params, source="c")
    assert none is None
    head = LayerSkipParams.trimmed([0])  # V' = 1 of V = 4 tokens
    trimmed = PrecisionParams(scheme="fp16", quant_head=False, vocab_subset=head.vocab_subset,
                              vocab_ids=head.vocab_ids, vocab_sha256=head.vocab_sha256)
    c, note = precision_ratio(costs, 30, DraftConfig(), trimmed, source="c", vocab_size=4)
    assert c == pytest.approx(full - 0.001 * 0.75 / 0.05) and "approximation" in note
    _, note = precision_ratio(costs, 30, DraftConfig(), trimmed, source="c")
    assert "untrimmed" in note


def test_cli_plan_a_precision_profile_needs_the_scheme_in_the_cost_file(tmp_path):
    src = write_precision_profile(tmp_path / "p.yaml")
    cpu = load_costs(CPU)
    bare = str(save_costs(dataclasses.replace(cpu, costs=dataclasses.replace(cpu.costs, schemes=())),
                          tmp_path / "bare.yaml"))  # this CPU's costs, measured without --schemes
    assert_one_line_error(runner.invoke(app, ["plan", "profile", "--profile", src, "--costs", bare]),
                          f"{bare}: no costs for precision scheme fp16: measure them with "
                          "`skipsearch costs --schemes fp16`")
    free = save_costs(scheme_costs(FREE_V), tmp_path / "free.yaml")
    result = runner.invoke(app, ["plan", "profile", "--profile", src, "--costs", str(free), "--out",
                                 str(tmp_path / "o.yaml")])
    assert result.exit_code == 0, result.output
    assert "precision draft's traces" in result.stdout and load_profile(tmp_path / "o.yaml").draft.max_draft_tokens > 4
    old = write_precision_profile(tmp_path / "old.yaml", record=False)
    assert_one_line_error(runner.invoke(app, ["plan", "profile", "--profile", old, "--costs", str(free)]),
                          "keeps no precision record (measured.precision_traces)")
    hyb = write_precision_profile(tmp_path / "h.yaml", method="hybrid")
    assert_one_line_error(runner.invoke(app, ["plan", "profile", "--profile", hyb, "--costs", bare]),
                          "no costs for precision scheme fp16")


# -- a draft traced in several schemes re-plans in the best one the cost file prices ------------------------------
@pytest.mark.parametrize("method", ["precision", "hybrid"])
def test_a_draft_traced_in_several_schemes_re_plans_in_the_best_one_the_cost_file_prices(tmp_path, method):
    src = write_precision_profile(tmp_path / "p.yaml", method=method, others=(("int8", 0.8), ("int4", 0.5)))
    prof = load_profile(src)
    rec = precision_from_dict(dict(prof.measured.extra)[PRECISION_KEY])
    assert rec.schemes() == ("fp16", "int8", "int4") and rec.other("int8").device == "cpu"
    assert load_profile(save_profile(prof, tmp_path / "again.yaml")) == prof  # other_schemes round-trips
    # a GPU-like file: no fp16 (no CUDA kernel), int8 and int4 priced alike: the better-accepting int8 ships
    gpu = scheme_costs(FREE_V, device="cuda", speedups=(("int8", 8.0), ("int4", 8.0), ("fp8", 8.0)))
    new, plan = device_replan.replan_profile(prof, gpu, source="p", costs_source="gpu")
    assert dict(new.method_params)["scheme"] == "int8" and plan.predicted.speedup > 1.0
    assert "int8" in plan.basis and "int4" in plan.basis and "the best predicted" in plan.basis
    assert ("no costs for fp16" in plan.basis) == (method == "precision")
    assert "traced through the cpu kernel" in plan.note and "torchao Int8WeightOnlyConfig" in plan.note
    others = dict(new.method_params)
    assert {k: v for k, v in others.items() if k not in ("scheme", "fallback_k")} == {
        k: v for k, v in dict(prof.method_params).items() if k != "scheme"}
    # int8 as the draft's scheme now: the record still fits it, so the re-planned profile re-plans again
    saved = load_profile(save_profile(new, tmp_path / "gpu.yaml"))
    assert dict(device_replan.replan_profile(saved, gpu, source="g", costs_source="gpu")[0].method_params)[
        "scheme"] == "int8"
    # where a scheme runs far cheaper it wins over better acceptance; where the searched one is priced and best, it
    # stays (the searched scheme first on a tie)
    def replanned(*speedups):
        new, plan = device_replan.replan_profile(prof, scheme_costs(FREE_V, device="cuda", speedups=speedups),
                                                 source="p", costs_source="c")
        return dict(new.method_params)["scheme"], plan.predicted.speedup

    both = replanned(("int8", 1.2), ("int4", 60.0))
    assert both == ("int4", replanned(("int4", 60.0))[1]) and both[1] > replanned(("int8", 1.2))[1]
    alike = scheme_costs(FREE_V, speedups=(("fp16", 8.0), ("int8", 8.0), ("int4", 8.0)))
    assert dict(device_replan.replan_profile(prof, alike, source="p", costs_source="c")[0].method_params)[
        "scheme"] == "fp16"


def test_a_draft_traced_in_several_schemes_is_refused_in_one_line_where_none_is_priced(tmp_path):
    src = write_precision_profile(tmp_path / "p.yaml", others=(("int8", 0.8),))
    fp8 = save_costs(scheme_costs(FREE_V, device="cuda", speedups=(("fp8", 8.0),)), tmp_path / "fp8.yaml")
    assert_one_line_error(runner.invoke(app, ["plan", "profile", "--profile", src, "--costs", str(fp8)]),
                          f"{fp8}: no costs for any precision scheme this draft was traced in (fp16, int8): "
                          "measure one with `skipsearch costs --schemes int8`")
    # a record of one scheme (written before records traced others) is refused as it always was
    old = write_precision_profile(tmp_path / "old.yaml")
    assert_one_line_error(runner.invoke(app, ["plan", "profile", "--profile", old, "--costs", str(fp8)]),
                          "no costs for precision scheme fp16: it has no draft kernel on cuda")


def test_other_schemes_must_line_up_with_the_records_own_traces(tmp_path):
    path = tmp_path / "p.yaml"
    write_precision_profile(path, others=(("int8", 0.8),))
    raw = yaml.safe_load(path.read_text())
    raw["measured"][PRECISION_KEY]["other_schemes"]["int8"]["traces"].pop()
    path.write_text(yaml.safe_dump(raw))
    assert_one_line_error(runner.invoke(app, ["profile", "validate", str(path)]),
                          "measured.precision_traces.other_schemes.int8.traces are not lined up with")
    raw["measured"][PRECISION_KEY]["other_schemes"] = {"fp16": raw["measured"][PRECISION_KEY]["other_schemes"]["int8"]}
    path.write_text(yaml.safe_dump(raw))
    assert_one_line_error(runner.invoke(app, ["profile", "validate", str(path)]),
                          "other_schemes has 'fp16': it must name a precision scheme other than the record's own")


def test_a_broken_precision_record_is_one_line_on_load(tmp_path):
    path = tmp_path / "p.yaml"
    write_precision_profile(path)
    raw = yaml.safe_load(path.read_text())
    raw["measured"][PRECISION_KEY]["traces"] = ["not base64!"]
    path.write_text(yaml.safe_dump(raw))
    assert_one_line_error(runner.invoke(app, ["profile", "validate", str(path)]),
                          "measured.precision_traces.traces holds a string that is not base64")


@pytest.mark.parametrize("strategy", ["precision", "hybrid"])
def test_a_precision_search_keeps_the_record_that_re_planning_needs(tiny_sm, monkeypatch, tmp_path, strategy):
    from skipsearch.search import optimize as opt
    from skipsearch.search.strategies.hybrid import HybridStrategy

    monkeypatch.setattr("skipsearch.engine.calibration.encode_prompt",
                        lambda tokenizer, prompt: [3, 17, 5, 3, 17, 5, len(prompt.text) % 60])
    # the hybrid grid narrowed to precision fallbacks, so that what ships has one
    monkeypatch.setattr(HybridStrategy, "grid",
                        lambda self: {"n_range": ["1-2"], "k": [2, 4], "fallback": ["precision fp16"]})
    with work_clock(tiny_sm):  # the search picks its draft from measured costs: the same ones under any load
        result = opt.optimize(tiny_sm, opt.SearchSettings(strategy=strategy, budget=2, n_prompts=2,
                                                          max_new_tokens=16, objective="surrogate",
                                                          study=str(tmp_path / "s"),
                                                          strategy_options=(("schemes", ("fp16",)),)))
    prof = load_profile(save_profile(result.profile, tmp_path / "p.yaml"))
    extra = dict(prof.measured.extra)
    assert prof.method == strategy and PRECISION_KEY in extra
    assert ("lookup" in extra) == (strategy == "hybrid")
    assert extra["costs"]["schemes"]["fp16"].keys() == {"attn_seconds", "mlp_seconds", "head_saving_seconds"}
    L = tiny_sm.num_layers
    on_free, plan_free = device_replan.replan_profile(prof, scheme_costs(FREE_V, num_layers=L), source="p",
                                                      costs_source="free")
    on_steep, plan_steep = device_replan.replan_profile(prof, scheme_costs(STEEP_V, num_layers=L), source="p",
                                                        costs_source="steep")
    assert on_free.draft.max_draft_tokens > max(on_steep.draft.max_draft_tokens, plan_steep.best_draft.max_draft_tokens)
    own = device_replan.replan_profile(prof, device_replan.own_costs(prof, source="p"), source="p", costs_source="p")[1]
    assert own.options  # its own costs carry the scheme's
    # the draft was traced in the other schemes this CPU runs too, so a file without fp16 still prices it
    rec = precision_from_dict(extra[PRECISION_KEY])
    assert rec.schemes() == ("fp16", "int8", "int4") and extra["costs"]["schemes"].keys() == {"fp16"}
    gpu = scheme_costs(FREE_V, num_layers=L, device="cuda", speedups=(("int8", 8.0),))
    on_gpu, plan_gpu = device_replan.replan_profile(prof, gpu, source="p", costs_source="gpu")
    assert dict(on_gpu.method_params)["scheme"] == "int8" and "int8" in plan_gpu.basis


def test_a_hybrid_with_a_layer_skip_fallback_keeps_what_re_planning_needs(tiny_sm, monkeypatch, tmp_path):
    from skipsearch.search import optimize as opt
    from skipsearch.search.strategies.hybrid import HybridStrategy

    monkeypatch.setattr("skipsearch.engine.calibration.encode_prompt",
                        lambda tokenizer, prompt: [3, 17, 5, 3, 17, 5, len(prompt.text) % 60])
    grid = HybridStrategy.grid

    def skip_fallbacks_only(self):  # the grid narrowed to layer-skip fallbacks with the full head
        g = grid(self)
        return {**g, "k": [2, 4], "fallback": [f for f in g["fallback"] if f.endswith(" v0")][:1]}

    monkeypatch.setattr(HybridStrategy, "grid", skip_fallbacks_only)
    with work_clock(tiny_sm):  # the search picks its draft from measured costs: the same ones under any load
        result = opt.optimize(tiny_sm, opt.SearchSettings(strategy="hybrid", budget=2, n_prompts=2,
                                                          max_new_tokens=16, objective="surrogate",
                                                          study=str(tmp_path / "s")))
    prof = load_profile(save_profile(result.profile, tmp_path / "p.yaml"))
    extra = dict(prof.measured.extra)
    assert dict(prof.method_params)["fallback"] == "layer-skip" and {"lookup", "acceptance"} <= extra.keys()
    (kept,) = device_replan.portable_parts(prof, source="p")[0].skip_sets
    assert (kept.skip_attn, kept.skip_mlp) == (prof.draft.skip_attn, prof.draft.skip_mlp)
    L = tiny_sm.num_layers
    on_free, plan_free = device_replan.replan_profile(prof, free_costs(L), source="p", costs_source="free")
    on_steep, plan_steep = device_replan.replan_profile(prof, scheme_costs(STEEP_V, num_layers=L), source="p",
                                                        costs_source="steep")
    assert on_free.draft.max_draft_tokens > max(on_steep.draft.max_draft_tokens, plan_steep.best_draft.max_draft_tokens)
    assert on_free.method == "hybrid" and (on_free.draft.skip_attn, on_free.draft.skip_mlp) == (kept.skip_attn,
                                                                                                kept.skip_mlp)


# -- every shipped draft profile re-plans (issue 22) ----------------------------------------------------------------
# the hand-written format examples and the planner's inputs keep no record: plan traces their drafts on the model
HAND_WRITTEN = ("example.yaml", "hier-medium.yaml", "hier-small.yaml")
SHIPPED = sorted((Path(__file__).parents[1] / "profiles" / "smollm2-135m").glob("*.yaml"))
QUICK_TRACE = ["--n-prompts", "1", "--max-new-tokens", "12"]  # for the profiles that keep no record


def _flat_verify(costs: CostProfile) -> CostProfile:
    """This CPU's costs, scheme costs included, on a made-up device where a verify of any length costs one step."""
    flat = dataclasses.replace(costs.costs, verify_ratio=(1.0,) * len(costs.costs.verify_ratio))
    return dataclasses.replace(costs, device="flat-verify", costs=flat)


@pytest.fixture(scope="module")
def h100_roofline(tmp_path_factory):
    """A roofline H100 cost file for the default model, made by the command (its shapes from its config)."""
    out = tmp_path_factory.mktemp("roofline") / "h100.yaml"
    result = runner.invoke(app, ["costs", "--roofline", "h100-sxm", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return str(out)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_draft_profile_re_plans(path, tmp_path, h100_roofline):
    prof = load_profile(path, num_layers=30)
    flat = save_costs(_flat_verify(load_costs(CPU)), tmp_path / "flat.yaml")
    # a GPU roofline too: no shipped draft is refused there (a precision draft re-plans in a traced GPU scheme)
    gpu = tmp_path / f"{path.stem}-h100.yaml"
    result = runner.invoke(app, ["plan", "profile", "--profile", str(path), "--costs", h100_roofline, "--out", str(gpu),
                                 *QUICK_TRACE])
    if prof.model.target_precision == "int8":  # skipsearch's int8 products run on CPUs only: one line, nothing written
        assert_one_line_error(result, "made for the int8 target, which runs on CPUs in fp32")
        assert not gpu.exists()
        # a CPU's costs of the native target price another model's steps: one line naming the command to measure
        result = runner.invoke(app, ["plan", "profile", "--profile", str(path), "--costs", str(flat), "--out",
                                     str(gpu), *QUICK_TRACE])
        assert_one_line_error(result, "the profile's model (smollm2-135m) is the int8 target: measure its costs "
                                      "with skipsearch costs --target-precision int8")
        assert not gpu.exists()
        cp = load_costs(flat)
        int8 = save_costs(dataclasses.replace(cp, model=dataclasses.replace(cp.model, precision="int8")),
                          tmp_path / "flat-int8.yaml")
        result = runner.invoke(app, ["plan", "profile", "--profile", str(path), "--costs", str(int8), "--out",
                                     str(gpu), *QUICK_TRACE])
        assert result.exit_code == 0, result.output
        assert load_profile(gpu, num_layers=30).model.target_precision == "int8"  # a CPU re-plan keeps the target
        return
    assert result.exit_code == 0, result.output
    on_gpu = load_profile(gpu, num_layers=30)
    assert on_gpu.method == prof.method and on_gpu.measured.notes.startswith("predicted, not timed")
    was, now = dict(prof.method_params).get("scheme"), dict(on_gpu.method_params).get("scheme")
    assert (now in ("int8", "int4")) if was == "fp16" else (now == was)  # fbgemm's fp16 has no CUDA kernel
    if now is not None and on_gpu.schedule is not None:  # the schedule prices the scheme that ships, not the searched
        assert f"the {now} draft costs the grid's c(B) of {now}" in on_gpu.schedule.basis, on_gpu.schedule.basis
    for costs in (CPU, str(flat)):
        out = tmp_path / f"{path.stem}-{Path(costs).stem}.yaml"
        result = runner.invoke(app, ["plan", "profile", "--profile", str(path), "--costs", costs, "--out", str(out),
                                     *QUICK_TRACE])
        assert result.exit_code == 0, result.output
        new = load_profile(out, num_layers=30)
        assert new.method == prof.method and new.measured.notes.startswith("predicted, not timed")
        assert ("acceptance traced by plan on the model" in new.measured.notes) == (path.name in HAND_WRITTEN)
    here = load_profile(tmp_path / f"{path.stem}-cpu-float32.yaml", num_layers=30).draft.max_draft_tokens
    there = load_profile(tmp_path / f"{path.stem}-flat.yaml", num_layers=30).draft.max_draft_tokens
    assert there >= here  # a verify that costs no more than a step never makes drafting shorter pay


def test_a_profile_without_a_record_is_traced_once_and_then_re_plans_without_the_model(tmp_path, monkeypatch):
    from skipsearch.api import loading

    out = tmp_path / "example-cpu.yaml"
    result = runner.invoke(app, ["plan", "profile", "--profile", "profiles/smollm2-135m/example.yaml", "--costs", CPU,
                                 "--out", str(out), *QUICK_TRACE])
    assert result.exit_code == 0, result.output
    assert "keeps no acceptance record: tracing its draft on the model" in result.stderr
    kept = load_profile(out, num_layers=30)
    (skip_set,) = device_replan.portable_parts(kept, source="o")[0].skip_sets
    assert (skip_set.skip_attn, skip_set.skip_mlp) == ((5, 9, 13, 17, 21), ())  # example.yaml's draft
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the record is kept: no model needed"))
    again = runner.invoke(app, ["plan", "profile", "--profile", str(out), "--costs", CPU])
    assert again.exit_code == 0, again.output
    assert "tracing" not in again.stderr


def test_a_cost_file_for_another_model_fails_before_a_record_is_traced(tmp_path, monkeypatch):
    from skipsearch.api import loading

    other = dataclasses.replace(load_costs(CPU), model=CostModelRef("other", 12))
    path = save_costs(other, tmp_path / "other.yaml")
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    result = runner.invoke(app, ["plan", "profile", "--profile", "profiles/smollm2-135m/example.yaml", "--costs",
                                 str(path)])
    assert_one_line_error(result, "12")


def test_dynamic_clasp_re_plans_k_and_the_exit_rule_from_its_starting_skip_set(tmp_path):
    skip = SKIPS[0]
    traced = {skip: synthetic_traces(0.9)}
    raw = {"schema_version": 2, "model": {"name": "smollm2-135m", "num_layers": 30}, "method": "clasp-dynamic",
           "draft": {"skip_attn": list(skip[0]), "skip_mlp": [], "max_draft_tokens": 2},
           "measured": {"source": "optimize", "acceptance": acceptance_to_dict(
               record_acceptance(traced, workload="synthetic"))},
           "method_params": {"num_skips": len(skip[0]), "loi": 8, "sublayer": "attn"}}
    path = tmp_path / "dyn.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    prof = load_profile(path, num_layers=30)
    on_free, plan_free = device_replan.replan_profile(prof, free_costs(), source="p", costs_source="free")
    on_cpu, plan_cpu = device_replan.replan_profile(prof, load_costs(CPU), source="p", costs_source=CPU)
    assert on_free.method == on_cpu.method == "clasp-dynamic"
    assert on_free.draft.max_draft_tokens > on_cpu.draft.max_draft_tokens
    assert (on_free.draft.skip_attn, on_cpu.draft.skip_attn) == (skip[0], skip[0])  # the DP's start stays
    assert "approximation: dynamic CLaSp" in on_free.measured.notes
    for new in (on_free, on_cpu):  # both valid profiles of the method, whether a draft ships or not
        assert load_profile(save_profile(new, tmp_path / "n.yaml"), num_layers=30) == new


def test_a_hierarchical_profile_re_plans_m_and_n_from_its_alpha_and_beta(tmp_path):
    src = "profiles/smollm2-135m/cpu-float32-hier.yaml"
    prof = load_profile(src, num_layers=30)
    on_cpu, plan_cpu = device_replan.replan_profile(prof, load_costs(CPU), source=src, costs_source=CPU)
    on_free, plan_free = device_replan.replan_profile(prof, free_costs(), source=src, costs_source="free")
    # the closed forms, fed the same α and β: cheap levels and a free verify draft bigger blocks
    assert on_free.draft.max_draft_tokens > on_cpu.draft.max_draft_tokens
    assert plan_free.predicted.speedup > 1.0 > plan_cpu.predicted.speedup
    assert "no (m, n) beats plain decoding" in plan_cpu.note and "no (m, n)" not in plan_free.note
    extra = dict(on_free.measured.extra)
    assert (extra["alpha"], extra["beta"]) == (dict(prof.measured.extra)["alpha"], dict(prof.measured.extra)["beta"])
    assert extra["verify_cost_v"] == [1.0] * 13 and on_free.measured.notes.startswith("predicted, not timed")
    params = dict(on_free.method_params)
    assert on_free.draft.max_draft_tokens == params["m"] * (params["n"] + 1)
    assert load_profile(save_profile(on_free, tmp_path / "free.yaml"), num_layers=30) == on_free
    # a hierarchical profile without its α and β is one line
    raw = yaml.safe_load(open(src))
    del raw["measured"]["beta"]
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    assert_one_line_error(runner.invoke(app, ["plan", "profile", "--profile", str(tmp_path / "old.yaml"),
                                              "--costs", CPU]),
                          "keeps no α and β")


def test_a_profile_that_ships_plain_decoding_re_plans_among_drafts_only(tmp_path):
    prof = load_profile(write_synthetic_profile(tmp_path / "p.yaml", k=0), num_layers=30)
    assert prof.draft.is_autoregressive
    _, plan = device_replan.replan_profile(prof, load_costs(CPU), source="p", costs_source=CPU)
    # its own K = 0 is no option: the best draft shown is a draft, whatever ships
    assert plan.best_draft is not None and not plan.best_draft.is_autoregressive
    assert all(not config.is_autoregressive for config, _ in plan.options)


# -- a method of its own: its package and one registry line (issue 29) -------------------------------------------
@pytest.fixture
def toy():
    """The toy method (tests/toy_method.py), registered for one test."""
    import toy_method

    from skipsearch import methods

    methods.register(toy_method.METHOD)  # the one registry line a new method adds
    try:
        yield toy_method
    finally:
        methods.unregister(toy_method.NAME)


def test_a_new_method_re_plans_through_its_own_record_and_re_plan(toy, tmp_path):
    from skipsearch.profile import Measured, ModelRef, Profile

    profile = Profile(ModelRef("smollm2-135m", 30), toy.NAME, DraftConfig(max_draft_tokens=2),
                      measured=Measured(source="optimize", speedup=0.9, extra=((toy.KEY, {"alpha": 0.9}),)),
                      method_params=(("draft_cost", 0.05),))
    src = save_profile(profile, tmp_path / "toy.yaml")  # its record is checked by its own reader, before writing
    assert load_profile(src) == profile
    free, out = save_costs(free_costs(), tmp_path / "free.yaml"), tmp_path / "gpu.yaml"
    result = runner.invoke(app, ["plan", "profile", "--profile", str(src), "--costs", str(free), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "re-planned for gpu-synthetic (bfloat16) from its toy record (α 0.9)" in result.stdout
    new = load_profile(out)
    # v ≡ 1 and c = 0.05: every longer K pays more, so the longest the re-plan tries ships
    assert new.method == toy.NAME and new.draft.max_draft_tokens == max(K_VALUES)
    assert new.measured.notes.startswith("predicted, not timed") and dict(new.measured.extra)[toy.KEY] == {
        "alpha": 0.9}
    # a broken record is one line on load, from the toy's own reader
    raw = yaml.safe_load(open(src))
    raw["measured"][toy.KEY] = {"alpha": "high"}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    assert_one_line_error(runner.invoke(app, ["profile", "validate", str(tmp_path / "bad.yaml")]),
                          f"measured.{toy.KEY}.alpha must be a number in [0, 1)")
