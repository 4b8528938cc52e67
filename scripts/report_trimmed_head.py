"""Measure FR-Spec's trimmed draft head on the best layer-skip drafts: c and α with and without it.

    PYTHONPATH=. .venv/bin/python scripts/report_trimmed_head.py --study studies/smollm2-135m-tpe \\
        --vocab-sizes 16384,8192,4096 --out studies/trimmed-head-smollm2-cpu.md     # the report (a quiet machine)
    PYTHONPATH=. .venv/bin/python scripts/report_trimmed_head.py --n-prompts 1 --heldout 1 --max-new-tokens 8 \\
        --vocab-sizes 8192 --drafts 1 --timed 0 --rounds 3 --out /tmp/trimmed-smoke.md   # a smoke run

For each draft (the best layer-skip candidates of ``--study``, the drafts of ``--profile`` files, else the
search space's probe points) and each V' (the full head first):
- c measured: one draft step (its skips, and the head) over one full step, all timed in the same rounds by
  the one harness (``harness.time_interleaved``: warm-up, rotated order, medians); the cut is
  1 - c(V') / c(full head);
- c of the cost model: what the search charges that draft (``layer_skip.surrogate.draft_costs``);
- α on the calibration prompts (where the subset's frequencies come from) and on held-out prompts: the
  share of positions where the draft's argmax is the full model's token (the surrogate's traces);
- the surrogate's predicted speedup, and for the ``--timed`` best drafts the timed speedup and acceptance
  (decoded against the autoregressive baseline, interleaved, outputs checked: ``objective.time_drafter``).
The subset is ``layer_skip.frequent_tokens`` of the calibration prompts and their greedy continuations,
as the hybrid search builds it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import torch
from _common import ints_or_exit, script_model

from skipsearch.config import Candidate, DraftConfig
from skipsearch.engine.calibration import calibrate_on
from skipsearch.engine.harness import time_interleaved
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.layer_skip import LayerSkipParams, frequent_tokens
from skipsearch.methods.layer_skip.surrogate import draft_costs, draft_traces
from skipsearch.profile import load_profile
from skipsearch.search.objective import ModelObjective
from skipsearch.search.optimize import config_summary
from skipsearch.search.space import SearchSpace
from skipsearch.search.study import load_records

GOAL_CUT = 0.15  # issue 12: the trimmed head cuts c of the best layer-skip draft by at least 15%


@dataclass(frozen=True)
class Row:
    draft: str
    vocab: int  # V'; the full vocabulary for the full head
    c: float  # measured: draft step / full step
    c_cut: float  # 1 - c / c(full head) of the same draft
    c_model: float  # the cost model's c for the draft (with the head's measured saving)
    alpha: float  # calibration prompts
    alpha_heldout: float | None
    predicted: float  # surrogate speedup
    timed: float | None = None
    acceptance: float | None = None


def best_drafts(args, space: SearchSpace) -> list[DraftConfig]:
    """The study's best layer-skip drafts (timed before surrogate, then by speedup), the profiles' drafts,
    or else the space's probe points; only drafts that skip something."""
    found: list[DraftConfig] = []
    if args.study:
        _, recs = load_records(study_dir=args.study)
        ranked = sorted((r for r in recs if r.candidate is not None and r.measurement is not None
                         and r.candidate.method == LAYER_SKIP.name),
                        key=lambda r: (r.measurement.kind == "timed", r.measurement.speedup), reverse=True)
        found += [r.candidate.draft for r in ranked]
    found += [load_profile(p, num_layers=space.num_layers).draft for p in args.profile or ()]
    found = [d for d in found if (d.skip_attn or d.skip_mlp) and d.max_draft_tokens]
    if not found:
        found = space.probe_configs()
    unique: list[DraftConfig] = []
    for d in found:
        if d not in unique:
            unique.append(d)
    return unique[: args.drafts]


def measure_c(sm, context: list[int], drafts: list[DraftConfig], heads: list, *, rounds: int) -> dict:
    """c for every (draft, head): its one-token draft step over the full model's, medians of interleaved rounds."""
    cache = sm.new_cache()
    sm.forward(torch.tensor(context), start=0, cache=cache)
    n, token = len(context), torch.tensor([context[-1]])

    def step(config: DraftConfig | None, head):
        def once():  # as LayerSkipDrafter runs it: last-position logits only
            with sm.drafting(config or DraftConfig()), sm.draft_head(head):
                sm.forward(token, start=n, cache=cache, last_only=True)
            sm.crop(cache, n)
        return once

    from skipsearch.methods.layer_skip.drafter import subset_head

    calls = {"full": step(None, None)}
    for i, d in enumerate(drafts):
        for j, h in enumerate(heads):
            calls[f"{i} {j}"] = step(d, subset_head(sm, h))
    med = {k: t.median for k, t in time_interleaved(calls, rounds=rounds, device=sm.device, warmup=3).items()}
    return {(i, j): med[f"{i} {j}"] / med["full"] for i in range(len(drafts)) for j in range(len(heads))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--dataset", default="mtbench,humaneval")
    ap.add_argument("--n-prompts", type=int, default=8, help="calibration prompts (calib split)")
    ap.add_argument("--heldout", type=int, default=8, help="held-out prompts (heldout split) for α; 0: none")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--vocab-sizes", default="16384,8192,4096")
    ap.add_argument("--study", help="a layer-skip study directory: its best drafts are measured")
    ap.add_argument("--profile", action="append", help="a profile whose draft is measured (repeatable)")
    ap.add_argument("--drafts", type=int, default=3, help="how many drafts")
    ap.add_argument("--timed", type=int, default=1, help="time decoding for the best N drafts (0: none)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of the c timing")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per prompt (median)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="studies/trimmed-head-smollm2-cpu.md")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    sizes = ints_or_exit(args.vocab_sizes, "--vocab-sizes")
    sm = script_model(args.model, threads=args.threads, device=args.device, dtype=args.dtype)
    vocab = sm.lm_head.weight.shape[0]
    calibration = dict(dataset=args.dataset, max_new_tokens=args.max_new_tokens, seed=args.seed)
    cal = calibrate_on(sm, n_prompts=args.n_prompts, **calibration)
    objective = ModelObjective(sm, cal, repeats=args.repeats)
    heldout = (ModelObjective(sm, calibrate_on(sm, n_prompts=args.heldout, split="heldout", **calibration))
               if args.heldout else None)
    data = [*cal.prompts, *cal.continuations]
    heads = [LayerSkipParams(), *(LayerSkipParams.trimmed(frequent_tokens(data, v, vocab)) for v in sizes if v < vocab)]
    drafts = best_drafts(args, SearchSpace(num_layers=sm.num_layers))
    print(f"{len(drafts)} drafts x {len(heads)} heads; timing c ...", file=sys.stderr)
    context = list(cal.prompts[0] + cal.continuations[0][: args.max_new_tokens // 2])
    c = measure_c(sm, context, drafts, heads, rounds=args.rounds)

    def alpha(obj, draft, head) -> float:
        matches = [m for tr in draft_traces(obj, draft, head) for m in tr.matches]
        return sum(matches) / len(matches) if matches else 0.0

    rows: list[Row] = []
    for i, draft in enumerate(drafts):
        for j, head in enumerate(heads):
            candidate = Candidate(LAYER_SKIP.name, draft, head.to_pairs())
            print(f"  {config_summary(draft)}  V' {head.vocab_subset or vocab}", file=sys.stderr)
            predicted = objective.evaluate(candidate, kind="surrogate")
            timed = objective.evaluate(candidate, kind="timed") if i < args.timed else None
            rows.append(Row(
                draft=config_summary(draft), vocab=head.vocab_subset or vocab, c=c[i, j], c_cut=1 - c[i, j] / c[i, 0],
                c_model=draft_costs(objective, head).draft_ratio(draft), alpha=alpha(objective, draft, head),
                alpha_heldout=alpha(heldout, draft, head) if heldout is not None else None,
                predicted=predicted.speedup, timed=timed.speedup if timed else None,
                acceptance=timed.acceptance_rate if timed else None,
            ))
    text = report(rows, args, sm, vocab, len(data))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(text)
    return 0


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(rows: list[Row], args, sm, vocab: int, sequences: int) -> str:
    command = "PYTHONPATH=. .venv/bin/python scripts/report_trimmed_head.py " + " ".join(sys.argv[1:])
    lines = [
        "# Trimmed draft head (FR-Spec) on the best layer-skip drafts", "",
        f"`{command}`", "",
        f"{date.today()}, {sm.name} ({sm.dtype_name}) on {sm.device} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads); vocabulary {vocab}; subsets ranked by frequency in {sequences} "
        f"calibration sequences ({args.dataset}, {args.n_prompts} prompts and their {args.max_new_tokens}-token greedy "
        "continuations), ties by token id.", "",
        "c: one draft step over one full step, measured in the same interleaved rounds (medians); cut: against the "
        "same draft with the full head. α: the draft's argmax equals the full model's token, calibration prompts / "
        "held-out prompts. predicted: the surrogate's speedup; timed: decoding against plain decoding, same process.",
        "",
        "| draft | V' | c | c cut | c (cost model) | α calib | α held-out | predicted | timed | acceptance |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.draft} | {r.vocab} | {_f(r.c)} | {r.c_cut:.1%} | {_f(r.c_model)} | {_f(r.alpha)} | "
                     f"{_f(r.alpha_heldout)} | {_f(r.predicted)}x | {_f(r.timed)}{'x' if r.timed else ''} | "
                     f"{_f(r.acceptance)} |")
    best = [r for r in rows if r.draft == rows[0].draft]
    hit = [r for r in best[1:] if r.c_cut >= GOAL_CUT]
    lines.append("")
    if hit:
        r = max(hit, key=lambda r: r.vocab)
        lines.append(f"**Goal met** for the best draft ({r.draft}): V' = {r.vocab} cuts c from {best[0].c:.3f} to "
                     f"{r.c:.3f} ({r.c_cut:.1%} >= {GOAL_CUT:.0%}); α {best[0].alpha:.3f} -> {r.alpha:.3f} "
                     f"(held-out {_f(best[0].alpha_heldout)} -> {_f(r.alpha_heldout)}).")
    elif len(best) > 1:
        r = max(best[1:], key=lambda r: r.c_cut)
        lines.append(f"**Goal missed** for the best draft ({r.draft}): the largest cut is {r.c_cut:.1%} at V' = "
                     f"{r.vocab} (c {best[0].c:.3f} -> {r.c:.3f}); the LM head is only part of the draft step.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
