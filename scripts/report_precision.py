"""Precision drafts on this machine: for each scheme, its weight bytes, its measured c, its α, and what it buys.

    PYTHONPATH=. .venv/bin/python scripts/report_precision.py --schemes fp16,int8,int4 --n-prompts 8 \\
        --max-new-tokens 64 --timed fp16 --out studies/precision-smollm2-cpu.md       # the report (a quiet machine)
    PYTHONPATH=. .venv/bin/python scripts/report_precision.py --schemes fp16 --n-prompts 1 --max-new-tokens 8 \\
        --timed "" --out /tmp/precision-smoke.md                              # a smoke run

For each scheme, on held-out prompts (the mtbench,humaneval heldout split), with every sublayer and the head in
the scheme (K = 6, no draft exit):
- bytes: the quantized copy's weight bytes over the same sublayers' and head's bytes in the model's dtype;
- c: one draft step over one full step, per-sublayer scheme costs timed in the same rounds as the full step by
  the one harness (``methods.precision``'s surrogate: medians of interleaved samples), with the quantized
  head and with the full head; c / bytes is the draft's overhead over its byte ratio;
- α: the share of positions where the draft's argmax is the full model's next token, teacher-forced over the
  full model's greedy continuations (the surrogate's traces), and the replayed τ at K = 6;
- for the ``--timed`` schemes: the decoded speedup over our autoregressive loop, interleaved, outputs checked
  (``objective.time_drafter``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

from _common import script_model

from skipsearch import hardware
from skipsearch.config import NO_EXIT, Candidate, DraftConfig
from skipsearch.engine.calibration import calibrate_on
from skipsearch.methods.precision import METHOD as PRECISION
from skipsearch.methods.precision import SCHEMES, PrecisionParams, traces_and_ratio
from skipsearch.search.objective import ModelObjective


@dataclass(frozen=True)
class Row:
    scheme: str
    kernel: str
    bytes_ratio: float  # copy bytes / the same weights in the model's dtype
    c: float  # quantized head
    c_full_head: float
    alpha: float
    tau_k6: float  # replayed
    predicted: float  # surrogate speedup at K = 6
    timed: float | None = None
    timed_acceptance: float | None = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--schemes", default="fp16,int8,int4")
    ap.add_argument("--dataset", default="mtbench,humaneval")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--timed", default="fp16", help="schemes to decode and time (comma-separated; '' for none)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    schemes = [s for s in args.schemes.split(",") if s]
    timed = {s for s in args.timed.split(",") if s}
    sm = script_model(args.model, threads=args.threads, device="cpu", dtype="float32")
    objective = ModelObjective(sm, calibrate_on(sm, dataset=args.dataset, n_prompts=args.n_prompts,
                                                max_new_tokens=args.max_new_tokens, split="heldout"))
    from skipsearch.methods.precision.copy import quantized_copy  # the copy's byte count

    rows = []
    for scheme in schemes:
        print(f"[precision] {scheme}", file=sys.stderr, flush=True)
        q = quantized_copy(sm, scheme)
        draft = DraftConfig(max_draft_tokens=6, exit=NO_EXIT)
        cand = Candidate(PRECISION.name, draft, PrecisionParams(scheme=scheme).to_pairs())
        cand_full_head = Candidate(PRECISION.name, draft, PrecisionParams(scheme=scheme, quant_head=False).to_pairs())
        _, c = traces_and_ratio(objective, cand)
        _, c_full_head = traces_and_ratio(objective, cand_full_head)
        m = objective.predict(cand)
        t = objective.time(cand) if scheme in timed else None
        rows.append(Row(scheme, SCHEMES[scheme].kernel["cpu"], q.bytes / q.full_bytes, c, c_full_head, m.alpha,
                        m.tau, m.speedup, t.speedup if t else None, t.acceptance_rate if t else None))
    here = hardware.probe("cpu")
    cmd = "PYTHONPATH=. .venv/bin/python scripts/report_precision.py " + " ".join(
        f"--{k.replace('_', '-')} {v if v else chr(34) * 2}" for k, v in vars(args).items())
    lines = [f"# Precision drafts on {here.describe()}, {args.model} in float32", "", "```bash", cmd, "```", "",
             f"{date.today()}; {len(objective.cal.prompts)} held-out prompts ({args.dataset}, heldout split) x "
             f"{args.max_new_tokens} tokens; every sublayer and the LM head in the scheme, K = 6, no draft exit.", "",
             "| scheme | kernel | weight bytes ratio | c | c / bytes | c (full head) | α | τ at K=6 (replayed) "
             "| predicted | timed vs our AR loop | acceptance (timed) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        timed_cells = (f"{r.timed:.2f}x | {r.timed_acceptance:.3f}" if r.timed is not None else "- | -")
        lines.append(f"| {r.scheme} | {r.kernel} | {r.bytes_ratio:.3f} | {r.c:.3f} | {r.c / r.bytes_ratio:.2f} | "
                     f"{r.c_full_head:.3f} | {r.alpha:.4f} | {r.tau_k6:.2f} | {r.predicted:.2f}x | {timed_cells} |")
    costs = objective.costs
    lines += ["", f"Full step {costs.step_seconds * 1e3:.1f} ms (median); v(k) for k = 1..{len(costs.verify_ratio)}: "
              + ", ".join(f"{v:.2f}" for v in costs.verify_ratio) + "."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        {"hardware": here.describe(), "rows": [asdict(r) for r in rows], "verify_ratio": list(costs.verify_ratio),
         "step_seconds": costs.step_seconds}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
