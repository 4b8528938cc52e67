"""The hierarchical planner on the model: measure its inputs, plan, and hold the plan to account.

Stages, on a calibration the caller made (a ``surrogate.Calibration``: the full model's greedy continuations of
the prompts; ``skipsearch.api.planning`` makes it), each reusing the one tool that already does the job:
1. α and β, teacher-forced along those continuations (``surrogate.trace`` over the full model's context KV,
   ``surrogate.full_cache``): α = how often M_q's argmax equals M_p's token, β = how often M_s's argmax equals
   M_q's argmax (``measure_acceptance``);
2. costs with the one timer at the calibration context, all in the same rotated rounds (``surrogate.measure_costs``
   with M_q and M_s as extra configs): a full step and v(k), one M_q step, one M_s step and M_q's k-token forwards
   v_q(k), each the median of its samples (``measure_level_costs``);
3. plan every (m, n) (``closed_form.plan_table``);
4. validate (optional): decode the same prompts with the best three-level (m, n), the best two-level (n = 0) and
   plain autoregressive decoding through the one harness (``harness.run_rounds``: warm-up, rotated rounds, the
   baseline in the same rounds); greedy output must be identical; report measured speedup, τ and the decoder's own
   α, β beside the prediction (``validate``).
``plan_model`` runs them for a given M_q and M_s.

``plan --study S`` chooses M_q and M_s itself: the α/c Pareto front of the study's layer-skip drafts (read from the
study by ``skipsearch.api.planning.study_front``), every pair from it the decoder allows scored by the closed forms
with β traced here (``choose_pairs``), then the stages for the best pair (``plan_from_front``). Making a profile of
the chosen (m, n) is the api's too (``skipsearch.api.planning.build_profile``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from skipsearch.config import ConfigError, DraftConfig
from skipsearch.engine import timing
from skipsearch.engine.equivalence import lossless_check
from skipsearch.engine.harness import engine_method, first_outputs, method_seconds, ours_autoregressive, run_rounds
from skipsearch.engine.surrogate import Calibration, CostModel, full_cache, measure_costs, trace, trace_skip_sets
from skipsearch.methods.hierarchical.closed_form import Plan, PlanInputs, PlanRow, format_plan, plan_row, plan_table
from skipsearch.methods.hierarchical.drafter import HierarchicalDrafter
from skipsearch.methods.hierarchical.params import Hierarchy
from skipsearch.model.skippable import SkippableModel

Stage = Callable[[str], None]


@dataclass(frozen=True)
class Acceptance:
    alpha: float  # M_q's argmax == M_p's token, over all positions
    beta: float  # M_s's argmax == M_q's argmax, over all positions
    positions: int


def measure_acceptance(sm: SkippableModel, cal: Calibration, medium: DraftConfig, small: DraftConfig) -> Acceptance:
    """Teacher-forced per-token acceptance of each level against the level that checks it (greedy)."""
    alpha_hits = beta_hits = positions = 0
    for prompt, cont in zip(cal.prompts, cal.continuations, strict=True):
        if not cont:
            continue
        kv = full_cache(sm, prompt, cont)  # built once, shared by both traces
        tq = trace(sm, prompt, cont, medium, cache=kv)
        ts = trace(sm, prompt, cont, small, cache=kv)
        alpha_hits += sum(tq.matches)
        beta_hits += sum(s == q for s, q in zip(ts.predictions, tq.predictions, strict=True))
        positions += len(cont)
    if not positions:
        raise ConfigError("no calibration tokens: the full model ended every continuation at once")
    return Acceptance(alpha_hits / positions, beta_hits / positions, positions)


@dataclass(frozen=True)
class LevelCosts:
    """Timed costs of the three levels at one context length: medians of samples taken in the same
    rotated rounds (surrogate.measure_costs), so that c and c_s compare like with like."""

    step_seconds: float  # one M_p single-token step
    medium_seconds: float  # one M_q single-token step
    small_seconds: float  # one M_s single-token step
    verify: tuple[float, ...]  # v(k): M_p forward over k tokens / one M_p step
    verify_medium: tuple[float, ...]  # v_q(k): M_q forward over k tokens / one M_q step

    @property
    def c(self) -> float:
        return self.medium_seconds / self.step_seconds

    @property
    def cs(self) -> float:
        return self.small_seconds / self.medium_seconds


def measure_level_costs(sm: SkippableModel, context: Sequence[int], medium: DraftConfig, small: DraftConfig, *,
                        max_verify: int, max_verify_medium: int, repeats: int = 7) -> LevelCosts:
    """M_p's step and v(k), M_q's and M_s's steps and M_q's v_q(k), timed in one set of rounds."""
    # v(k) measured at a spread of sizes up to the largest block, interpolated between them;
    # v_q(k) at every k, as M_q verifies at most n + 1 tokens
    sizes = sorted({k for k in (1, 2, 3, 4, 6, 9, 13, 19, 28, 41, 60) if k <= max_verify} | {max_verify})
    costs = measure_costs(sm, context, verify_sizes=sizes, repeats=repeats, extra={"medium": medium, "small": small},
                          extra_verify_sizes={"medium": range(1, max_verify_medium + 1)})
    q, s = costs.extra("medium"), costs.extra("small")
    return LevelCosts(costs.step_seconds, q.step_seconds, s.step_seconds, costs.verify_ratio, q.verify_ratio)


@dataclass(frozen=True)
class ValidationRow:
    m: int
    n: int
    predicted_speedup: float  # from the teacher-forced α, β and the timed costs
    predicted_tau: float
    measured_speedup: float  # autoregressive seconds / these seconds, same prompts, interleaved
    measured_tau: float  # tokens per M_p verify step, the first (prefill) token not counted
    alpha: float | None  # the decoder's own: M_q tokens accepted by M_p / tested
    beta: float | None  # M_s tokens accepted by M_q / tested
    repredicted_speedup: float  # the planner again, with the decoder's own α, β
    seconds: float
    baseline_seconds: float
    tokens: int


def validate(sm: SkippableModel, cal: Calibration, inputs: PlanInputs, hierarchies: Sequence[Hierarchy], *,
             repeats: int = 1) -> tuple[ValidationRow, ...]:
    """Time each hierarchy against plain decoding on the calibration prompts, through the one harness
    (warm-up, rotated rounds, the baseline in the same rounds); greedy output must be identical."""
    # One drafter per hierarchy serves every timed decode, so that its counters pool α and β over the
    # prompts: it holds no state that steers the drafting, only counters. The drafters are made afresh
    # after the warm-up, which must not count. Each repeat adds a prompt's counts again, identical
    # under greedy decoding, so the pooled ratios are those of a single pass.
    pooled = [HierarchicalDrafter(h) for h in hierarchies]

    def fresh_counters() -> None:
        pooled[:] = [HierarchicalDrafter(h) for h in hierarchies]

    base = ours_autoregressive(sm, name="autoregressive")
    methods = [base, *(engine_method(sm, f"#{j} m={h.m} n={h.n}", lambda _ids, j=j: pooled[j], setting=str(h))
                       for j, h in enumerate(hierarchies))]
    runs = run_rounds(methods, cal.prompts, max_new_tokens=cal.max_new_tokens, device=sm.device, repeats=repeats,
                      warmup_tokens=8, reference=base.name, strict=True, same=lossless_check(sm),
                      on_warmed=fresh_counters)
    seconds = method_seconds(runs)
    rows = []
    for method, h, drafter in zip(methods[1:], hierarchies, pooled, strict=True):
        outs = first_outputs(runs, method.name)
        tokens = sum(len(o.token_ids) for o in outs)
        cycles = sum(o.verify_steps or 0 for o in outs)
        own = dict(drafter.report())
        predicted = plan_row(inputs, h.m, h.n)
        again = PlanInputs(own.get("alpha", inputs.alpha), own.get("beta", inputs.beta), inputs.c, inputs.cs,
                           inputs.verify, inputs.verify_medium)
        rows.append(ValidationRow(
            m=h.m, n=h.n, predicted_speedup=predicted.speedup, predicted_tau=predicted.tokens,
            measured_speedup=seconds[base.name] / seconds[method.name],
            measured_tau=(tokens - len(cal.prompts)) / cycles if cycles else 1.0,
            alpha=own.get("alpha"), beta=own.get("beta") if h.n else None,
            repredicted_speedup=plan_row(again, h.m, h.n).speedup,
            seconds=seconds[method.name], baseline_seconds=seconds[base.name], tokens=tokens,
        ))
    return tuple(rows)


@dataclass(frozen=True)
class PlanReport:
    """Everything one ``skipsearch plan --model ...`` run measured and predicted."""

    model: str
    device: str
    dataset: str
    n_prompts: int
    max_new_tokens: int
    seed: int
    medium: DraftConfig
    small: DraftConfig
    acceptance: Acceptance
    costs: LevelCosts
    plan: Plan
    validation: tuple[ValidationRow, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["costs"].update(c=self.costs.c, cs=self.costs.cs)
        return out

    def chosen(self) -> Hierarchy:
        """What --out ships: the best *measured* pair when validated, else the best predicted."""
        if self.validation:
            row = max(self.validation, key=lambda r: r.measured_speedup)
            return Hierarchy(self.medium, self.small, row.m, row.n)
        return Hierarchy(self.medium, self.small, self.plan.best.m, self.plan.best.n)


def plan_model(sm: SkippableModel, cal: Calibration, medium: DraftConfig, small: DraftConfig, *, dataset: str,
               seed: int = 0, max_m: int = 8, max_n: int = 4, run_validation: bool = False, repeats: int = 1,
               cost_repeats: int = 7, on_stage: Stage | None = None) -> PlanReport:
    """The stages of the module docstring for M_q ``medium`` and M_s ``small``, on calibration ``cal``."""
    say = on_stage or (lambda _msg: None)
    t0 = timing.now(sm.device)
    Hierarchy(medium, small, max_m, max_n).check_layers(sm.num_layers)  # the rules, before any work
    say("measuring α and β (teacher-forced)")
    acc = measure_acceptance(sm, cal, medium, small)
    say("timing the three levels and the verify curves")
    context = cal.cost_context
    costs = measure_level_costs(sm, context, medium, small, max_verify=max_m * (max_n + 1) + 1,
                                max_verify_medium=max_n + 1, repeats=cost_repeats)
    inputs = PlanInputs(acc.alpha, acc.beta, costs.c, costs.cs, costs.verify, costs.verify_medium)
    plan = plan_table(inputs, max_m=max_m, max_n=max_n)
    rows: tuple[ValidationRow, ...] = ()
    if run_validation:
        pairs = [plan.best_three_level, plan.best_two_level]
        hierarchies = [Hierarchy(medium, small, r.m, r.n) for r in pairs if r is not None]
        say("decoding: " + ", ".join(f"m={h.m} n={h.n}" for h in hierarchies) + " and autoregressive, interleaved")
        rows = validate(sm, cal, inputs, hierarchies, repeats=repeats)
    return PlanReport(
        model=sm.name, device=str(sm.device), dataset=dataset, n_prompts=len(cal.prompts),
        max_new_tokens=cal.max_new_tokens, seed=seed, medium=medium, small=small, acceptance=acc, costs=costs,
        plan=plan, validation=rows, seconds=timing.now(sm.device) - t0,
    )


def _skips(c: DraftConfig, num_layers: int) -> str:
    return (f"attn {list(c.skip_attn)}, mlp {list(c.skip_mlp)} "
            f"({c.skip_ratio(num_layers):.0%} of {2 * num_layers} sublayers)")


def format_validation(rows: Sequence[ValidationRow]) -> str:
    lines = [
        "| m | n | predicted speedup | measured speedup | predicted τ | measured τ | decode α | decode β "
        "| re-predicted with decode α, β |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        a = "-" if r.alpha is None else f"{r.alpha:.3f}"
        b = "-" if r.beta is None else f"{r.beta:.3f}"
        lines.append(f"| {r.m} | {r.n} | {r.predicted_speedup:.3f}x | {r.measured_speedup:.3f}x | "
                     f"{r.predicted_tau:.2f} | {r.measured_tau:.2f} | {a} | {b} | {r.repredicted_speedup:.3f}x |")
    return "\n".join(lines)


def render_markdown(rep: PlanReport, *, num_layers: int, command: str | None = None) -> str:
    """The report under studies/: inputs, the (m, n) table, predicted against measured, the verdict."""
    c = rep.costs
    out = [
        f"# Hierarchical speculative decoding: {rep.model} on {rep.device}",
        "",
        "Generated by `skipsearch plan`" + (f":\n\n```\n{command}\n```" if command else "."),
        "",
        f"- M_q (medium): {_skips(rep.medium, num_layers)}",
        f"- M_s (small): {_skips(rep.small, num_layers)}",
        f"- prompts: {rep.n_prompts} from {rep.dataset} (calib split, seed {rep.seed}), "
        f"{rep.max_new_tokens} new tokens each; α, β over {rep.acceptance.positions} positions",
        f"- timed: M_p step {c.step_seconds * 1e3:.2f} ms, M_q step {c.medium_seconds * 1e3:.2f} ms "
        f"(c = {c.c:.3f}), M_s step {c.small_seconds * 1e3:.2f} ms (c_s = {c.cs:.3f})",
        f"- wall time of this run: {rep.seconds:.0f} s",
        "",
        "## Predictions over (m, n)",
        "",
        "\"ours\" is the composed decoder that runs (β = M_s's acceptance by M_q; measured verify costs). "
        "The Theorem 3.2/3.4 columns are the paper's formulas with the same numbers, reading β as M_s's "
        "acceptance by M_p and taking verification as free.",
        "",
        format_plan(rep.plan),
    ]
    if rep.validation:
        out += ["", "## Predicted against measured", "",
                "Same prompts, greedy, interleaved with plain autoregressive decoding in this process; every "
                "output was identical to autoregressive output.", "", format_validation(rep.validation), ""]
        three = [r for r in rep.validation if r.n >= 1]
        two = [r for r in rep.validation if r.n == 0]
        if three and two:
            pays = three[0].measured_speedup > two[0].measured_speedup
            out.append(f"Measured: the third level {'pays' if pays else 'does not pay'} here "
                       f"({three[0].measured_speedup:.3f}x with m={three[0].m}, n={three[0].n} against "
                       f"{two[0].measured_speedup:.3f}x with m={two[0].m}, n=0).")
    return "\n".join(out) + "\n"


# -- choosing M_q and M_s from a study (``skipsearch plan --study S``) -----------------------------------------
@dataclass(frozen=True)
class FrontPoint:
    config: DraftConfig  # the skip sets (K and the exit rule play no part in a level)
    alpha: float  # the study's: per-position agreement with the full model on its calibration set
    c: float  # one draft step / one full step, under the cost model in use
    trial: int


@dataclass(frozen=True)
class PairChoice:
    medium: DraftConfig
    small: DraftConfig
    alpha: float  # M_q's agreement with M_p, traced here
    beta: float  # M_s's agreement with M_q, traced here
    c: float
    cs: float
    best: PlanRow  # the best (m, n) of the closed forms for this pair
    best_three_level: PlanRow | None  # the best with n >= 1 (None where the rules allow n = 0 only)


@dataclass(frozen=True)
class StudyPlan:
    study: str
    front: tuple[FrontPoint, ...]  # cheapest first
    pairs: tuple[PairChoice, ...]  # every pair the decoder's rules allow, best predicted first
    report: PlanReport  # the chosen pair, measured (α, β, level costs) and, with validation, timed


def choose_pairs(front: Sequence[FrontPoint], traces: dict, costs: CostModel, *, max_m: int = 8,
                 max_n: int = 4) -> tuple[PairChoice, ...]:
    """Every (M_q, M_s) from the front that the three-level decoder accepts (M_s skips every attention M_q
    skips, and is no dearer), with α and β from the traces and the best (m, n) of the closed forms; best first.
    With layer 0's attention skipped in M_q only n = 0 is allowed."""
    out = []
    for q in front:
        for s in front:
            if not set(q.config.skip_attn) <= set(s.config.skip_attn) or s.c > q.c or q.c <= 0:
                continue
            tq = traces[(q.config.skip_attn, q.config.skip_mlp)]
            ts = traces[(s.config.skip_attn, s.config.skip_mlp)]
            positions = sum(len(t.matches) for t in tq)
            alpha = sum(sum(t.matches) for t in tq) / positions
            beta = sum(a == b for x, y in zip(ts, tq, strict=True)
                       for a, b in zip(x.predictions, y.predictions, strict=True)) / positions
            inputs = PlanInputs(alpha, beta, q.c, s.c / q.c, costs.verify_ratio)
            n_max = 0 if 0 in q.config.skip_attn else max_n
            rows = [plan_row(inputs, m, n) for m in range(1, max_m + 1) for n in range(n_max + 1)]
            three = max((r for r in rows if r.n >= 1), key=lambda r: r.speedup, default=None)
            out.append(PairChoice(q.config, s.config, alpha, beta, q.c, s.c / q.c,
                                  max(rows, key=lambda r: r.speedup), three))
    # ties (the best is two-level, so M_s does not matter) go to a real third level (M_s is not M_q), then to
    # the pair whose three-level row is best
    return tuple(sorted(out, key=lambda p: (-round(p.best.speedup, 9), p.small == p.medium,
                                            -(p.best_three_level.speedup if p.best_three_level else 0.0))))


def plan_from_front(sm: SkippableModel, cal: Calibration, front: Sequence[FrontPoint], costs: CostModel, *,
                    study: str, dataset: str, seed: int = 0, max_m: int = 8, max_n: int = 4,
                    run_validation: bool = True, repeats: int = 1, cost_repeats: int = 7,
                    on_stage: Stage | None = None) -> StudyPlan:
    """The pairs of ``front`` (its skip sets traced here, scored under ``costs``), then the stages of the module
    docstring for the best pair: its α, β and level costs measured here, every (m, n) planned, and
    (``run_validation``) its best three- and two-level shapes timed."""
    say = on_stage or (lambda _msg: None)
    say(f"tracing the {len(front)} skip sets of the α/c Pareto front")
    traces = trace_skip_sets(sm, cal, [p.config for p in front])
    pairs = choose_pairs(front, traces, costs, max_m=max_m, max_n=max_n)
    top = pairs[0]
    say(f"chosen: M_q {_skips(top.medium, sm.num_layers)}; M_s {_skips(top.small, sm.num_layers)}")
    report = plan_model(sm, cal, top.medium, top.small, dataset=dataset, seed=seed, max_m=max_m,
                        max_n=0 if 0 in top.medium.skip_attn else max_n, run_validation=run_validation,
                        repeats=repeats, cost_repeats=cost_repeats, on_stage=on_stage)
    return StudyPlan(study, tuple(front), pairs, report)


def render_study_markdown(sp: StudyPlan, *, num_layers: int, command: str | None = None) -> str:
    """The front, the pairs the closed forms ranked, then the chosen pair's report (render_markdown)."""
    out = [f"# Hierarchical levels chosen from study {sp.study}", "",
           "The α/c Pareto front of the study's layer-skip drafts (α: the study's; c: the cost model in use):", "",
           "| trial | α | c | skip attn | skip mlp |", "|---:|---:|---:|---|---|"]
    out += [f"| {p.trial} | {p.alpha:.3f} | {p.c:.3f} | {list(p.config.skip_attn)} | {list(p.config.skip_mlp)} |"
            for p in sp.front]
    out += ["", "Pairs the three-level decoder accepts, by the closed forms' best (m, n) (α, β traced here):", "",
            "| M_q attn/mlp | M_s attn/mlp | α | β | c | c_s | best m, n | predicted |",
            "|---|---|---:|---:|---:|---:|---|---:|"]
    out += [f"| {list(p.medium.skip_attn)}/{list(p.medium.skip_mlp)} | {list(p.small.skip_attn)}/"
            f"{list(p.small.skip_mlp)} | {p.alpha:.3f} | {p.beta:.3f} | {p.c:.3f} | {p.cs:.3f} | "
            f"{p.best.m}, {p.best.n} | {p.best.speedup:.3f}x |" for p in sp.pairs[:10]]
    return "\n".join(out) + "\n\n" + render_markdown(sp.report, num_layers=num_layers, command=command)


__all__ = ["Acceptance", "FrontPoint", "LevelCosts", "PairChoice", "PlanReport", "StudyPlan", "ValidationRow",
           "choose_pairs", "format_validation", "measure_acceptance", "measure_level_costs", "plan_from_front",
           "plan_model", "render_markdown", "render_study_markdown", "validate"]
