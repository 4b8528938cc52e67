"""Portability report: the goals of "search once, deploy anywhere" (issue 15), measured in one process.

1. Portability. A CPU study's configs are re-ranked under a cost file (``optimize --budget 0 --costs``'s
   library call: traced here, replayed under the file's costs, no new trials). The goal: the re-ranked
   prediction orders the study's timed shortlist as its timed speedups do, Spearman's ρ >= 0.9. With
   ``--retime`` the shortlist is also timed again here, in this run, through the one harness, and with
   ``--time-top N`` the N best re-ranked configs the study never timed join it (a larger sample).
2. Hierarchical. ``plan hierarchical --study``'s library call chooses M_q and M_s from the study's α/c front, plans
   (m, n) and validates its best shapes with the timed decoder; the hand-picked pair (``--medium``/``--small``) is
   planned and validated in the same process. The goals: the study's pick measures at least as fast as the
   hand-picked pair, and its predicted and measured speedups agree within ±10%.

Run it on a quiet machine (it times decoding), with the settings the study was searched with:

    OMP_NUM_THREADS=1 python scripts/report_portability.py --study studies/smollm2-135m-tpe \\
        --costs costs/cpu-float32.yaml --dataset mtbench,humaneval --n-prompts 8 --max-new-tokens 64 \\
        --threads 1 --retime --time-top 5 --out studies/portability-smollm2-cpu.md

Check it on tiny settings first: ``--n-prompts 1 --max-new-tokens 8 --max-m 2 --max-n 1 --out /tmp/p.md``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from _common import script_model

from skipsearch.api.planning import plan_from_study
from skipsearch.engine.calibration import calibrate_on
from skipsearch.engine.measuring import check_costs_for
from skipsearch.files.cost_profile import load_costs
from skipsearch.methods.hierarchical import planner
from skipsearch.profile import load_profile
from skipsearch.search import replan as device_replan
from skipsearch.search.optimize import config_summary
from skipsearch.search.study import load_records

GOAL_RHO = 0.9
GOAL_AGREEMENT = 0.10


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's ρ: Pearson's correlation of the ranks, ties given their mean rank."""
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for t in range(i, j + 1):
                out[order[t]] = (i + j) / 2
            i = j + 1
        return out

    if len(xs) != len(ys) or len(xs) < 2:
        return float("nan")
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    norm = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / norm if norm else float("nan")


def portability(sm, cal, records, args) -> tuple[list[str], dict]:
    target = load_costs(args.costs)
    check_costs_for(target, sm, source=args.costs)
    rr = device_replan.rerank_study(sm, cal, records, target, costs_source=args.costs, shortlist=args.shortlist)
    shortlist = [r for r in rr.rows if r.study_timed is not None]
    extra = [r for r in rr.rows if r.study_timed is None][: args.time_top]  # the best re-ranked, not timed yet
    rows = (device_replan.time_rows(sm, cal, shortlist + extra, repeats=args.repeats) if args.retime or extra
            else tuple(shortlist))
    timed_here = args.retime or bool(extra)
    in_study = [r for r in rows if r.study_timed is not None]
    rho_study = rank_correlation([r.predicted.speedup for r in in_study], [r.study_timed for r in in_study])
    rho_here = (rank_correlation([r.predicted.speedup for r in rows], [r.timed.speedup for r in rows])
                if timed_here else None)
    lines = [f"## 1. Portability: the study re-ranked under `{args.costs}`", "",
             f"{len(rr.rows)} configs re-ranked ({rr.skipped} trials of other methods left out); the study timed "
             f"{len(in_study)} of them" + (f"; {len(extra)} more of the best re-ranked are timed here" if extra
                                           else "") + ".", "",
             "| predicted (cost file) | study's own prediction | timed in the study | " +
             ("timed here | " if timed_here else "") + "config |",
             "|---:|---:|---:|" + ("---:|" if timed_here else "") + "---|"]
    for r in sorted(rows, key=lambda r: -r.predicted.speedup):
        here = f" {r.timed.speedup:.3f}x |" if timed_here else ""
        study = f"{r.study_timed:.3f}x" if r.study_timed is not None else "-"
        own = f"{r.study_predicted:.3f}x" if r.study_predicted is not None else "- (re-planned)"
        lines.append(f"| {r.predicted.speedup:.3f}x | {own} | {study} |{here} "
                     f"{config_summary(r.config)} |")
    verdict = lambda rho: "n/a (fewer than 2 timed configs)" if rho != rho else (  # noqa: E731
        f"{rho:.3f}: {'meets' if rho >= GOAL_RHO else 'misses'} the goal (>= {GOAL_RHO})")
    lines += ["", f"- Spearman's ρ, predicted against the study's timed speedups: {verdict(rho_study)}"]
    if timed_here:
        lines.append(f"- Spearman's ρ, predicted against the speedups timed in this run: {verdict(rho_here)}")
    data = {"rho_study": rho_study, "rho_here": rho_here,
            "rows": [{"config": config_summary(r.config), "predicted": r.predicted.speedup,
                      "study_predicted": r.study_predicted, "study_timed": r.study_timed,
                      "timed_here": r.timed.speedup if r.timed else None} for r in rows]}
    return lines, data


def hierarchical(sm, cal, records, label: str, args) -> tuple[list[str], dict]:
    costs = load_costs(args.costs).cost_model() if args.plan_with_costs else None
    sp = plan_from_study(sm, cal, records, study=label, dataset=args.dataset, costs=costs, seed=args.seed,
                         max_m=args.max_m, max_n=args.max_n, run_validation=True, repeats=args.repeats)
    med, sml = load_profile(args.medium), load_profile(args.small)
    hand = planner.plan_model(sm, cal, med.draft, sml.draft, dataset=args.dataset, seed=args.seed,
                              max_m=args.max_m, max_n=args.max_n, run_validation=True, repeats=args.repeats)
    pick_best = max(sp.report.validation, key=lambda v: v.measured_speedup)
    hand_best = max(hand.validation, key=lambda v: v.measured_speedup)
    errors = [abs(v.predicted_speedup - v.measured_speedup) / v.measured_speedup for v in sp.report.validation]
    lines = ["## 2. Hierarchical: `plan hierarchical --study` against the hand-picked pair", "",
             planner.render_study_markdown(sp, num_layers=sm.num_layers), "",
             "### The hand-picked pair, in the same process", "", planner.format_validation(hand.validation), "",
             f"- best measured: study's pick {pick_best.measured_speedup:.3f}x (m={pick_best.m}, n={pick_best.n}) "
             f"against hand-picked {hand_best.measured_speedup:.3f}x (m={hand_best.m}, n={hand_best.n}): "
             + ("meets" if pick_best.measured_speedup >= hand_best.measured_speedup else "misses")
             + " the goal (at least as good)",
             f"- predicted against measured, study's pick: largest error {max(errors):.1%}: "
             + ("meets" if max(errors) <= GOAL_AGREEMENT else "misses") + f" the goal (within ±{GOAL_AGREEMENT:.0%})"]
    data = {"pick": [asdict(v) for v in sp.report.validation], "hand": [asdict(v) for v in hand.validation],
            "medium": asdict(sp.report.medium), "small": asdict(sp.report.small)}
    return lines, data


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", default="studies/smollm2-135m-tpe")
    ap.add_argument("--costs", default="costs/cpu-float32.yaml")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="mtbench,humaneval")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shortlist", type=int, default=5, help="skip sets whose K and exit rule are re-planned")
    ap.add_argument("--retime", action="store_true", help="time the study's shortlist again in this run")
    ap.add_argument("--time-top", type=int, default=0,
                    help="also time the N best re-ranked configs the study did not time (a larger sample for ρ)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--medium", default="profiles/smollm2-135m/hier-medium.yaml")
    ap.add_argument("--small", default="profiles/smollm2-135m/hier-small.yaml")
    ap.add_argument("--max-m", type=int, default=8)
    ap.add_argument("--max-n", type=int, default=4)
    ap.add_argument("--plan-with-costs", action="store_true", help="the front's c from --costs (else timed here)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip", choices=("portability", "hierarchical"), default=None)
    ap.add_argument("--out", default="studies/portability-smollm2-cpu.md")
    args = ap.parse_args(argv)
    label, records = load_records(study_dir=args.study)
    sm = script_model(args.model, threads=args.threads, device="cpu", dtype="float32")
    cal = calibrate_on(sm, dataset=args.dataset, n_prompts=args.n_prompts, max_new_tokens=args.max_new_tokens,
                       seed=args.seed)
    command = shlex.join(["python", "scripts/report_portability.py", *(argv if argv is not None else sys.argv[1:])])
    out = [f"# Search once, deploy anywhere: {sm.name} on cpu", "", "```", command, "```", "",
           f"Study {label}; {len(cal.prompts)} calibration prompts of {args.dataset} x {args.max_new_tokens} tokens; "
           f"{torch.get_num_threads()} torch thread(s).", ""]
    data: dict = {"command": command}
    if args.skip != "portability":
        lines, data["portability"] = portability(sm, cal, records, args)
        out += [*lines, ""]
    if args.skip != "hierarchical":
        lines, data["hierarchical"] = hierarchical(sm, cal, records, label, args)
        out += [*lines, ""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(out))
    Path(args.out).with_suffix(".json").write_text(json.dumps(data, indent=1, default=str))
    print("\n".join(out))
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.json')}")


if __name__ == "__main__":
    main()
