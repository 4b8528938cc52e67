"""``skipsearch optimize`` as a library function: search, time a shortlist, write a profile.

Stages:
1. calibrate: the full model's greedy continuations of the calibration prompts (calib split);
   the strategy learns what it needs from the model (``Strategy.prepare``: CLaSp's DP);
2. search: the strategy proposes candidates, the method's surrogate scores them (or the timer, with
   objective "timed"); every trial is an Optuna trial, asked and told through the public API;
3. time: the best distinct candidates of the search are timed with the runtime decoder against the
   autoregressive baseline, interleaved, in this process; each is claimed and recorded in the study;
4. ship: the best *timed* candidate, if it beat plain decoding, on a machine no other skipsearch worker
   shared, and again when timed once more; otherwise the profile ships ``max_draft_tokens: 0`` (plain
   decoding) and its notes say why, with the measured α, c and v(k).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from skipsearch.calibration import calibrate_on, calibration_workload
from skipsearch.config import AUTOREGRESSIVE, Candidate, ConfigError, DraftConfig
from skipsearch.measure import Measurement
from skipsearch.methods.summary import candidate_summary, config_summary  # re-exported: callers read them here
from skipsearch.models import SkippableModel
from skipsearch.objective import ModelObjective
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
from skipsearch.space import SearchSpace
from skipsearch.strategies import Strategy, make_strategy
from skipsearch.study import (
    KIND_ATTR,
    MEASUREMENT_ATTR,
    WORKER_ATTR,
    SearchSummary,
    TrialRecord,
    best,
    candidate_attrs,
    contention,
    finish_trial,
    heartbeat,
    open_study,
    records,
    run_search,
    set_trial_attr,
    shortlist,
    stamp_model,
    storage_conflict,
    trial_candidate,
    worker_id,
)

OBJECTIVES = ("auto", "two-stage", "surrogate", "timed")
CLAIM_ATTR = "claim"  # trial user attr: the random token of the worker that claimed a timing
_STATES = optuna.trial.TrialState


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """What a search is asked (``skipsearch optimize``'s options, parsed once; each has the CLI option's meaning):
    built by the caller, read by ``api.optimize_study`` / ``api.rerank_study`` and by ``optimize``."""

    # the model searched, and how it loads
    model: str = "smollm2-135m"
    device: str = "auto"
    dtype: str = "auto"
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
    repeats: int = 1  # timed runs per prompt (median); raise where timing noise demands it
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
            return f"studies/{Path(self.model).name}-{self.strategy}"
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
    strategy = make_strategy(s.strategy, space, seed=s.seed, warm_start=warm_start, **dict(s.strategy_options))
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
    stamp_model(study, name=sm.name, num_layers=sm.num_layers, fingerprint=getattr(sm, "fingerprint", None))
    budget, most = s.budget, strategy.plan().max_trials
    if most is not None and budget > most:
        say(f"{strategy.name}'s grid has {most} points: budget {budget} lowered to that")
        budget = most

    cal = calibrate_on(sm, dataset=s.dataset, n_prompts=s.n_prompts, max_new_tokens=s.max_new_tokens, seed=s.seed,
                       say=say)
    # the kernel every timing and the cost model run through, sized for the longest calibration sequence
    sm.use_kernel(s.kernel, capacity=max(map(len, cal.prompts)) + s.max_new_tokens)
    objective = ModelObjective(sm, cal, repeats=s.repeats)
    search_kind = "timed" if objective_kind == "timed" else "surrogate"
    interrupted = False
    summary = SearchSummary(len(records(study)), 0, 0, best(study), 0.0)
    try:
        strategy.prepare(sm, cal, say=say)
        say(f"searching: {strategy.name} ({strategy.method.name}), budget {budget}, {search_kind} objective")
        summary = run_search(study, strategy, objective, budget=budget, kind=search_kind, on_trial=on_trial)
        if objective_kind == "two-stage":
            for candidate in shortlist(study, s.shortlist):
                _time_claimed(study, objective, candidate, say)
    except KeyboardInterrupt:
        # Ctrl-C: every finished trial is already in the study; ship the best found so far.
        interrupted = True
    summary = replace(summary, trials_total=len(records(study)), best=best(study))
    timed = sorted((r for r in records(study) if r.measurement is not None and r.measurement.kind == "timed"),
                   key=lambda r: -r.measurement.speedup)
    shipped, m, verdict = _verdict(timed, summary.best, objective, strategy, interrupted=interrupted, say=say)
    profile = Profile(
        model=ModelRef.of(sm),
        method=shipped.method,
        draft=shipped.draft,
        method_params=tuple(shipped.plain_params().items()),
        kernel=sm.kernel.label,
        measured=_measured(m, s, sm, objective, verdict, timed, shipped=shipped),
        environment=Environment.current(str(sm.device), placement=getattr(sm, "placement", None)),
        search=SearchInfo(
            strategy=strategy.name, budget=budget, trials=summary.trials_total,
            study=s.storage and f"{s.storage} ({study.study_name})" or s.study_dir,
            objective=objective_kind, seed=s.seed,
        ),
    )
    tried = [r.candidate for r in timed] + ([summary.best.candidate] if summary.best else [])
    companions = _companions(strategy, profile, tried)
    if not interrupted:  # what re-planning for another device needs: traces and costs (skipsearch.device_replan)
        from skipsearch.device_replan import keep_portable, record_on_model

        workload = calibration_workload(s.dataset, s.n_prompts, s.max_new_tokens)
        profile = keep_portable(profile, objective, [*tried, *shortlist(study, s.shortlist)], workload=workload)
        # a companion's own draft (e.g. dynamic CLaSp's starting skip set) traced, so that it re-plans too
        companions = tuple((suffix, record_on_model(c, sm, cal, workload=workload, source=suffix)
                            if c.draft.skip_attn or c.draft.skip_mlp else c) for suffix, c in companions)
    return OptimizeResult(profile, summary, tuple(timed), verdict, interrupted, companions)


def _companions(strategy: Strategy, shipped: Profile, tried: list[Candidate]) -> tuple[tuple[str, Profile], ...]:
    """The profiles of the strategy's companion candidates (e.g. CLaSp's dynamic one), not timed by optimize."""
    out = []
    for companion in strategy.companions(shipped.candidate, tried):
        c = companion.candidate
        measured = Measured(device=shipped.measured.device if shipped.measured else None, source="optimize",
                            notes=companion.notes)
        out.append((companion.suffix, replace(shipped, method=c.method, draft=c.draft, measured=measured,
                                              method_params=c.params)))
    return tuple(out)


# -- timing the shortlist: one claim per candidate, over every worker ----------------------------------


def claim_timed(study: optuna.Study, candidate: Candidate) -> int | None:
    """Claim the timing of ``candidate`` for this worker: a RUNNING trial that other workers see.

    Returns the claim's trial number, or None when the candidate is timed (or being timed) already.
    Two workers claiming at the same moment both add a claim; the lower trial number keeps it and
    the other fails its own claim, so no candidate is ever timed twice.
    """
    def twins() -> list[optuna.trial.FrozenTrial]:
        live = study.get_trials(deepcopy=False, states=(_STATES.COMPLETE, _STATES.RUNNING))
        return [t for t in live if t.user_attrs.get(KIND_ATTR) == "timed" and trial_candidate(t) == candidate]

    if twins():
        return None
    token = secrets.token_hex(8)
    study.add_trial(optuna.trial.create_trial(
        state=_STATES.RUNNING, params={}, distributions={},
        user_attrs={**candidate_attrs(candidate), KIND_ATTR: "timed", CLAIM_ATTR: token, WORKER_ATTR: worker_id()},
    ))
    mine = next(t for t in twins() if t.user_attrs.get(CLAIM_ATTR) == token)
    if min(t.number for t in twins()) != mine.number:
        fail_claim(study, mine.number, "another worker claimed this candidate first")
        return None
    return mine.number


def record_timed(study: optuna.Study, claim: int, m: Measurement) -> str | None:
    """Finish a claimed timed trial with its measurement; None, or the storage conflict that prevented it
    (another worker failed the claim as lost: it is never written again)."""
    try:
        set_trial_attr(study, claim, MEASUREMENT_ATTR, m.to_dict())
    except Exception as e:
        if not storage_conflict(e):
            raise
        return finish_trial(study, claim, error=f"measurement not recorded: {' '.join(str(e).split())[:200]}")
    return finish_trial(study, claim, value=m.speedup)


def fail_claim(study: optuna.Study, claim: int, error: str) -> str | None:
    """Mark a claim this process added as failed, with its one-line error; None, or the storage conflict."""
    return finish_trial(study, claim, error=error)


def _time_claimed(study: optuna.Study, objective: ModelObjective, candidate: Candidate, say) -> None:
    claim = claim_timed(study, candidate)  # None: timed already, by a resumed run or another worker
    if claim is None:
        return
    say(f"timing {candidate_summary(candidate)}")
    try:
        with heartbeat(study, claim):
            busy = contention(study)
            m = objective.evaluate(candidate, kind="timed")
            busy = busy or contention(study)
        if busy:
            say(f"warning: {busy}: this figure will not be shipped")
            m = replace(m, notes=busy)
        conflict = record_timed(study, claim, m)
        if conflict:
            say(f"warning: {conflict}")
    except KeyboardInterrupt:
        fail_claim(study, claim, "interrupted")
        raise
    except Exception as e:  # e.g. out of memory: recorded, and the next candidate is timed
        conflict = fail_claim(study, claim, " ".join(str(e).split())[:300] or type(e).__name__)
        if conflict:
            say(f"warning: {conflict}")


# -- what ships -------------------------------------------------------------------------------------------


def _verdict(timed: list[TrialRecord], top_any: TrialRecord | None, objective: ModelObjective, strategy: Strategy,
             *, interrupted: bool, say) -> tuple[Candidate, Measurement | None, str]:
    """The candidate to ship, the measurement it ships with, and one sentence saying why."""
    trusted = [r for r in timed if not r.measurement.notes]
    top = trusted[0] if trusted else None
    if top is not None and top.measurement.speedup > 1.0 and not interrupted:
        # A speedup is re-checked before it ships: timing noise, or a neighbour that came and went,
        # must not put a loss into a profile that teams will share.
        say(f"re-checking {candidate_summary(top.candidate)} before shipping it")
        again = objective.evaluate(top.candidate, kind="timed")
        if again.speedup > 1.0:
            m = top.measurement
            return top.candidate, m, (f"ships {candidate_summary(top.candidate)}: {m.speedup:.3f}x measured against "
                                      f"autoregressive decoding, {again.speedup:.3f}x when timed again")
        top_m = top.measurement
        why = (f"; best draft measured {top_m.speedup:.3f}x but {again.speedup:.3f}x when timed again, so it "
               f"does not reliably beat plain decoding")
        return _plain_decoding(top.candidate), top_m, "ships max_draft_tokens 0" + why
    if not timed and top_any is not None and top_any.measurement.kind == "surrogate" and \
            top_any.measurement.speedup > 1.0:
        m = top_any.measurement
        return top_any.candidate, m, (f"ships {candidate_summary(top_any.candidate)}: {m.speedup:.3f}x predicted "
                                      f"(surrogate only; not timed)")
    best_r = top or (timed[0] if timed else top_any)
    m = best_r.measurement if best_r is not None else None
    costs = objective.measured_costs  # never measured on the way out of a Ctrl-C
    why = ""
    if m is not None:
        # the figures that belong to the method; a timing taken under load says so, and v(k) measured beside
        # flagged timings is left out (under contention it reads 14 where the machine's own is 1.6)
        why = f"; best draft measured {m.speedup:.3f}x" + (" under load" if m.notes else "")
        figures = method_figures(m)
        why += f" with {figures}" if figures else ""
        why += f", v(2) {costs.verify(2):.2f}" if costs is not None and not m.notes and trusted else ""
    if timed and not trusted:
        why += f" (every timing was flagged: {timed[0].measurement.notes})"
    base = best_r.candidate if best_r is not None else strategy.method.candidate(AUTOREGRESSIVE)
    return _plain_decoding(base), m, "no draft candidate beat plain decoding on this hardware: ships " \
                                     "max_draft_tokens 0" + why


def method_figures(m: Measurement) -> str:
    """The acceptance figures that mean something for the measured draft: a model draft's α and c; a draft with
    no per-token α (a lookup, which no model runs; a draft no surrogate traces) its acceptance rate and τ. A
    figure that was not measured is left out, never printed as 0."""
    parts = []
    if m.alpha is not None:
        parts.append(f"alpha {m.alpha:.2f}")
        if m.cost_ratio is not None:
            parts.append(f"c {m.cost_ratio:.2f}")
    else:
        if m.acceptance_rate is not None:
            parts.append(f"acceptance {m.acceptance_rate:.2f}")
        if m.tau is not None:
            parts.append(f"tau {m.tau:.2f}")
    return ", ".join(parts)


def _plain_decoding(candidate: Candidate) -> Candidate:
    """Plain decoding (K = 0), keeping the method, its parameters and the skip sets, so that the profile
    shows what was best, and can start another search (``--warm-start``) from it."""
    return replace(candidate, draft=replace(candidate.draft, max_draft_tokens=0))


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
           "claim_timed", "config_summary", "fail_claim", "optimize", "record_timed"]
