"""Search once, deploy anywhere: re-plan profiles and re-rank studies for another device's costs.

Acceptance belongs to the model, the draft and the workload; cost belongs to the device (files.cost_profile). So a
profile that keeps a record of what its draft accepts, and the cost profile it was planned with, can be re-planned
for any other device with no model: ``plan --profile x.yaml --costs other.yaml``. What a record is, how it is made
and how a draft is re-priced from it belong to each method (``Method.record``, ``Method.replan`` in
skipsearch.methods); this module holds what they share:
- the cost-file side: the costs a profile was planned with (``own_costs``), and the check of a cost file against
  the profile's model, which it hands each method's re-plan;
- the dispatch through the registry: ``keep_portable`` (after a search; ``keep_portable_all`` with the search's
  companion profiles), ``record_on_model`` (for a profile that
  keeps none), ``replan_profile``, and the re-planned profile, its report and its JSON;
- the ranking of a study (``optimize --study S --costs other.yaml --budget 0``): its trials keep no traces, so
  the plain method's skip sets are re-traced on the loaded model, one forward per skip set and calibration
  sequence and no timing, which also makes them the target machine's own numerics, and every config is replayed.

The records' formats are each method's (the plain method's traces: methods.layer_skip.record); torch is imported
only inside the functions that trace or replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from skipsearch import methods
from skipsearch.config import AUTOREGRESSIVE, Candidate, ConfigError, DraftConfig, Trace
from skipsearch.files.cost_profile import CostProfile, costs_from_model, planned_costs_of
from skipsearch.files.costs import COSTS_KEY, PlannedCosts, planned_costs_from_dict, planned_costs_to_dict
from skipsearch.files.errors import NoRecordError, ProfileError
from skipsearch.files.schedule import MARGIN, DraftPoint, Schedule, plan_schedule
from skipsearch.methods import Keeping, Kept, Replanned, Replanning
from skipsearch.methods.layer_skip import (
    ACCEPTANCE_KEY,
    MAX_KEPT,
    AcceptanceRecord,
    acceptance_from_dict,
    acceptance_to_dict,
    record_acceptance,
)
from skipsearch.model.target import NATIVE
from skipsearch.profile import BASELINE_OURS_AR, BASELINE_PREDICTED, Measured, Profile

if TYPE_CHECKING:
    from skipsearch.engine.surrogate import Calibration, CostModel
    from skipsearch.measure import Measurement
    from skipsearch.model.skippable import SkippableModel
    from skipsearch.search.study import TrialRecord

NOT_TIMED = "predicted, not timed"  # measured.notes of a re-planned profile starts with this


# -- the cost-file side --------------------------------------------------------------------------------------
def portable_parts(profile: Profile, *, source: str) -> tuple[AcceptanceRecord | None, PlannedCosts | None]:
    """The profile's acceptance record and the costs it was planned with, each None where it keeps none."""
    extra = dict(profile.measured.extra) if profile.measured else {}
    acc = acceptance_from_dict(extra[ACCEPTANCE_KEY], source=source) if ACCEPTANCE_KEY in extra else None
    costs = planned_costs_from_dict(extra[COSTS_KEY], source=source) if COSTS_KEY in extra else None
    return acc, costs


def own_costs(profile: Profile, *, source: str) -> CostProfile:
    """The cost profile a profile was planned with (``measured.costs``), to re-plan it for its own device."""
    from skipsearch.files.cost_profile import CostModelRef

    rec, planned = portable_parts(profile, source=source)
    if planned is None:
        raise ProfileError(f"{source}: keeps no cost profile (measured.costs): give --costs")
    precision = profile.model.target_precision
    ref = CostModelRef(profile.model.name, profile.model.num_layers, rec.architecture if rec else None,
                       precision=None if precision == NATIVE else precision)  # its costs are its target's
    return CostProfile(ref,
                       planned.device or "unknown", planned.dtype or profile.model.dtype, planned.costs,
                       roofline=planned.roofline)  # modelled costs stay marked as modelled


# -- keeping records: the method's, made on the model --------------------------------------------------------
def _kept(profile: Profile, objective: Any, *, workload: str, source: str,
          searched: tuple[Candidate, ...] | None) -> Kept:
    from skipsearch.engine.measuring import architecture_of

    record = methods.get(profile.method).record
    if record is None:
        return Kept()
    return record.build(Keeping(objective, profile.candidate, workload, architecture_of(objective.sm), source,
                                searched))


def _with_entries(measured: Measured, entries: Sequence[tuple[str, Any]], drop: Sequence[str]) -> Measured:
    kept = tuple((k, v) for k, v in measured.extra if k not in drop)
    return replace(measured, extra=kept + tuple(entries))


def keep_portable(profile: Profile, objective: Any, candidates: Sequence[Candidate], *,
                  workload: str | None = None) -> Profile:
    """``profile`` with what re-planning needs in ``measured``: its method's record (``Method.record``: e.g. the
    traces of the shortlist's skip sets, best first) made from the searched ``candidates``, and the cost model the
    search measured, with the costs of the weight formats the record's draft runs. ``objective`` is optimize's
    ModelObjective; its calibration is re-traced here (one forward per sequence)."""
    if profile.measured is None:
        return profile
    cal = objective.cal
    shown = workload or f"{len(cal.prompts)} prompts x {cal.max_new_tokens} tokens"
    kept = _kept(profile, objective, workload=shown, source="optimize", searched=tuple(candidates))
    costs = objective.measured_costs
    if not kept.entries and costs is None:
        return profile
    entries = list(kept.entries)
    if costs is not None:
        import torch

        sm = objective.sm
        planned = PlannedCosts(replace(costs_from_model(costs), schemes=kept.schemes), str(sm.device), sm.dtype_name,
                               "measured by optimize", torch.get_num_threads())
        entries.append((COSTS_KEY, planned_costs_to_dict(planned)))
    return replace(profile, measured=_with_entries(profile.measured, entries, (*methods.record_keys(), COSTS_KEY)))


def keep_portable_all(profile: Profile, companions: Sequence[tuple[str, Profile]], objective: Any,
                      candidates: Sequence[Candidate], *,
                      workload: str) -> tuple[Profile, tuple[tuple[str, Profile], ...]]:
    """What a search ships, each profile with what re-planning needs, in one pass over the search's own objective:
    every companion (file-name suffix, profile) that drafts with a skip set gets its own draft's record (as
    ``record_on_model`` makes it: e.g. dynamic CLaSp's starting skip set, so that it re-plans too), and
    ``profile`` the record of the searched ``candidates`` and the cost model (``keep_portable``)."""
    kept = tuple((suffix, _with_own_record(c, objective, workload=workload, source=suffix)
                  if c.draft.skip_attn or c.draft.skip_mlp else c) for suffix, c in companions)
    return keep_portable(profile, objective, candidates, workload=workload), kept


def record_on_model(profile: Profile, sm: SkippableModel, cal: Calibration, *, workload: str,
                    source: str) -> Profile:
    """``profile`` with its method's record of its own draft made on the loaded model, with no timing (e.g. its
    skip set traced over the calibration, one forward per sequence, as optimize keeps for its shortlist). For a
    profile that keeps none (``NoRecordError``); acceptance belongs to the model and the workload, not to the
    hardware, so the record is as good as one kept by optimize."""
    from skipsearch.search.objective import ModelObjective

    return _with_own_record(profile, ModelObjective(sm, cal), workload=workload, source=source)


def _with_own_record(profile: Profile, objective: Any, *, workload: str, source: str) -> Profile:
    kept = _kept(profile, objective, workload=workload, source=source, searched=None)
    measured = profile.measured or Measured(source="hand")
    return replace(profile, measured=_with_entries(measured, kept.entries, [k for k, _ in kept.entries]))


# -- re-planning a profile (no model) ---------------------------------------------------------------------------
def replan_profile(profile: Profile, target: CostProfile, *, source: str, costs_source: str,
                   k_values: Sequence[int] | None = None, traced: str | None = None) -> tuple[Profile, Replanned]:
    """A new profile for ``target``'s device, re-planned by the profile's method from what it kept
    (``Method.replan``), its ``measured`` block predicted, not timed (until ``bench --write-measured``).
    ``traced``: the workload the profile's record was just made on (``record_on_model``), which its notes and
    the plan's say."""
    from skipsearch.engine.surrogate import K_VALUES
    from skipsearch.files.cost_profile import check_costs_model

    method = methods.get(profile.method)
    precision = profile.model.target_precision
    if precision != NATIVE and (target.device.startswith(("cuda", "mps", "xpu")) or target.dtype != "float32"):
        raise ConfigError(f"{source}: the profile was made for the {precision} target, which runs on CPUs in fp32; "
                          f"the cost file is for {target.device} ({target.dtype}): re-plan it with a CPU's cost file")
    if method.replan is None:
        raise ConfigError(f"{source}: re-planning needs a layer-skip profile's traces or a lookup profile's match "
                          f"record; this one is method {profile.method} (plan it again on the device instead)")

    def check_costs(architecture: str | None) -> None:
        check_costs_model(target, num_layers=profile.model.num_layers, architecture=architecture,
                          fingerprint=profile.model.fingerprint, source=costs_source,
                          what=f"the profile's model ({profile.model.name})", target_precision=precision)

    job = Replanning(profile, target, source, costs_source, tuple(K_VALUES if k_values is None else k_values),
                     check_costs)
    plan = method.replan(job)
    said = traced and f"acceptance traced by plan on the model ({traced}): the profile kept no record"
    new = _replanned_profile(profile, target, plan, costs_source=costs_source, said=said)
    if target.batched is not None:  # a draft length per batch size, for the same draft
        new = replace(new, schedule=plan_batch_schedule(job, new.draft, K_VALUES if k_values is None else k_values,
                                                        candidate=new.candidate))
    return new, replace(plan, note=f"{said}; {plan.note}" if plan.note else said) if said else plan


def batch_points(job: Replanning, draft: DraftConfig, k_values: Sequence[int], *,
                 candidate: Candidate | None = None) -> tuple[DraftPoint, ...]:
    """tau(K) and one cycle's drafting cost per fixed K for ``draft``'s skip set, as the method's own re-plan predicts
    them under the job's cost file (``Method.replan`` asked for one K at a time; a re-plan that weighs several K at
    once answers for all of them): the inputs of ``schedule.plan_schedule``, with the draft's weight format where it
    has one. The drafting cost is what the method's prediction charges beyond the verify: tau / speedup less
    v(d + 1), d = (tau - 1) / acceptance the tokens a cycle drafts on average (exit rules, lookup misses and
    fallbacks included, as the method's replay counts them). The weight format is ``candidate``'s (the re-planned
    profile's: a re-plan may ship another traced scheme than the searched one), else the job's profile's."""
    method = methods.get(job.profile.method)
    schemes = methods.replan_schemes(candidate or job.profile.candidate, job.target.device)
    scheme = schemes[0] if len(schemes) == 1 else None
    cm = job.target.cost_model()
    skip = (draft.skip_attn, draft.skip_mlp)
    wanted = sorted({*k_values, job.profile.draft.max_draft_tokens, draft.max_draft_tokens} - {0})

    def verify(tokens: float) -> float:  # v(k) of the cost file, linear between whole k
        low = int(tokens)
        return cm.verify(low) + (cm.verify(low + 1) - cm.verify(low)) * (tokens - low)

    best: dict[int, tuple[DraftPoint, float]] = {}
    for k in wanted:
        if k in best:
            continue
        options = method.replan(replace(job, k_values=(k,))).options
        same = [(c, m) for c, m in options if (c.skip_attn, c.skip_mlp) == skip] or list(options)
        for c, m in same:
            k_c = c.max_draft_tokens
            if k_c < 1 or m.tau is None or not m.speedup or (k_c in best and m.speedup <= best[k_c][1]):
                continue
            drafted = min((m.tau - 1) / m.acceptance_rate, k_c) if m.acceptance_rate else 0.0
            cost = max(m.tau / m.speedup - verify(max(drafted, 0.0) + 1), 0.0)
            best[k_c] = (DraftPoint(k_c, m.tau, cost, scheme), m.speedup)
    return tuple(best[k][0] for k in sorted(best))


def plan_batch_schedule(job: Replanning, draft: DraftConfig, k_values: Sequence[int], *,
                        candidate: Candidate | None = None) -> Schedule:
    """The profile's draft length per batch size under the job's cost file's batched grid (``schedule``)."""
    grid = job.target.batched
    basis = (f"{job.costs_source}: batched grid B = {', '.join(map(str, grid.batch_sizes))} ({grid.kernel}); tau "
             f"and the drafting cost per K from the profile's {job.profile.method} re-plan; K = 0 unless a K beats "
             f"plain batched decoding by {MARGIN:.0%}")
    return plan_schedule(batch_points(job, draft, k_values, candidate=candidate), grid, basis=basis)


def _replanned_profile(profile: Profile, target: CostProfile, plan: Replanned, *, costs_source: str,
                       said: str | None = None) -> Profile:
    from skipsearch.methods.summary import config_summary

    m, draft, shown = plan.predicted, plan.draft, plan.best_draft
    if draft.is_autoregressive:
        verdict = ("no kept draft is predicted to beat plain decoding here: ships max_draft_tokens 0"
                   + (f"; best draft {config_summary(shown)} predicted {m.speedup:.3f}x" if m and shown else ""))
    else:
        verdict = f"ships {config_summary(draft)}: {m.speedup:.3f}x predicted"
    old = profile.measured
    kept = tuple((k, v) for k, v in old.extra if k not in (COSTS_KEY, "before_bench", "timed", "timed_columns"))
    head = {k: v for k, v in (("speedup", old.speedup), ("predicted_speedup", old.predicted_speedup),
                              ("device", old.device), ("source", old.source)) if v is not None}
    ships_draft = not draft.is_autoregressive
    measured = Measured(
        predicted_speedup=m.speedup if m and ships_draft else None, baseline=BASELINE_PREDICTED,
        device=target.device, dataset=old.dataset, n_prompts=old.n_prompts, max_new_tokens=old.max_new_tokens,
        seed=old.seed, source="plan",
        notes=f"{NOT_TIMED}: re-planned for {target.device} ({target.dtype}) from {costs_source}; {verdict}; "
              + "".join(f"{note}; " for note in (plan.note, said) if note)
              + "time it with skipsearch bench --write-measured",
        extra=kept + ((COSTS_KEY, planned_costs_to_dict(planned_costs_of(target, source=costs_source))),
                      ("predicted", {"speedup": round(m.speedup, 4), "tau": round(m.tau or 0, 4),
                                     "cost_c": round(m.cost_ratio or 0, 4)} if m else None),
                      ("replanned_from", head or None)),
    )
    measured = replace(measured, extra=tuple((k, v) for k, v in measured.extra if v is not None))
    if plan.extra:  # what the method's re-plan redid (e.g. the hierarchy's c, c_s and v(k)) goes last
        measured = _with_entries(measured, plan.extra, [k for k, _ in plan.extra])
    # the profile is for the target now: its dtype is the one decode picks on a GPU, and its kernel the one the
    # target's figures were timed through
    # and, where the target was measured, its hardware is the profile's now (decode compares it with the machine)
    environment = (target.environment if target.roofline is None and target.environment is not None
                   else profile.environment)
    return replace(profile, model=replace(profile.model, dtype=target.dtype), draft=draft, measured=measured,
                   method_params=profile.method_params if plan.method_params is None else plan.method_params,
                   kernel=target.kernel.verify, environment=environment)


def replan_to_dict(new: Profile, plan: Replanned) -> dict:
    def row(config: DraftConfig, m: Measurement) -> dict:
        return {"skip_attn": list(config.skip_attn), "skip_mlp": list(config.skip_mlp),
                "max_draft_tokens": config.max_draft_tokens, "exit": asdict(config.exit),
                "predicted_speedup": m.speedup, "tau": m.tau, "cost_c": m.cost_ratio}

    out = {"ships": row(new.draft, plan.predicted) if not new.draft.is_autoregressive else "plain decoding",
           "options": [row(c, m) for c, m in plan.options], "notes": new.measured.notes}
    if plan.note:
        out["approximation"] = plan.note
    if new.schedule is not None:
        from skipsearch.files.schedule import schedule_to_dict

        out["schedule"] = schedule_to_dict(new.schedule)
    return out


def format_replan(old: Profile, new: Profile, plan: Replanned, target: CostProfile) -> str:
    """For people: what the profile shipped, what each option it kept (a skip set, a K) is predicted to do under
    ``target``."""
    from skipsearch.methods.summary import config_summary

    before = old.measured.speedup or old.measured.predicted_speedup if old.measured else None
    lines = [f"re-planned for {target.device} ({target.dtype}) from {plan.basis}",
             f"was:   {config_summary(old.draft)}" + (f" ({before:.3f}x on {old.measured.device})" if before else ""),
             "", f"| predicted | τ | c | {plan.column} |", "|---:|---:|---:|---|"]
    lines += [f"| {m.speedup:.3f}x | {m.tau or 0:.2f} | {m.cost_ratio or 0:.3f} | {config_summary(c)} |"
              for c, m in plan.options]
    lines += ["", f"note: {plan.note}"] if plan.note else []
    ships = [f"ships: {config_summary(new.draft)}", new.measured.notes or ""]
    if new.schedule is not None:
        ships.append(f"schedule (draft length per batch size): {new.schedule.describe()}")
    return "\n".join([*lines, "", *ships])


# -- re-ranking a study ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankRow:
    config: DraftConfig
    predicted: Measurement  # under the other costs
    trial: int | None  # the study trial that evaluated it; None: K and exit re-planned for a shortlisted skip set
    study_predicted: float | None = None  # the study's own surrogate figure (its machine's costs)
    study_timed: float | None = None  # the study's timed speedup, where it timed this config
    timed: Measurement | None = None  # timed here (--time-shortlist)


def rerank(records: Sequence[TrialRecord], traced: dict[tuple, Sequence[Trace]], costs: CostModel, *,
           replan_top: int = 0, k_values: Sequence[int] | None = None) -> tuple[RankRow, ...]:
    """Every plain config (``methods.is_plain``) the study evaluated, predicted under ``costs`` from its skip set's
    traces, best first; plus, for the best ``replan_top`` skip sets, their K and exit rule re-planned for
    ``costs`` (``surrogate.replan_skip_set``)."""
    from skipsearch.engine.surrogate import K_VALUES, replan_skip_set, replay_all

    seen: dict[DraftConfig, dict] = {}
    for r in records:
        if not methods.is_plain(r.candidate) or r.measurement is None or r.config is None:
            continue
        if r.config.is_autoregressive or (r.config.skip_attn, r.config.skip_mlp) not in traced:
            continue
        row = seen.setdefault(r.config, {"trial": r.number})
        m = r.measurement
        if m.kind == "timed":
            row["study_timed"] = m.speedup
            row.setdefault("study_predicted", m.predicted_speedup)
        else:
            row["study_predicted"] = m.speedup
    rows = [RankRow(c, replay_all(traced[(c.skip_attn, c.skip_mlp)], c, costs), **info) for c, info in seen.items()]
    rows.sort(key=lambda r: (-r.predicted.speedup, r.trial))
    skips = list(dict.fromkeys((r.config.skip_attn, r.config.skip_mlp) for r in rows))[:replan_top]
    for skip in skips:
        config, m = replan_skip_set(traced[skip], skip, costs, k_values=K_VALUES if k_values is None else k_values)
        if config not in seen:
            rows.append(RankRow(config, m, None))
    rows.sort(key=lambda r: (-r.predicted.speedup, r.trial is None, r.trial or 0))
    return tuple(rows)


def plain_configs(records: Sequence[TrialRecord]) -> list[DraftConfig]:
    """The drafting configs of the plain method's evaluated trials: what a study's re-ranking replays."""
    return [r.config for r in records if methods.is_plain(r.candidate) and r.measurement is not None
            and r.config is not None and not r.config.is_autoregressive]


def time_rows(sm: SkippableModel, cal: Calibration, rows: Sequence[RankRow], *, repeats: int = 1,
              on_row: Callable[[RankRow], None] | None = None) -> tuple[RankRow, ...]:
    """Time each row's config against plain decoding through the one harness (objective.time_drafter). The
    fastest, if it beat plain decoding, is timed once more and keeps the lower figure: as optimize does, a
    speedup that does not hold up is not shipped."""
    from skipsearch.engine.decoding import make_drafter
    from skipsearch.methods.summary import config_summary
    from skipsearch.search.objective import time_drafter

    def timed(row: RankRow) -> Measurement:
        m, _ = time_drafter(sm, cal.prompts, lambda _p, c=row.config: make_drafter(c),
                            max_new_tokens=cal.max_new_tokens, repeats=repeats, label=config_summary(row.config))
        return replace(m, predicted_speedup=row.predicted.speedup)

    out = []
    for row in rows:
        out.append(replace(row, timed=timed(row)))
        if on_row:
            on_row(out[-1])
    top = max(range(len(out)), key=lambda i: out[i].timed.speedup, default=None)
    if top is not None and out[top].timed.speedup > 1.0:
        out[top] = replace(out[top], timed=min(out[top].timed, timed(out[top]), key=lambda m: m.speedup))
    return tuple(out)


@dataclass(frozen=True)
class Reranking:
    rows: tuple[RankRow, ...]  # best first under the other costs
    record: AcceptanceRecord  # the traces of the shortlisted skip sets: what the written profile keeps
    skipped: int  # evaluated trials that cannot be replayed (other methods, plain decoding)
    costs_source: str


def rerank_study(sm: SkippableModel, cal: Calibration, records: Sequence[TrialRecord], target: CostProfile, *,
                 costs_source: str, shortlist: int = 5, workload: str | None = None,
                 on_progress: Callable[[int, int], None] | None = None) -> Reranking:
    """Re-rank a study's evaluated plain configs (``plain_configs``) under ``target``'s costs, with no new trials:
    each distinct skip set is traced once on ``sm`` (calibration ``cal``), every config is replayed, and the best
    ``shortlist`` skip sets also get their K and exit rule re-planned."""
    from skipsearch.engine.measuring import architecture_of, check_costs_for
    from skipsearch.engine.surrogate import trace_skip_sets

    check_costs_for(target, sm, source=costs_source)
    configs = plain_configs(records)
    if not configs:
        raise ConfigError("the study has no evaluated layer-skip config to re-rank")
    traced = trace_skip_sets(sm, cal, configs, on_progress=on_progress)
    rows = rerank(records, traced, target.cost_model(), replan_top=shortlist)
    keys = list(dict.fromkeys((r.config.skip_attn, r.config.skip_mlp) for r in rows))[:min(shortlist, MAX_KEPT)]
    record = record_acceptance({k: traced[k] for k in keys}, workload=workload, architecture=architecture_of(sm))
    skipped = sum(r.measurement is not None for r in records) - len(configs)  # configs: one per replayable trial
    return Reranking(rows, record, skipped, costs_source)


def reranked_profile(sm: SkippableModel, rr: Reranking, target: CostProfile, *, study: str, dataset: str | None,
                     n_prompts: int | None, max_new_tokens: int | None, seed: int | None) -> tuple[Profile, str]:
    """The profile to ship after a re-rank, and one sentence saying why: the best *timed* row if any row was
    timed here and beat plain decoding; else the best predicted row, predicted, not timed; never a loss."""
    from skipsearch.methods.summary import config_summary
    from skipsearch.profile import Environment, ModelRef, SearchInfo

    timed = sorted((r for r in rr.rows if r.timed is not None), key=lambda r: -r.timed.speedup)
    top = timed[0] if timed else rr.rows[0]
    figure = top.timed if timed else top.predicted
    word = "measured here" if timed else "predicted, not timed"
    pays = figure.speedup > 1.0
    verdict = (f"ships {config_summary(top.config)}: {figure.speedup:.3f}x {word}" if pays else
               f"no re-ranked draft beats plain decoding on {target.device}: ships max_draft_tokens 0; best draft "
               f"{config_summary(top.config)}: {figure.speedup:.3f}x {word}")
    extra = ((ACCEPTANCE_KEY, acceptance_to_dict(rr.record)),
             (COSTS_KEY, planned_costs_to_dict(planned_costs_of(target, source=rr.costs_source))),
             ("reranked", [[config_summary(r.config), round(r.predicted.speedup, 4), r.study_timed and
                            round(r.study_timed, 4), r.timed and round(r.timed.speedup, 4)] for r in rr.rows[:10]]),
             ("reranked_columns", ["candidate", "predicted here", "timed in the study", "timed here"]))
    common = dict(device=target.device, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                  seed=seed, source="optimize --budget 0 (re-ranked)", extra=extra)
    if not pays:
        measured = Measured(notes=verdict, **common)
    elif timed:
        m = top.timed
        measured = Measured(speedup=m.speedup, tokens_per_s=m.tokens_per_s,
                            baseline_tokens_per_s=m.baseline_tokens_per_s, tau=m.tau, acceptance_rate=m.acceptance_rate,
                            predicted_speedup=top.predicted.speedup,
                            baseline=BASELINE_OURS_AR, notes=verdict, **common)
    else:
        measured = Measured(predicted_speedup=top.predicted.speedup, baseline=BASELINE_PREDICTED,
                            notes=f"{NOT_TIMED}: {verdict}; time it with skipsearch bench --write-measured", **common)
    profile = Profile(
        model=ModelRef.of(sm), method=methods.PLAIN, draft=top.config if pays else AUTOREGRESSIVE, measured=measured,
        environment=Environment.current(str(sm.device), placement=getattr(sm, "placement", None)),
        search=SearchInfo(strategy="rerank", budget=0, study=study,
                          objective=f"surrogate replay under {rr.costs_source}" + (" + timed" if timed else ""),
                          seed=seed),
    )
    if target.batched is not None and pays:  # the shipped draft's length per batch size, from the kept traces
        from skipsearch.engine.surrogate import K_VALUES

        job = Replanning(profile, target, study, rr.costs_source, tuple(K_VALUES), lambda _architecture: None)
        profile = replace(profile, schedule=plan_batch_schedule(job, profile.draft, K_VALUES))
    return profile, verdict


__all__ = ["NOT_TIMED", "NoRecordError", "RankRow", "Replanned", "Reranking", "format_replan", "keep_portable",
           "keep_portable_all",
           "own_costs", "plain_configs", "portable_parts", "record_on_model", "replan_profile", "replan_to_dict",
           "rerank", "rerank_study", "reranked_profile", "time_rows"]
