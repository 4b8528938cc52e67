"""``skipsearch plan`` with a model: measure the planner's inputs, plan, and hold the plan to account.

Stages (each reuses the one tool that already does the job):
1. calibrate: the full model's greedy continuations of the prompts (objective.calibrate);
2. α and β, teacher-forced along those continuations (objective.trace, full-model context KV):
   α = how often M_q's argmax equals M_p's token, β = how often M_s's argmax equals M_q's argmax;
3. costs with the one timer at the calibration context: a full step and v(k) (objective.measure_costs),
   then one M_q step, one M_s step and M_q's k-token forwards v_q(k), the same way;
4. plan every (m, n) (plan.plan_table);
5. validate (optional): decode the same prompts with the best three-level (m, n), the best two-level
   (n = 0) and plain autoregressive decoding, interleaved prompt by prompt in this process; greedy
   output must be identical; report measured speedup, τ and the decoder's own α, β beside the prediction.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from skipsearch import timing
from skipsearch.config import ConfigError, DraftConfig
from skipsearch.decoding import generate
from skipsearch.hierarchical import HierarchicalDrafter, Hierarchy, hierarchy_to_profile_fields
from skipsearch.models import SkippableModel
from skipsearch.objective import Calibration, LosslessnessError, full_cache, measure_costs, trace
from skipsearch.plan import Plan, PlanInputs, format_plan, plan_row, plan_table
from skipsearch.profile import Environment, Measured, ModelRef, Profile, SearchInfo

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
    """Timed costs of the three levels at one context length (best of repeats)."""

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
    # v(k) measured at a spread of sizes up to the largest block, interpolated between them
    sizes = sorted({k for k in (1, 2, 3, 4, 6, 9, 13, 19, 28, 41, 60) if k <= max_verify} | {max_verify})
    full = measure_costs(sm, context, verify_sizes=sizes, repeats=repeats)
    cache = sm.new_cache()
    sm.forward(torch.tensor(list(context)), start=0, cache=cache)
    n = len(context)

    def best(config: DraftConfig, k: int) -> float:
        ids = torch.tensor((list(context) * k)[:k])

        def once() -> None:
            with sm.drafting(config):
                sm.forward(ids, start=n, cache=cache, last_only=k == 1)  # a draft step: last logits only
            sm.crop(cache, n)

        # the median, as measure_costs takes for the full model, so that c and c_s are like for like
        return timing.time_call(once, device=sm.device, repeats=repeats, warmup=2)[0].median

    medium_step, small_step = best(medium, 1), best(small, 1)
    vq = [1.0]
    for k in range(2, max_verify_medium + 1):
        vq.append(max(best(medium, k) / medium_step, vq[-1]))  # non-decreasing against noise, as v(k) is
    return LevelCosts(full.step_seconds, medium_step, small_step, full.verify_ratio, tuple(vq))


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
    """Time each hierarchy against plain decoding on the calibration prompts; greedy must be identical."""
    n_new = cal.max_new_tokens
    # first-call effects (allocator, kernels) must land on no one side
    generate(sm, cal.prompts[0], max_new_tokens=min(n_new, 8))
    for h in hierarchies:
        generate(sm, cal.prompts[0], drafter=HierarchicalDrafter(h), max_new_tokens=min(n_new, 8))
    # One drafter per hierarchy for all prompts: it holds only counters, which then pool over prompts.
    drafters = [HierarchicalDrafter(h) for h in hierarchies]
    seconds: list[list[list[float]]] = [[[] for _ in cal.prompts] for _ in range(len(hierarchies) + 1)]
    tokens = [0] * (len(hierarchies) + 1)
    cycles = [0] * (len(hierarchies) + 1)
    for i, prompt in enumerate(cal.prompts):
        for r in range(repeats):
            order = list(range(len(hierarchies) + 1))  # 0 = autoregressive
            shift = (i + r) % len(order)  # rotate who goes first, so slow drift favours no one
            outputs = {}
            for j in order[shift:] + order[:shift]:
                drafter = drafters[j - 1] if j else None
                if drafter is not None and r > 0:
                    drafter = HierarchicalDrafter(hierarchies[j - 1])  # count each prompt once
                res = generate(sm, prompt, drafter=drafter, max_new_tokens=n_new)
                outputs[j] = res.token_ids
                seconds[j][i].append(res.stats.seconds)
                if r == 0:
                    tokens[j] += res.stats.new_tokens
                    cycles[j] += res.stats.verify_steps
            for j in range(1, len(order)):
                if outputs[j] != outputs[0]:
                    raise LosslessnessError(f"greedy output differs from autoregressive for {hierarchies[j - 1]}")
    totals = [sum(statistics.median(per) for per in side) for side in seconds]
    rows = []
    for j, (h, drafter) in enumerate(zip(hierarchies, drafters, strict=True), start=1):
        own = dict(drafter.report())
        predicted = plan_row(inputs, h.m, h.n)
        again = PlanInputs(own.get("alpha", inputs.alpha), own.get("beta", inputs.beta), inputs.c, inputs.cs,
                           inputs.verify, inputs.verify_medium)
        rows.append(ValidationRow(
            m=h.m, n=h.n, predicted_speedup=predicted.speedup, predicted_tau=predicted.tokens,
            measured_speedup=totals[0] / totals[j],
            measured_tau=(tokens[j] - len(cal.prompts)) / cycles[j] if cycles[j] else 1.0,
            alpha=own.get("alpha"), beta=own.get("beta") if h.n else None,
            repredicted_speedup=plan_row(again, h.m, h.n).speedup,
            seconds=totals[j], baseline_seconds=totals[0], tokens=tokens[j],
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
    """Stages 2-5 of the module docstring, on calibration ``cal``."""
    say = on_stage or (lambda _msg: None)
    t0 = timing.now(sm.device)
    Hierarchy(medium, small, max_m, max_n).check_layers(sm.num_layers)  # the rules, before any work
    say("measuring α and β (teacher-forced)")
    acc = measure_acceptance(sm, cal, medium, small)
    say("timing the three levels and the verify curves")
    context = cal.prompts[0] + cal.continuations[0][: cal.max_new_tokens // 2]
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


def plan_from_profiles(medium: str, small: str, *, model: str | None = None, dataset: str = "mtbench",
                       n_prompts: int = 4, max_new_tokens: int = 64, max_m: int = 8, max_n: int = 4,
                       run_validation: bool = False, repeats: int = 1, seed: int = 0, device: str = "cpu",
                       dtype: str = "float32", on_stage: Stage | None = None) -> tuple[PlanReport, SkippableModel]:
    """Stage 1 and the rest: M_q and M_s from two profiles' draft skip sets, calibration prompts from ``dataset``.

    Everything that can be checked without the model (profiles, level rules, prompts) is checked first.
    """
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.models import load_model
    from skipsearch.objective import calibrate
    from skipsearch.profile import check_model, load_profile

    med, sml = load_profile(medium), load_profile(small)
    Hierarchy(med.draft, sml.draft, max_m, max_n)
    prompts = load_prompts(dataset, split="calib", n=n_prompts, seed=seed)
    sm = load_model(model or med.model.name, device=device, dtype=dtype)
    for path, prof in ((medium, med), (small, sml)):
        check_model(prof, num_layers=sm.num_layers, fingerprint=sm.fingerprint, source=path)
    if on_stage:
        on_stage(f"calibrating: {len(prompts)} prompts x {max_new_tokens} tokens")
    cal = calibrate(sm, [encode_prompt(sm.tokenizer, p) for p in prompts], max_new_tokens=max_new_tokens)
    report = plan_model(sm, cal, med.draft, sml.draft, dataset=dataset, seed=seed, max_m=max_m, max_n=max_n,
                        run_validation=run_validation, repeats=repeats, on_stage=on_stage)
    return report, sm


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


def build_profile(rep: PlanReport, sm: SkippableModel, h: Hierarchy) -> Profile:
    """A ``method: hierarchical`` profile for ``h``, with what was predicted and measured for it."""
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
        baseline="skipsearch autoregressive, same process, interleaved" if val else "planner prediction",
        device=rep.device, dataset=rep.dataset, n_prompts=rep.n_prompts, max_new_tokens=rep.max_new_tokens,
        seed=rep.seed, source="plan", notes=notes, extra=extra,
    )
    return Profile(
        model=ModelRef(sm.name, sm.num_layers, sm.dtype_name, sm.fingerprint), method="hierarchical",
        draft=draft, measured=measured, environment=Environment.current(rep.device),
        search=SearchInfo(strategy="plan", objective="hierarchical planner" + (" + timed" if val else ""),
                          seed=rep.seed),
        method_params=params,
    )
