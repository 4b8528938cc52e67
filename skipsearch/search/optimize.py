"""``skipsearch optimize`` as a library function: search, time a shortlist, write a profile.

Stages:
1. calibrate: the full model's greedy continuations of the calibration prompts (calib split), decoded on the
   search's kernel, built first;
   the strategy learns what it needs from the model (``Strategy.prepare``: CLaSp's DP);
2. search: the strategy proposes candidates, the method's surrogate scores them (or the timer, with
   objective "timed"); every trial is an Optuna trial, asked and told through the public API;
3. time: the best distinct candidates of the search are timed with the runtime decoder against the
   autoregressive baseline, interleaved, in this process; each is claimed and recorded in the study;
4. ship: the best *timed* candidate, if it beat plain decoding, on a machine no other skipsearch worker
   shared, and again when timed once more; otherwise the profile ships ``max_draft_tokens: 0`` (plain
   decoding) and its notes say why, with the measured α, c and v(k).
Stages 3 and 4 run as one unit, ``skipsearch.search.study.ship``, which returns what ships as data; this module turns
it into the profile, its companions' profiles, and what re-planning for another device needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from skipsearch import methods
from skipsearch.config import OBJECTIVES, Candidate, ConfigError, DraftConfig
from skipsearch.engine.calibration import calibrate_on, calibration_workload
from skipsearch.hardware import machine_key
from skipsearch.measure import Measurement
from skipsearch.methods.summary import candidate_summary, config_summary  # re-exported: callers read them here
from skipsearch.model.skippable import SkippableModel
from skipsearch.model.target import NATIVE
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
from skipsearch.search.objective import ModelObjective
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies import Strategy, check_strategy, make_strategy, spelling
from skipsearch.search.study import (
    SearchSummary,
    TrialRecord,
    best,
    check_study_precision,
    open_study,
    records,
    run_search,
    ship,
    shortlist,
    stamp_model,
)


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """What a search is asked (``skipsearch optimize``'s options, parsed once; each has the CLI option's meaning):
    built by the caller, read by ``api.optimize_study`` / ``api.rerank_study`` and by ``optimize``."""

    # the model searched, and how it loads
    model: str = "smollm2-135m"
    device: str = "auto"
    dtype: str = "auto"
    target_precision: str = "native"  # the target drafts are verified against (model/target.py)
    # the search
    strategy: str = "tpe"
    budget: int = 100  # trials in the study, over all workers and resumed runs; 0 with ``costs``: re-rank
    dataset: str = "mtbench"
    n_prompts: int = 8
    max_new_tokens: int = 64
    # two-stage: surrogate search + timed shortlist; surrogate: no timing; timed: every trial timed;
    # auto: two-stage where the strategy's method has a surrogate, else timed.
    objective: str = "auto"
    shortlist: int = 5
    repeats: int = 1  # timed runs per prompt (median) and 9 x repeats rounds a surrogate cost; raise on a noisy host
    seed: int = 0
    # the space, sized by the model's depth (``space_for``); ``space`` replaces these knobs where given
    max_k: int = 8
    max_skip_ratio: float = 0.5
    protect_ends: bool = True
    space: SearchSpace | None = None
    warm_start: tuple[str, ...] = ()  # profiles whose draft configs are tried first, e.g. CLaSp's
    # What only some strategies take, e.g. (("n_values", (3, 5)),) for fractal, refused by the others: each is
    # checked against what the strategy declares (``Strategy.options``), whose flags messages name
    strategy_options: tuple[tuple[str, Any], ...] = ()
    # the study: a directory (SQLite inside; default studies/<model>-<strategy>), or an RDB URL and a name
    study: str | None = None
    storage: str | None = None
    study_name: str | None = None
    # the profile written: default <study>/best.yaml, or <study>/rerank-<costs>.yaml
    out: Path | None = None
    force: bool = False
    # re-ranking the study for another device (``--budget 0 --costs``), and timing its best here
    costs: str | None = None
    time_shortlist: bool = False
    # what runs the full model's forwards while timing (skipsearch.kernels), recorded in the profile; and torch's
    # intra-op threads (None: torch's default), recorded with the figures
    kernel: str = "eager"
    threads: int | None = None

    @property
    def study_dir(self) -> str | None:
        """The study directory: as given, else the default one (None with a storage URL)."""
        if self.storage is None and self.study is None:
            tail = "" if self.target_precision == NATIVE else f"-{self.target_precision}"  # never mixed with fp32's
            return f"studies/{Path(self.model).name}-{self.strategy}{tail}"
        return self.study

    def space_for(self, num_layers: int) -> SearchSpace:
        """The search space of a model ``num_layers`` deep: ``space``, else the one the knobs describe."""
        if self.space is not None:
            return self.space
        return SearchSpace(num_layers=num_layers, protect_ends=self.protect_ends, max_skip_ratio=self.max_skip_ratio,
                           max_draft_tokens=tuple(k for k in (1, 2, 3, 4, 6, 8, 12) if k <= self.max_k))


@dataclass(frozen=True)
class OptimizeResult:
    profile: Profile
    summary: SearchSummary
    timed: tuple[TrialRecord, ...]  # the study's timed records, best first
    verdict: str  # one sentence: what ships and why
    interrupted: bool = False  # Ctrl-C stopped the search; the profile holds the best so far
    companions: tuple[tuple[str, Profile], ...] = ()  # (file-name suffix, profile) to write beside it


def build_strategy(space: SearchSpace, s: SearchSettings, *,
                   warm_start: Sequence[DraftConfig] = ()) -> tuple[Strategy, str]:
    """The strategy (seeded with the ``warm_start`` configs, the draft configs of ``s.warm_start``) and the
    objective it runs with; every option it cannot use is refused in one line."""
    options, fixed = dict(s.strategy_options), {}
    if s.target_precision != NATIVE:  # a quantized target: no draft that copies the fp32 weights it does not hold
        cls = check_strategy(s.strategy)
        for key, value in cls.quantized_target.items():
            if key in options and tuple(options[key]) != tuple(value):
                raise ConfigError(f"the {s.target_precision} target keeps no fp32 weights to copy: strategy "
                                  f"'{cls.name}' takes no {spelling(key)} there")
            fixed[key] = options.pop(key, value)
        example = cls.method_for(options).example
        if example is not None:
            methods.check_target(example(space.num_layers), s.target_precision, source=f"strategy '{cls.name}'")
    strategy = make_strategy(s.strategy, space, seed=s.seed, warm_start=warm_start, fixed=fixed, **options)
    if s.objective not in OBJECTIVES:
        raise ConfigError(f"unknown objective '{s.objective}': use {', '.join(OBJECTIVES)}")
    objective = s.objective
    if objective == "auto":
        objective = "two-stage" if "two-stage" in strategy.objectives() else "timed"
    if objective not in strategy.objectives():
        raise ConfigError(f"strategy '{strategy.name}' cannot search with objective '{objective}' (its method has "
                          f"no surrogate): use {' or '.join(strategy.objectives())}")
    if warm_start and not strategy.warm_starts:
        raise ConfigError(f"strategy '{strategy.name}' cannot start from a profile's skip set: drop --warm-start")
    if isinstance(s.shortlist, bool) or not isinstance(s.shortlist, int) or s.shortlist < 1:
        raise ConfigError(f"shortlist must be an integer >= 1, got {s.shortlist!r}")
    return strategy, objective


def _companion_profiles(profile: Profile, companions) -> tuple[tuple[str, Profile], ...]:
    """The companions' profiles (file-name suffix, profile): the shipped one's, with the companion's candidate and
    notes, never timed here; on eager where their draft cannot run beside the search's compiled kernel (CLaSp's
    dynamic DP: ``Method.compiled_kernels``)."""
    device = profile.measured.device if profile.measured else None
    return tuple((c.suffix, replace(profile, method=c.candidate.method, draft=c.candidate.draft,
                                    method_params=c.candidate.params,
                                    kernel=profile.kernel if methods.get(c.candidate.method).compiled_kernels else None,
                                    measured=Measured(device=device, source="optimize", notes=c.notes)))
                 for c in companions)


def optimize(
    sm: SkippableModel,
    settings: SearchSettings,
    *,
    on_trial: Callable[[TrialRecord, TrialRecord | None], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> OptimizeResult:
    """Search ``settings.strategy``'s candidates on ``sm``, time the best, and return the profile to ship.

    The study (``study_dir`` or ``storage``) keeps every trial, so the same call resumes, and workers
    sharing a storage share the budget. Ctrl-C returns what was found so far (``interrupted``).
    """
    s = settings
    say = on_stage or (lambda _: None)
    # 1. what is searched, sized by the model's depth; a warm start made for another depth names other layers:
    # refused in one line
    space = s.space_for(sm.num_layers)
    warm = tuple(load_profile(p, num_layers=sm.num_layers).draft for p in s.warm_start)
    strategy, objective_kind = build_strategy(space, s, warm_start=warm)
    study = open_study(study_dir=s.study_dir, storage=s.storage, study_name=s.study_name, strategy=strategy)
    precision = getattr(sm, "target_precision", NATIVE)
    stamp_model(study, name=sm.name, num_layers=sm.num_layers, fingerprint=getattr(sm, "fingerprint", None),
                precision=precision)
    check_study_precision(s.storage and f"{s.storage} ({study.study_name})" or s.study_dir, study.user_attrs,
                          precision)  # a shared study, whose attrs only the search reads: its trials timed a model
    budget, most = s.budget, strategy.plan().max_trials
    if most is not None and budget > most:
        say(f"{strategy.name}'s grid has {most} points: budget {budget} lowered to that")
        budget = most

    # the kernel every timing and the cost model run through, sized for the longest calibration sequence, built
    # first: the calibration decodes on it
    cal = calibrate_on(sm, dataset=s.dataset, n_prompts=s.n_prompts, max_new_tokens=s.max_new_tokens, seed=s.seed,
                       say=say, kernel=s.kernel)
    objective = ModelObjective(sm, cal, repeats=s.repeats)
    search_kind = "timed" if objective_kind == "timed" else "surrogate"
    interrupted, machine = False, machine_key(str(sm.device))
    summary = SearchSummary(len(records(study)), 0, 0, best(study, machine=machine), 0.0)
    try:
        strategy.prepare(sm, cal, say=say)
        say(f"searching: {strategy.name} ({strategy.method.name}), budget {budget}, {search_kind} objective")
        summary = run_search(study, strategy, objective, budget=budget, kind=search_kind, machine=machine,
                             on_trial=on_trial)
    except KeyboardInterrupt:
        # Ctrl-C: every finished trial is already in the study; ship the best found so far.
        interrupted = True
    # 3.-4. time the shortlist (two-stage) and choose what ships, with the strategy's companions
    shipped = ship(study, objective, strategy, shortlisted=s.shortlist if objective_kind == "two-stage" else None,
                   interrupted=interrupted, machine=machine, say=say)
    summary = replace(summary, trials_total=len(records(study)), best=shipped.best)
    timed = list(shipped.timed)
    profile = Profile(
        model=ModelRef.of(sm),
        method=shipped.candidate.method,
        draft=shipped.candidate.draft,
        method_params=tuple(shipped.candidate.plain_params().items()),
        kernel=sm.kernel.label,
        measured=_measured(shipped.measurement, s, sm, objective, shipped.verdict, timed, shipped=shipped.candidate),
        environment=Environment.current(str(sm.device), placement=getattr(sm, "placement", None)),
        search=SearchInfo(
            strategy=strategy.name, budget=budget, trials=summary.trials_total,
            study=s.storage and f"{s.storage} ({study.study_name})" or s.study_dir,
            objective=objective_kind, seed=s.seed,
        ),
    )
    companions = _companion_profiles(profile, shipped.companions)
    if not shipped.interrupted:  # what re-planning for another device needs: traces and costs (device_replan)
        from skipsearch.search.replan import keep_portable_all

        workload = calibration_workload(s.dataset, s.n_prompts, s.max_new_tokens)
        tried = [r.candidate for r in timed] + ([summary.best.candidate] if summary.best else [])
        profile, companions = keep_portable_all(profile, companions, objective,
                                                [*tried, *shortlist(study, s.shortlist)], workload=workload)
    return OptimizeResult(profile, summary, shipped.timed, shipped.verdict, shipped.interrupted, companions)


def _measured(m: Measurement | None, s: SearchSettings, sm, objective: ModelObjective, verdict: str,
              timed: list[TrialRecord], *, shipped: Candidate) -> Measured:
    costs = objective.measured_costs
    common = dict(
        device=str(sm.device), dataset=f"{s.dataset} (calib split)", n_prompts=s.n_prompts,
        max_new_tokens=s.max_new_tokens, seed=s.seed, source="optimize", notes=verdict,
    )
    extra = (("cost_c", round(m.cost_ratio, 4) if m and m.cost_ratio else None),
             ("verify_cost_v", [round(v, 3) for v in costs.verify_ratio] if costs is not None else None),
             ("alpha", round(m.alpha, 4) if m and m.alpha is not None else None),
             # what was timed, best first: the shortlist a profile was chosen from
             ("timed", [[candidate_summary(r.candidate), round(r.measurement.speedup, 4),
                         round(r.measurement.predicted_speedup or 0, 4)] for r in timed[:10]] or None),
             ("timed_columns", ["candidate", "speedup", "predicted"] if timed else None))
    extra = tuple((k, v) for k, v in extra if v is not None)
    if m is None or shipped.is_autoregressive:
        return Measured(extra=extra, **common)
    return Measured(
        speedup=m.speedup, tokens_per_s=m.tokens_per_s, baseline_tokens_per_s=m.baseline_tokens_per_s,
        tau=m.tau, acceptance_rate=m.acceptance_rate, predicted_speedup=m.predicted_speedup,
        baseline=BASELINE_OURS_AR if m.kind == "timed" else BASELINE_PREDICTED,
        extra=extra, **common,
    )


__all__ = ["OBJECTIVES", "OptimizeResult", "SearchSettings", "build_strategy", "candidate_summary",
           "config_summary", "optimize"]
