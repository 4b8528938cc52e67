"""``skipsearch plan`` as one library function per mode, each returning a ``PlanOutcome``.

- ``plan_given``: the hierarchical planner on given α, β, c, c_s (and v(k)): no model;
- ``plan_profiles``: the same with inputs measured on the model for two profiles' drafts
  (``methods.hierarchical.planner``);
- ``replan_profile_file``: a profile re-planned for another device's cost file, from what it kept (no model), or
  from its draft traced on the model when it kept nothing;
- ``plan_study``: the two levels chosen from a study's α/c Pareto front, planned, and validated.

None of them writes a file: the caller writes ``PlanOutcome.profile`` (if it asked for one) and the report.

The hierarchical planner is the method's (``methods.hierarchical.planner``, on a calibration made here); what
reads a study into its front (``study_front``, ``plan_from_study``) and what makes a profile of its plan
(``build_profile``) are here, above the method.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skipsearch import methods
from skipsearch.api.checks import check_prompts_fit, check_study_for_model, costs_hardware_note, costs_model_note
from skipsearch.config import NO_EXIT, ConfigError, DraftConfig
from skipsearch.engine.calibration import calibrate_on, calibration_prompts, calibration_workload
from skipsearch.methods.hierarchical import METHOD as HIERARCHICAL
from skipsearch.methods.hierarchical import Hierarchy, hierarchy_to_profile_fields
from skipsearch.profile import (
    BASELINE_OURS_AR,
    BASELINE_PREDICTED,
    Environment,
    Measured,
    ModelRef,
    Profile,
    SearchInfo,
    load_profile,
)

if TYPE_CHECKING:
    from skipsearch.engine.surrogate import Calibration, CostModel
    from skipsearch.methods.hierarchical.closed_form import Plan
    from skipsearch.methods.hierarchical.planner import FrontPoint, PlanReport, StudyPlan
    from skipsearch.model.skippable import SkippableModel

Say = Callable[[str], None]


@dataclass(frozen=True)
class PlanOutcome:
    plan: Plan | None  # the (m, n) table, for --plot; None for a re-planned profile
    data: dict[str, Any]  # what --json prints
    text: str  # what is printed otherwise
    body: str  # the Markdown report
    profile: Profile | None = None  # the profile it makes, where one was asked for


def plan_given(alpha: float, beta: float, c: float, cs: float, *, verify: Sequence[float] = (), max_m: int = 8,
               max_n: int = 4) -> PlanOutcome:
    """The planner's table over (m, n) for given inputs (``closed_form.plan_table``)."""
    from skipsearch.methods.hierarchical import closed_form as planner

    inputs = planner.PlanInputs(alpha, beta, c, cs, verify=tuple(verify))
    result = planner.plan_table(inputs, max_m=max_m, max_n=max_n)
    text = planner.format_plan(result)
    return PlanOutcome(result, result.to_dict(), text, f"# Hierarchical planner, given inputs\n\n{text}\n")


def plan_profiles(medium: str, small: str, *, model: str | None = None, dataset: str = "mtbench", n_prompts: int = 4,
                  max_new_tokens: int = 64, max_m: int = 8, max_n: int = 4, validate: bool = False, repeats: int = 1,
                  seed: int = 0, device: str = "auto", dtype: str = "auto", want_profile: bool = False,
                  command: str | None = None, on_stage: Say | None = None) -> PlanOutcome:
    """The planner on α, β, c, c_s measured on the model for the ``medium`` and ``small`` profiles' drafts
    (``methods.hierarchical.planner.plan_model``, on calibration prompts from ``dataset``); ``validate`` times the
    best pairs. With ``want_profile``, the hierarchical profile of the chosen (m, n).

    Everything that can be checked without the model (profiles, level rules, prompts) is checked first."""
    from skipsearch.methods.hierarchical import planner
    from skipsearch.model.loader import load_model
    from skipsearch.profile import check_model

    med, sml = load_profile(medium), load_profile(small)
    Hierarchy(med.draft, sml.draft, max_m, max_n)
    prompts = calibration_prompts(dataset, n_prompts=n_prompts, seed=seed)  # a bad prompt file fails before loading
    check_prompts_fit(model or med.model.name, prompts, max_new_tokens=max_new_tokens)  # and one too long for it
    sm = load_model(model or med.model.name, device=device, dtype=dtype)
    for path, prof in ((medium, med), (small, sml)):
        check_model(prof, num_layers=sm.num_layers, fingerprint=sm.fingerprint, source=path)
    cal = calibrate_on(sm, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, seed=seed,
                       say=on_stage)
    rep = planner.plan_model(sm, cal, med.draft, sml.draft, dataset=dataset, seed=seed, max_m=max_m, max_n=max_n,
                             run_validation=validate, repeats=repeats, on_stage=on_stage)
    text = planner.render_markdown(rep, num_layers=sm.num_layers, command=command)
    profile = build_profile(rep, sm, rep.chosen()) if want_profile else None
    return PlanOutcome(rep.plan, rep.to_dict(), text, text, profile)


def replan_profile_file(profile: str, *, costs: str | None = None, command: str | None = None,
                        model: str | None = None, dataset: str = "mtbench", n_prompts: int = 4,
                        max_new_tokens: int = 64, seed: int = 0, device: str = "auto", dtype: str = "auto",
                        on_stage: Say | None = None) -> PlanOutcome:
    """The profile at ``profile`` re-planned for the device of the cost file ``costs`` (without one, for the costs
    the profile kept), from its kept traces or records: no model (``device_replan.replan_profile``).

    A profile that keeps no record of what its draft accepts (hand-written, or older than records) has its draft
    traced on the model first (``device_replan.record_on_model``: ``n_prompts`` calibration prompts of ``dataset``, one
    forward per sequence, no timing); the re-planned profile keeps that record, so the next re-plan needs no
    model. The cost file is checked against the profile's model before the model loads."""
    from skipsearch.files.cost_profile import load_costs
    from skipsearch.search import replan as device_replan

    say = on_stage or (lambda _msg: None)
    prof = load_profile(profile)
    target = load_costs(costs) if costs else device_replan.own_costs(prof, source=profile)
    source = costs or profile
    try:
        new, planned = device_replan.replan_profile(prof, target, source=profile, costs_source=source)
    except device_replan.NoRecordError:  # raised after the cost file's checks, so nothing loads for a bad one
        traced = calibration_workload(dataset, n_prompts, max_new_tokens)
        prof = _record_on_model(prof, profile, model=model, dataset=dataset, n_prompts=n_prompts,
                                max_new_tokens=max_new_tokens, seed=seed, device=device, dtype=dtype,
                                workload=traced, say=say)
        new, planned = device_replan.replan_profile(prof, target, source=profile, costs_source=source, traced=traced)
    modelled = costs_model_note(target, source if costs else f"{profile}'s measured.costs")
    if modelled:  # the plan is as good as the model it priced with (said once it is made: an error stays one line)
        say(f"note: {modelled}")
    text = device_replan.format_replan(prof, new, planned, target)
    if target.batched is None:  # part of the plan's text, not a stderr line: an error after it stays one line
        text += (f"\nno schedule planned: {source} has no batched grid (skipsearch costs --batch-sizes 1,2,4,8,16 "
                 "measures one); the profile runs its own K at every batch size")
    body = f"# Re-planned profile\n\n```\n{command}\n```\n\n{text}\n"
    return PlanOutcome(None, device_replan.replan_to_dict(new, planned), text, body, new)


def _record_on_model(prof: Profile, path: str, *, model: str | None, dataset: str, n_prompts: int,
                     max_new_tokens: int, seed: int, device: str, dtype: str, workload: str, say: Say) -> Profile:
    """``prof`` with its draft's acceptance record made on the model it names (or ``model``, checked against it)."""
    from skipsearch.api.loading import open_model
    from skipsearch.search import replan as device_replan

    prompts = calibration_prompts(dataset, n_prompts=n_prompts, seed=seed)  # a bad prompt file fails before loading
    check_prompts_fit(model or prof.model.name, prompts, max_new_tokens=max_new_tokens)  # and one too long for it
    say(f"{path} keeps no acceptance record: tracing its draft on the model ({workload}; no timing)")
    sm, _ = open_model(model=model, profile=path, device=device, dtype=dtype)
    cal = calibrate_on(sm, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, seed=seed)
    return device_replan.record_on_model(prof, sm, cal, workload=workload, source=path)


def plan_study(study: str, *, costs: str | None = None, model: str | None = None, dataset: str = "mtbench",
               n_prompts: int = 4, max_new_tokens: int = 64, max_m: int = 8, max_n: int = 4, validate: bool = True,
               repeats: int = 1, seed: int = 0, device: str = "auto", dtype: str = "auto", want_profile: bool = False,
               command: str | None = None, on_stage: Say | None = None, on_note: Say | None = None) -> PlanOutcome:
    """The hierarchical planner with its two levels chosen from the study's α/c Pareto front
    (``plan_from_study``), under ``costs`` or costs measured here. The study is checked against the
    model before it loads; ``on_note`` gets a line when the cost file was measured on other hardware."""
    from skipsearch.engine.measuring import check_costs_for
    from skipsearch.files.cost_profile import load_costs
    from skipsearch.methods.hierarchical import planner
    from skipsearch.model.loader import load_model
    from skipsearch.search import replan as device_replan
    from skipsearch.search.study import load_study

    say = on_stage or (lambda _msg: None)
    # 1. the input, before the model loads
    target = load_costs(costs) if costs else None
    label, records, attrs = load_study(study_dir=study)
    check_study_for_model(label, attrs, model or "smollm2-135m")
    skip_sets = {(c.skip_attn, c.skip_mlp) for c in device_replan.plain_configs(records)}
    if len(skip_sets) < 2:
        raise ConfigError(f"study {label} has {len(skip_sets) or 'no'} evaluated layer-skip skip set"
                          f"{'s' if len(skip_sets) != 1 else ''}: planning two levels needs at least two distinct ones")
    prompts = calibration_prompts(dataset, n_prompts=n_prompts, seed=seed)  # a bad prompt file fails before loading
    check_prompts_fit(model or "smollm2-135m", prompts, max_new_tokens=max_new_tokens)  # and one too long for it
    # 2. the model: calibrate, choose the pairs, plan and validate
    sm = load_model(model or "smollm2-135m", device=device, dtype=dtype)
    if target is not None:
        check_costs_for(target, sm, source=costs)
        note = costs_hardware_note(target, sm, costs)
        if note and on_note:
            on_note(note)
    cal = calibrate_on(sm, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, seed=seed, say=say)
    sp = plan_from_study(sm, cal, records, study=label, dataset=dataset, costs=target.cost_model() if target else None,
                         seed=seed, max_m=max_m, max_n=max_n, run_validation=validate, repeats=repeats, on_stage=say)
    text = planner.render_study_markdown(sp, num_layers=sm.num_layers, command=command)
    profile = None
    if want_profile:
        pick = sp.report.chosen()
        if (pick.medium.skip_attn, pick.medium.skip_mlp) == (pick.small.skip_attn, pick.small.skip_mlp):
            raise ConfigError(f"study {label}: the planner's two levels are the same skip set; no hierarchical "
                              f"profile written (the study needs more distinct evaluated skip sets)")
        chosen = build_profile(sp.report, sm, pick)
        profile = dataclasses.replace(chosen, search=dataclasses.replace(chosen.search, study=label))
    data = {"study": label, "front": [dataclasses.asdict(p) for p in sp.front],
            "pairs": [dataclasses.asdict(p) for p in sp.pairs], "report": sp.report.to_dict()}
    return PlanOutcome(sp.report.plan, data, text, text, profile)


# -- the hierarchical planner's study and profile sides --------------------------------------------------------
def study_front(records: Sequence, costs: CostModel | None = None) -> tuple[FrontPoint, ...]:
    """The Pareto front of a study's layer-skip skip sets on α (higher) against c (lower). c comes from
    ``costs`` where given (another device's), else from what the study recorded; a draft that skips nothing
    is the full model, not a level."""
    from skipsearch.methods.hierarchical.closed_form import pareto_front
    from skipsearch.methods.hierarchical.planner import FrontPoint

    points: dict[tuple, FrontPoint] = {}
    for r in records:
        m = r.measurement
        if not methods.is_plain(r.candidate) or m is None or m.alpha is None:
            continue
        d = r.config
        if not (d.skip_attn or d.skip_mlp):
            continue
        key = (d.skip_attn, d.skip_mlp)
        c = costs.draft_ratio(d) if costs is not None else m.cost_ratio
        if c is None or key in points:
            continue
        points[key] = FrontPoint(DraftConfig(d.skip_attn, d.skip_mlp, 0, NO_EXIT), m.alpha, c, r.number)
    listed = list(points.values())
    return tuple(listed[i] for i in pareto_front([(p.alpha, p.c) for p in listed]))


def plan_from_study(sm: SkippableModel, cal: Calibration, records: Sequence, *, study: str, dataset: str,
                    costs: CostModel | None = None, seed: int = 0, max_m: int = 8, max_n: int = 4,
                    run_validation: bool = True, repeats: int = 1, cost_repeats: int = 7,
                    on_stage: Say | None = None) -> StudyPlan:
    """The study's front (``study_front``) under ``costs`` or costs measured here, then the planner on it
    (``planner.plan_from_front``: pairs, and the best pair measured, planned and, with ``run_validation``, timed)."""
    from skipsearch.engine.surrogate import measure_costs
    from skipsearch.methods.hierarchical.planner import plan_from_front

    say = on_stage or (lambda _msg: None)
    for r in records:
        if r.config is not None:
            r.config.check_layers(sm.num_layers)  # a study of another model names other layers
    if costs is None:
        say("timing the cost model (per-sublayer costs, v(k))")
        costs = measure_costs(sm, cal.cost_context, repeats=cost_repeats)
    front = study_front(records, costs)
    if not front:
        raise ConfigError(f"study {study} has no evaluated layer-skip draft with a recorded α: nothing to plan from")
    return plan_from_front(sm, cal, front, costs, study=study, dataset=dataset, seed=seed, max_m=max_m, max_n=max_n,
                           run_validation=run_validation, repeats=repeats, cost_repeats=cost_repeats,
                           on_stage=on_stage)


def build_profile(rep: PlanReport, sm: SkippableModel, h: Hierarchy) -> Profile:
    """A ``method: hierarchical`` profile for ``h``, with what was predicted and measured for it."""
    from skipsearch.methods.hierarchical.closed_form import plan_row

    draft, params = hierarchy_to_profile_fields(h)
    row = plan_row(rep.plan.inputs, h.m, h.n)
    val = next((r for r in rep.validation if (r.m, r.n) == (h.m, h.n)), None)
    extra = (("alpha", round(rep.acceptance.alpha, 4)), ("beta", round(rep.acceptance.beta, 4)),
             ("c", round(rep.costs.c, 4)), ("cs", round(rep.costs.cs, 4)),
             ("verify_cost_v", [round(v, 3) for v in rep.costs.verify]))
    best = max(val.measured_speedup if val else 0.0, row.speedup)
    notes = None if best > 1.0 else "no (m, n) beats plain decoding here: decode without a profile is faster"
    measured = Measured(
        speedup=val.measured_speedup if val else None,
        tokens_per_s=val.tokens / val.seconds if val else None,
        baseline_tokens_per_s=val.tokens / val.baseline_seconds if val else None,
        tau=val.measured_tau if val else None, acceptance_rate=val.alpha if val else None,
        predicted_speedup=row.speedup,
        baseline=BASELINE_OURS_AR if val else BASELINE_PREDICTED,
        device=rep.device, dataset=rep.dataset, n_prompts=rep.n_prompts, max_new_tokens=rep.max_new_tokens,
        seed=rep.seed, source="plan", notes=notes, extra=extra,
    )
    return Profile(
        model=ModelRef.of(sm), method=HIERARCHICAL.name,
        draft=draft, measured=measured,
        environment=Environment.current(rep.device, placement=getattr(sm, "placement", None)),
        search=SearchInfo(strategy="plan", objective="hierarchical planner" + (" + timed" if val else ""),
                          seed=rep.seed),
        method_params=params,
    )


__all__ = ["PlanOutcome", "build_profile", "plan_from_study", "plan_given", "plan_profiles", "plan_study",
           "replan_profile_file", "study_front"]
