"""``skipsearch optimize`` as a library function: search, time a shortlist, write a profile.

Stages:
1. calibrate: the full model's greedy continuations of the calibration prompts (calib split);
2. search: the strategy proposes, the surrogate scores (or the timer, with objective="timed");
3. time: the best distinct configs of the search are timed with the runtime decoder against
   the autoregressive baseline, interleaved, in this process; each is recorded in the study;
4. ship: the best *timed* config, unless none beats plain decoding, in which case the profile
   says so and ships max_draft_tokens 0 with the measured α, c and v(k) that explain why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import optuna

from skipsearch.clasp import ClaspPlan, DynamicParams, config_for, granularity, static_plan
from skipsearch.config import AUTOREGRESSIVE, DraftConfig, ExitRule
from skipsearch.data import encode_prompt, load_prompts
from skipsearch.measure import Measurement
from skipsearch.models import SkippableModel
from skipsearch.objective import ModelObjective, calibrate
from skipsearch.profile import Environment, Measured, ModelRef, Profile, SearchInfo, save_profile
from skipsearch.space import SearchSpace
from skipsearch.strategies import make_strategy
from skipsearch.strategies.clasp import mode_limit, modes
from skipsearch.study import (
    CONFIG_ATTR,
    ERROR_ATTR,
    KIND_ATTR,
    MEASUREMENT_ATTR,
    SearchSummary,
    TrialRecord,
    best,
    config_to_dict,
    open_study,
    records,
    run_search,
    shortlist,
    trial_config,
)

OBJECTIVES = ("two-stage", "surrogate", "timed")
_STATES = optuna.trial.TrialState


@dataclass(frozen=True)
class OptimizeSettings:
    strategy: str = "tpe"
    budget: int = 100
    dataset: str = "mtbench"
    n_prompts: int = 8
    max_new_tokens: int = 64
    objective: str = "two-stage"  # surrogate search + timed shortlist; or all-"surrogate"; or all-"timed"
    shortlist: int = 5
    seed: int = 0
    repeats: int = 1  # timed runs per prompt (median); raise where timing noise demands it
    space: SearchSpace | None = None
    study_dir: str | None = None
    storage: str | None = None
    study_name: str | None = None
    warm_start: tuple[DraftConfig, ...] = ()  # configs tried first, e.g. another profile's (CLaSp's) draft
    clasp_tokens: int = 16  # strategy "clasp": calibration tokens per prompt that its DP averages over


@dataclass(frozen=True)
class OptimizeResult:
    profile: Profile
    summary: SearchSummary
    timed: tuple[TrialRecord, ...]  # the shortlist's timed records, best first
    verdict: str  # one sentence: what ships and why
    interrupted: bool = False  # Ctrl-C stopped the search; the profile holds the best so far
    plan: ClaspPlan | None = None  # strategy "clasp": the DP's skip sets


def _fail_orphans(study: optuna.Study) -> None:
    """Trials left RUNNING by a killed single-worker run never finish; mark them failed.

    Only for a local study directory: with a shared --storage, RUNNING may be another worker's.
    """
    for t in study.get_trials(deepcopy=False, states=(_STATES.RUNNING,)):
        _fail_trial(study, t._trial_id, "orphaned: its worker stopped")


def claim_timed(study: optuna.Study, config: DraftConfig) -> int | None:
    """Claim the timing of ``config`` for this worker: a RUNNING trial that other workers see.

    Returns the claim's trial id, or None when the config is timed (or being timed) already.
    Two workers claiming at the same moment both add a claim; the lower trial number keeps it and
    the other marks its own claim failed, so no config is ever timed twice.
    """
    def twins() -> list[optuna.trial.FrozenTrial]:
        live = study.get_trials(deepcopy=False, states=(_STATES.COMPLETE, _STATES.RUNNING))
        return [t for t in live if t.user_attrs.get(KIND_ATTR) == "timed" and trial_config(t) == config]

    if twins():
        return None
    study.add_trial(optuna.trial.create_trial(
        state=_STATES.RUNNING, params={}, distributions={},
        user_attrs={CONFIG_ATTR: config_to_dict(config), KIND_ATTR: "timed"},
    ))
    mine = max((t for t in twins() if t.state == _STATES.RUNNING), key=lambda t: t.number)
    if min(t.number for t in twins()) != mine.number:
        _fail_trial(study, mine._trial_id, "another worker claimed this config first")
        return None
    return mine._trial_id


def record_timed(study: optuna.Study, claim: int, m: Measurement) -> None:
    """Finish a claimed timed trial with its measurement."""
    study._storage.set_trial_user_attr(claim, MEASUREMENT_ATTR, m.to_dict())
    study._storage.set_trial_state_values(claim, _STATES.COMPLETE, [m.speedup])


def _fail_trial(study: optuna.Study, trial_id: int, error: str) -> None:
    """Mark a trial this process added or found orphaned as failed, with its one-line error."""
    study._storage.set_trial_user_attr(trial_id, ERROR_ATTR, error)
    study._storage.set_trial_state_values(trial_id, _STATES.FAIL)


def optimize(
    sm: SkippableModel,
    settings: OptimizeSettings,
    *,
    on_trial: Callable[[TrialRecord, TrialRecord | None], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> OptimizeResult:
    s = settings
    say = on_stage or (lambda _: None)
    space = s.space or SearchSpace(num_layers=sm.num_layers)
    strategy = make_strategy(s.strategy, space, seed=s.seed, warm_start=s.warm_start)
    study = open_study(study_dir=s.study_dir, storage=s.storage, study_name=s.study_name, strategy=strategy)
    if s.storage is None and s.study_dir is not None:
        _fail_orphans(study)

    prompts = load_prompts(s.dataset, split="calib", n=s.n_prompts, seed=s.seed)
    say(f"calibrating on {len(prompts)} prompts from {s.dataset} (calib split)")
    cal = calibrate(sm, [encode_prompt(sm.tokenizer, p) for p in prompts], max_new_tokens=s.max_new_tokens)
    objective = ModelObjective(sm, cal, repeats=s.repeats)
    plan = None
    if s.strategy == "clasp":
        # CLaSp sweeps its DP's skip sets, which come from the model's hidden states on the calibration
        # data; the strategy is rebuilt with them (the study only keeps its name, space and sampler).
        say(f"CLaSp: dynamic programming over {s.clasp_tokens} tokens of each calibration prompt")
        plan = static_plan(sm, cal.prompts, cal.continuations, allowed=space.skippable_layers(),
                           limits={m: mode_limit(space, m) for m in modes(space)}, tokens_per_sequence=s.clasp_tokens)
        strategy = make_strategy(s.strategy, space, seed=s.seed, warm_start=s.warm_start, plan=plan)
        if s.storage is not None:
            strategy.for_shared_study()
    search_kind = "timed" if s.objective == "timed" else "surrogate"
    say(f"searching: {s.strategy}, budget {s.budget}, {search_kind} objective")
    interrupted = False
    summary = SearchSummary(len(records(study)), 0, 0, best(study), 0.0)
    try:
        summary = run_search(study, strategy, objective, budget=s.budget, kind=search_kind, on_trial=on_trial)
        if s.objective == "two-stage":
            for config in shortlist(study, s.shortlist):
                claim = claim_timed(study, config)  # None: timed already, by a resumed run or another worker
                if claim is None:
                    continue
                say(f"timing {config_summary(config)}")
                try:
                    record_timed(study, claim, objective.evaluate(config, kind="timed"))
                except KeyboardInterrupt:
                    _fail_trial(study, claim, "interrupted")
                    raise
                except Exception as e:  # e.g. out of memory: recorded, and the next config is timed
                    _fail_trial(study, claim, " ".join(str(e).split())[:300] or type(e).__name__)
    except KeyboardInterrupt:
        # Ctrl-C: every finished trial is already in the study; ship the best found so far.
        interrupted = True
    summary = replace(summary, trials_total=len(records(study)), best=best(study))
    timed: list[TrialRecord] = sorted(
        (r for r in records(study) if r.measurement is not None and r.measurement.kind == "timed"),
        key=lambda r: -r.measurement.speedup,
    )

    top = timed[0] if timed else summary.best
    costs = objective.costs
    if top is not None and top.measurement.kind == "timed" and top.measurement.speedup > 1.0:
        config, m = top.config, top.measurement
        verdict = f"ships {config_summary(config)}: {m.speedup:.3f}x measured against autoregressive decoding"
    elif top is not None and top.measurement.kind == "surrogate" and top.measurement.speedup > 1.0:
        config, m = top.config, top.measurement
        verdict = f"ships {config_summary(config)}: {m.speedup:.3f}x predicted (surrogate only; not timed)"
    else:
        m = top.measurement if top is not None else None
        config = AUTOREGRESSIVE
        why = ""
        if m is not None:
            why = (f"; best draft measured {m.speedup:.3f}x with alpha {m.alpha or 0:.2f}, "
                   f"c {m.cost_ratio or 0:.2f}, v(2) {costs.verify(2):.2f}")
        verdict = "no draft config beat plain decoding on this hardware: ships max_draft_tokens 0" + why

    profile = Profile(
        model=ModelRef(name=sm.name, num_layers=sm.num_layers, dtype=sm.dtype_name, fingerprint=sm.fingerprint),
        method="layer-skip",
        draft=config,
        measured=_measured(m, s, sm, costs, verdict, shipped_autoregressive=config.is_autoregressive),
        environment=Environment.current(str(sm.device)),
        search=SearchInfo(
            strategy=s.strategy, budget=s.budget, trials=summary.trials_total,
            study=s.storage and f"{s.storage} ({study.study_name})" or s.study_dir,
            objective=s.objective, seed=s.seed,
        ),
    )
    return OptimizeResult(profile, summary, tuple(timed), verdict, interrupted, plan)


def _measured(m: Measurement | None, s: OptimizeSettings, sm, costs, verdict: str, *, shipped_autoregressive: bool):
    common = dict(
        device=str(sm.device), dataset=f"{s.dataset} (calib split)", n_prompts=s.n_prompts,
        max_new_tokens=s.max_new_tokens, seed=s.seed, source="optimize", notes=verdict,
    )
    cost_extra = (("cost_c", round(m.cost_ratio, 4) if m and m.cost_ratio else None),
                  ("verify_cost_v", [round(v, 3) for v in costs.verify_ratio]),
                  ("alpha", round(m.alpha, 4) if m and m.alpha is not None else None))
    if m is None or shipped_autoregressive:
        return Measured(extra=cost_extra, **common)
    return Measured(
        speedup=m.speedup, tokens_per_s=m.tokens_per_s, baseline_tokens_per_s=m.baseline_tokens_per_s,
        tau=m.tau, acceptance_rate=m.acceptance_rate, predicted_speedup=m.predicted_speedup,
        baseline=("skipsearch autoregressive, same process, interleaved" if m.kind == "timed"
                  else "cost-model prediction"),
        extra=cost_extra, **common,
    )


def config_summary(c: DraftConfig) -> str:
    if c.is_autoregressive:
        return "autoregressive"
    ex = c.exit
    rule = f"adaptive γ0={ex.threshold:g}" if ex.adaptive else (f"γ={ex.threshold:g}" if ex.threshold else "no exit")
    return f"K={c.max_draft_tokens} attn{list(c.skip_attn)} mlp{list(c.skip_mlp)} {rule}"


def write_profile(result: OptimizeResult, out: str | Path) -> Path:
    return save_profile(result.profile, out)



def clasp_dynamic_profile(result: OptimizeResult, *, loi: int, protect_ends: bool = True) -> Profile:
    """The ``clasp-dynamic`` companion of a ``clasp`` search's profile.

    M and the granularity are those of the best config that skips whole layers, only attention or
    only MLPs (the shipped one, else the best timed, else the best trial); it also gives the
    starting skip set, K and the exit rule. ``loi`` is not searched here: the profile says so, and
    ``scripts/report_clasp.py`` measures the speedup against LOI.
    """
    if result.plan is None:
        raise ValueError("a clasp-dynamic profile needs the plan of a clasp search")
    best = result.summary.best
    candidates = [result.profile.draft, *(r.config for r in result.timed), *([best.config] if best else [])]
    chosen = next((c for c in candidates if c is not None and not c.is_autoregressive and granularity(c)), None)
    if chosen is None:  # nothing pure was tried: the plan's first granularity, a quarter of its reach
        sub = result.plan.sublayers[0]
        sets = result.plan.sets(sub)
        chosen = config_for(sub, sets[max(1, (len(sets) - 1) // 4)],
                            DraftConfig(max_draft_tokens=2, exit=ExitRule(threshold=0.5)))
    sub, m = granularity(chosen)
    params = DynamicParams(num_skips=m, loi=loi, sublayer=sub, protect_ends=protect_ends)
    static = result.profile
    notes = (f"dynamic CLaSp: the DP re-plans {m} skipped {'layers' if sub == 'layer' else sub + ' sublayers'} "
             f"every {loi} verify steps, starting from the static set; not timed by optimize")
    measured = Measured(device=static.measured.device if static.measured else None, source="optimize", notes=notes)
    return replace(static, method="clasp-dynamic", draft=chosen, measured=measured, method_params=params.to_pairs())
