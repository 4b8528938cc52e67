"""``skipsearch plan`` as one library function per mode, each returning a ``PlanOutcome``.

- ``plan_given``: the hierarchical planner on given α, β, c, c_s (and v(k)): no model;
- ``plan_profiles``: the same with inputs measured on the model for two profiles' drafts (``hier_planner``);
- ``replan_profile_file``: a profile re-planned for another device's cost file, from what it kept (no model), or
  from its draft traced on the model when it kept nothing;
- ``plan_study``: the two levels chosen from a study's α/c Pareto front, planned, and validated.

None of them writes a file: the caller writes ``PlanOutcome.profile`` (if it asked for one) and the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skipsearch.api.checks import check_study_for_model, costs_hardware_note, costs_model_note
from skipsearch.calibration import calibrate_on, calibration_prompts, calibration_workload
from skipsearch.config import ConfigError
from skipsearch.profile import Profile, load_profile

if TYPE_CHECKING:
    from skipsearch.hier_closed_form import Plan

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
    """The planner's table over (m, n) for given inputs (``plan.plan_table``)."""
    from skipsearch import hier_closed_form as planner

    inputs = planner.PlanInputs(alpha, beta, c, cs, verify=tuple(verify))
    result = planner.plan_table(inputs, max_m=max_m, max_n=max_n)
    text = planner.format_plan(result)
    return PlanOutcome(result, result.to_dict(), text, f"# Hierarchical planner, given inputs\n\n{text}\n")


def plan_profiles(medium: str, small: str, *, model: str | None = None, dataset: str = "mtbench", n_prompts: int = 4,
                  max_new_tokens: int = 64, max_m: int = 8, max_n: int = 4, validate: bool = False, repeats: int = 1,
                  seed: int = 0, device: str = "auto", dtype: str = "auto", want_profile: bool = False,
                  command: str | None = None, on_stage: Say | None = None) -> PlanOutcome:
    """The planner on α, β, c, c_s measured on the model for the ``medium`` and ``small`` profiles' drafts
    (``hier_planner.plan_from_profiles``); ``validate`` times the best pairs. With ``want_profile``, the
    hierarchical profile of the chosen (m, n)."""
    from skipsearch import hier_planner

    rep, sm = hier_planner.plan_from_profiles(
        medium, small, model=model, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
        max_m=max_m, max_n=max_n, run_validation=validate, repeats=repeats, seed=seed, device=device, dtype=dtype,
        on_stage=on_stage,
    )
    text = hier_planner.render_markdown(rep, num_layers=sm.num_layers, command=command)
    profile = hier_planner.build_profile(rep, sm, rep.chosen()) if want_profile else None
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
    from skipsearch import device_replan
    from skipsearch.costs import load_costs

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
    body = f"# Re-planned profile\n\n```\n{command}\n```\n\n{text}\n"
    return PlanOutcome(None, device_replan.replan_to_dict(new, planned), text, body, new)


def _record_on_model(prof: Profile, path: str, *, model: str | None, dataset: str, n_prompts: int,
                     max_new_tokens: int, seed: int, device: str, dtype: str, workload: str, say: Say) -> Profile:
    """``prof`` with its draft's acceptance record made on the model it names (or ``model``, checked against it)."""
    from skipsearch import device_replan
    from skipsearch.api.loading import open_model

    calibration_prompts(dataset, n_prompts=n_prompts, seed=seed)  # a bad prompt file fails before loading
    say(f"{path} keeps no acceptance record: tracing its draft on the model ({workload}; no timing)")
    sm, _ = open_model(model=model, profile=path, device=device, dtype=dtype)
    cal = calibrate_on(sm, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, seed=seed)
    return device_replan.record_on_model(prof, sm, cal, workload=workload, source=path)


def plan_study(study: str, *, costs: str | None = None, model: str | None = None, dataset: str = "mtbench",
               n_prompts: int = 4, max_new_tokens: int = 64, max_m: int = 8, max_n: int = 4, validate: bool = True,
               repeats: int = 1, seed: int = 0, device: str = "auto", dtype: str = "auto", want_profile: bool = False,
               command: str | None = None, on_stage: Say | None = None, on_note: Say | None = None) -> PlanOutcome:
    """The hierarchical planner with its two levels chosen from the study's α/c Pareto front
    (``hier_planner.plan_from_study``), under ``costs`` or costs measured here. The study is checked against the
    model before it loads; ``on_note`` gets a line when the cost file was measured on other hardware."""
    from skipsearch import device_replan, hier_planner
    from skipsearch.costs import check_costs_for, load_costs
    from skipsearch.loader import load_model
    from skipsearch.study import load_study

    say = on_stage or (lambda _msg: None)
    # 1. the input, before the model loads
    target = load_costs(costs) if costs else None
    label, records, attrs = load_study(study_dir=study)
    check_study_for_model(label, attrs, model or "smollm2-135m")
    skip_sets = {(c.skip_attn, c.skip_mlp) for c in device_replan.plain_configs(records)}
    if len(skip_sets) < 2:
        raise ConfigError(f"study {label} has {len(skip_sets) or 'no'} evaluated layer-skip skip set"
                          f"{'s' if len(skip_sets) != 1 else ''}: planning two levels needs at least two distinct ones")
    calibration_prompts(dataset, n_prompts=n_prompts, seed=seed)  # a bad prompt file fails before loading
    # 2. the model: calibrate, choose the pairs, plan and validate
    sm = load_model(model or "smollm2-135m", device=device, dtype=dtype)
    if target is not None:
        check_costs_for(target, sm, source=costs)
        note = costs_hardware_note(target, sm, costs)
        if note and on_note:
            on_note(note)
    cal = calibrate_on(sm, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, seed=seed, say=say)
    sp = hier_planner.plan_from_study(sm, cal, records, study=label, dataset=dataset,
                                      costs=target.cost_model() if target else None, seed=seed, max_m=max_m,
                                      max_n=max_n, run_validation=validate, repeats=repeats, on_stage=say)
    text = hier_planner.render_study_markdown(sp, num_layers=sm.num_layers, command=command)
    profile = None
    if want_profile:
        pick = sp.report.chosen()
        if (pick.medium.skip_attn, pick.medium.skip_mlp) == (pick.small.skip_attn, pick.small.skip_mlp):
            raise ConfigError(f"study {label}: the planner's two levels are the same skip set; no hierarchical "
                              f"profile written (the study needs more distinct evaluated skip sets)")
        chosen = hier_planner.build_profile(sp.report, sm, pick)
        profile = dataclasses.replace(chosen, search=dataclasses.replace(chosen.search, study=label))
    data = {"study": label, "front": [dataclasses.asdict(p) for p in sp.front],
            "pairs": [dataclasses.asdict(p) for p in sp.pairs], "report": sp.report.to_dict()}
    return PlanOutcome(sp.report.plan, data, text, text, profile)


__all__ = ["PlanOutcome", "plan_given", "plan_profiles", "plan_study", "replan_profile_file"]
