"""The search benchmark of issue #3: tpe and bayes, at several budgets, with and without the surrogate.

Writes a Markdown report (and JSON beside it). One model load and one calibration set serve every
run, so the figures compare strategies, not machine states. Per strategy and mode there is ONE
seeded study, grown budget by budget: a sampler's proposals depend on the history and the seed,
never on the budget, so the study after N trials is exactly what a fresh run with budget N gives.

  two-stage: surrogate search to N trials, then the top --shortlist configs timed; the figure is
             the best timed speedup (each config is timed once and remembered across budgets);
  timed:     every trial timed (Draft&Verify's setting); the figure is the best trial.

Wall time counts the search and the timing of that budget's shortlist, not the shared calibration.
Finally the best timed config overall is decoded on held-out prompts against HF greedy and our
autoregressive path, by the one harness (skipsearch.engine.harness.run_rounds: warm-up, rotated rounds, HF
greedy in the same rounds), with the identical-output check.

  .venv/bin/python scripts/search_benchmark.py --budgets 25,50,100,200 --timed-budgets 25,50 \
      --report studies/search-smollm2-cpu.md
  .venv/bin/python scripts/search_benchmark.py --strategies tpe --budgets 2 --timed-budgets "" --n-prompts 1 \
      --max-new-tokens 8 --shortlist 1 --heldout-prompts 1 --heldout-tokens 8 --report /tmp/sb.md   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict
from pathlib import Path

import optuna
import torch
from _common import prompt_ids, script_model

from skipsearch import methods as draft_methods
from skipsearch.bench import BASELINE, peer_method
from skipsearch.config import AUTOREGRESSIVE
from skipsearch.engine import timing
from skipsearch.engine.calibration import calibrate_on
from skipsearch.engine.harness import check_outputs, engine_method, first_outputs, method_seconds, run_rounds
from skipsearch.measure import Measurement
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.profile import Environment
from skipsearch.search.objective import ModelObjective
from skipsearch.search.optimize import candidate_summary
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies import make_strategy
from skipsearch.search.study import open_study, run_search, shortlist, trial_candidate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="mtbench,humaneval")
    ap.add_argument("--n-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--budgets", default="25,50,100,200")
    ap.add_argument("--timed-budgets", default="25,50")
    ap.add_argument("--strategies", default="tpe,bayes")
    ap.add_argument("--shortlist", type=int, default=5)
    ap.add_argument("--heldout-prompts", type=int, default=8)
    ap.add_argument("--heldout-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--report", default="studies/search-smollm2-cpu.md")
    a = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t_all = timing.now()

    sm = script_model(a.model, threads=a.threads)
    cal = calibrate_on(sm, dataset=a.dataset, n_prompts=a.n_prompts, max_new_tokens=a.max_new_tokens, seed=a.seed)
    objective = ModelObjective(sm, cal)
    costs = objective.costs
    space = SearchSpace(num_layers=sm.num_layers)
    timed_cache: dict = {}  # candidate -> timed Measurement, shared by every run (the same objective)

    def timed(candidate):
        if candidate not in timed_cache:
            timed_cache[candidate] = objective.evaluate(candidate, kind="timed")
        return timed_cache[candidate]

    rows = []
    for name in a.strategies.split(","):
        for mode, budgets in (("two-stage", a.budgets), ("timed", a.timed_budgets)):
            if not budgets:
                continue
            strategy = make_strategy(name, space, seed=a.seed)
            study = open_study(strategy=strategy)  # in memory
            wall = 0.0
            for budget in sorted(int(b) for b in budgets.split(",")):
                t0 = timing.now()
                kind = "timed" if mode == "timed" else "surrogate"
                run_search(study, strategy, objective, budget=budget, kind=kind)
                if mode == "two-stage":
                    tried = [(c, timed(c)) for c in shortlist(study, a.shortlist)]
                    config, m = max(tried, key=lambda cm: cm[1].speedup)
                else:
                    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
                        timed_cache.setdefault(trial_candidate(t), Measurement.from_dict(t.user_attrs["measurement"]))
                    best_trial = study.best_trial
                    config = trial_candidate(best_trial)
                    m = Measurement.from_dict(best_trial.user_attrs["measurement"])
                wall += timing.now() - t0
                rows.append(dict(strategy=name, mode=mode, budget=budget, speedup=m.speedup,
                                 predicted=m.predicted_speedup, tau=m.tau, acceptance=m.acceptance_rate,
                                 wall_s=wall, config=candidate_summary(config)))
                print(json.dumps(rows[-1]), flush=True)

    every_timed = sorted(timed_cache.items(), key=lambda cm: -cm[1].speedup)
    pred_err = [abs(m.predicted_speedup - m.speedup) / m.speedup for _, m in every_timed]
    plain = LAYER_SKIP.candidate(AUTOREGRESSIVE)  # plain decoding
    best_config, best_m = every_timed[0] if every_timed else (plain, None)
    ship = best_config if best_m is not None and best_m.speedup > 1.0 else plain
    heldout = heldout_check(sm, ship, best_config, a)
    report = dict(
        model=a.model, device=str(sm.device), torch_threads=torch.get_num_threads(),
        environment=asdict(Environment.current(str(sm.device))), dataset=a.dataset, n_prompts=a.n_prompts,
        max_new_tokens=a.max_new_tokens, seed=a.seed, costs=dict(step_ms=costs.step_seconds * 1e3,
        verify_ratio=[round(v, 3) for v in costs.verify_ratio]),
        rows=rows, timed=[dict(config=candidate_summary(c), speedup=m.speedup, predicted=m.predicted_speedup,
                               tau=m.tau, acceptance=m.acceptance_rate, alpha=m.alpha, c=m.cost_ratio)
                          for c, m in every_timed],
        prediction_error=dict(median=statistics.median(pred_err) if pred_err else None,
                              within_10pct=sum(e <= 0.10 for e in pred_err), n=len(pred_err)),
        heldout=heldout, total_seconds=timing.now() - t_all,
    )
    out = Path(a.report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.write_text(render(report, a))
    print(f"wrote {out} and {out.with_suffix('.json')}")


def heldout_check(sm, ship, best_config, a) -> dict:
    """HF greedy vs our autoregressive path vs the shipped config and the best draft, by the one harness."""
    ids = prompt_ids(sm, a.dataset, split="heldout", n=a.heldout_prompts, seed=a.seed)
    n = a.heldout_tokens
    plain = LAYER_SKIP.candidate(AUTOREGRESSIVE)  # plain decoding
    configs = {"ours-autoregressive": plain, "shipped": ship, "best-draft": best_config}
    methods = [peer_method(sm, BASELINE), *(engine_method(sm, k, lambda _ids, c=c: draft_methods.build_drafter(c, sm))
                                            for k, c in configs.items())]
    runs = run_rounds(methods, ids, max_new_tokens=n, device=sm.device, warmup_tokens=8, reference=BASELINE)
    seconds = method_seconds(runs)
    checks = check_outputs(runs, reference=BASELINE)
    tokens = {m.name: sum(len(o.token_ids) for o in first_outputs(runs, m.name)) for m in methods}
    base = tokens[BASELINE] / seconds[BASELINE]
    out = {}
    for m in methods:
        rate = tokens[m.name] / seconds[m.name]
        config = configs.get(m.name)
        out[m.name] = dict(tokens_per_s=rate, speedup_vs_hf=rate / base,
                           identical=f"{checks[m.name].identical}/{len(ids)}",
                           config=candidate_summary(config) if config is not None else "HF generate greedy")
    return out | {"prompts": len(ids), "max_new_tokens": n}


def render(r: dict, a) -> str:
    lines = [
        f"# Search benchmark: {r['model']} on {r['environment'].get('device_name') or r['device']}",
        "",
        f"Command: `.venv/bin/python scripts/search_benchmark.py --budgets {a.budgets} --timed-budgets "
        f"{a.timed_budgets} --n-prompts {a.n_prompts} --max-new-tokens {a.max_new_tokens} --report {a.report}`",
        "",
        f"Calibration: {r['n_prompts']} prompts of `{r['dataset']}` (calib split), {r['max_new_tokens']} tokens each, "
        f"seed {r['seed']}; torch threads {r['torch_threads']}; one AR step {r['costs']['step_ms']:.1f} ms; "
        f"v(k) = {r['costs']['verify_ratio']}. Speedups are timed against our autoregressive path, interleaved "
        f"in this process. Total run {r['total_seconds'] / 60:.1f} min.",
        "",
        "| strategy | objective | budget | best timed speedup | predicted | τ | acceptance | wall (s) | config |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        acc = "-" if row["acceptance"] is None else f"{row['acceptance']:.2f}"
        lines.append(f"| {row['strategy']} | {row['mode']} | {row['budget']} | {row['speedup']:.3f}x | "
                     f"{row['predicted'] or 0:.3f}x | {row['tau'] or 0:.2f} | {acc} | {row['wall_s']:.0f} | "
                     f"{row['config']} |")
    pe = r["prediction_error"]
    lines += ["", "## Cost model against the timer", "",
              f"{pe['within_10pct']}/{pe['n']} timed configs within ±10% of their prediction; median relative "
              f"error {pe['median'] if pe['median'] is None else round(pe['median'] * 100, 1)}%.", "",
              "| config | timed | predicted | τ | acceptance | α | c |", "|---|---|---|---|---|---|---|"]
    for t in r["timed"]:
        lines.append(f"| {t['config']} | {t['speedup']:.3f}x | {t['predicted']:.3f}x | {t['tau'] or 0:.2f} | "
                     f"{t['acceptance'] if t['acceptance'] is None else round(t['acceptance'], 2)} | "
                     f"{t['alpha'] if t['alpha'] is None else round(t['alpha'], 2)} | {t['c'] or 0:.2f} |")
    h = r["heldout"]
    lines += ["", f"## Held-out prompts against HF greedy ({h['prompts']} prompts, {h['max_new_tokens']} tokens, "
              "interleaved)", "", "| method | tokens/s | speedup vs HF greedy | identical | config |",
              "|---|---|---|---|---|"]
    for k, v in h.items():
        if isinstance(v, dict):
            lines.append(f"| {k} | {v['tokens_per_s']:.1f} | {v['speedup_vs_hf']:.3f}x | {v['identical']} | "
                         f"{v['config']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
