"""The roofline's CPU check: a roofline cost file of this CPU (``skipsearch costs --roofline cpu``: its bandwidth,
matrix throughput and launch cost probed) against a cost file measured here (``skipsearch costs``), piece by
piece, and the plans each makes for the shipped profiles. It times nothing itself: the two files carry the
figures. Make both on a quiet machine, at one thread and the same context, then compare:

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/skipsearch costs --model smollm2-135m --device cpu --dtype float32 \\
        --threads 1 --schemes fp16,int8,int8-dynamic --out costs/cpu-float32.yaml --force
    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/skipsearch costs --roofline cpu --model smollm2-135m --threads 1 \\
        --context-tokens <run.context_tokens of the file above> --out costs/roofline-cpu-float32.yaml --force
    .venv/bin/python scripts/roofline_cpu_check.py --measured costs/cpu-float32.yaml \\
        --roofline costs/roofline-cpu-float32.yaml --out studies/roofline-cpu-check.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from skipsearch.config import DraftConfig  # noqa: E402
from skipsearch.files.cost_profile import CostProfile, load_costs  # noqa: E402
from skipsearch.files.errors import ProfileError  # noqa: E402

PROFILES = ROOT / "profiles" / "smollm2-135m"
RECORDED = ("cpu-float32-tpe.yaml", "cpu-float32-clasp.yaml", "cpu-float32-code.yaml", "cpu-float32-chat.yaml",
            "cpu-float32-precision-code.yaml", "cpu-float32-fractal.yaml")  # they keep what re-planning needs
DRAFTS = {"skips nothing": DraftConfig(), "8 attention": DraftConfig(skip_attn=tuple(range(4, 12))),
          "8 attention + 8 MLP": DraftConfig(skip_attn=tuple(range(4, 12)), skip_mlp=tuple(range(12, 20))),
          "half the sublayers": DraftConfig(skip_attn=tuple(range(1, 29, 2)), skip_mlp=tuple(range(2, 30, 2)))}


def _ratio(model: float, measured: float) -> str:
    return f"{model / measured:.2f}" if measured else "-"


def compare(measured: CostProfile, roof: CostProfile, *, command: str) -> str:
    """The report: pieces, v(k), draft ratios c and the schemes' whole-model ratios, then the shipped profiles
    re-planned under each file."""
    from skipsearch.profile import load_profile
    from skipsearch.search import replan as device_replan

    m, r, L = measured.costs, roof.costs, measured.model.num_layers
    out = ["# The roofline on this CPU against a measured cost file\n", f"```\n{command}\n```\n",
           f"Measured: {measured.environment.cpu_model if measured.environment else '?'}, "
           f"{measured.run.threads if measured.run else '?'} thread(s), context {measured.run.context_tokens}. "
           f"Roofline: {roof.roofline.describe()}, context {roof.run.context_tokens}.\n",
           "| piece | measured ms | roofline ms | roofline / measured |", "|---|---:|---:|---:|"]
    pieces = (("one step", m.step_seconds, r.step_seconds), (f"attention x {L}", L * m.attn_seconds,
              L * r.attn_seconds), (f"MLP x {L}", L * m.mlp_seconds, L * r.mlp_seconds),
              ("LM head", m.lm_head_seconds or 0.0, r.lm_head_seconds or 0.0),
              ("fixed (head, embedding, overhead)", m.fixed_seconds, r.fixed_seconds))
    out += [f"| {name} | {a * 1e3:.3f} | {b * 1e3:.3f} | {_ratio(b, a)} |" for name, a, b in pieces]
    n = min(len(m.verify_ratio), len(r.verify_ratio))
    out += ["", "| k | " + " | ".join(str(k) for k in range(1, n + 1)) + " |", "|---|" + "---:|" * n,
            "| v(k) measured | " + " | ".join(f"{v:.2f}" for v in m.verify_ratio[:n]) + " |",
            "| v(k) roofline | " + " | ".join(f"{v:.2f}" for v in r.verify_ratio[:n]) + " |", "",
            "| draft | c measured | c roofline |", "|---|---:|---:|"]
    cm, cr = measured.cost_model(), roof.cost_model()
    out += [f"| {name} | {cm.draft_ratio(d):.3f} | {cr.draft_ratio(d):.3f} |" for name, d in DRAFTS.items()]
    both = [s.scheme for s in m.schemes if r.scheme(s.scheme)]
    if both:
        out += ["", "| whole model in scheme | c measured | c roofline |", "|---|---:|---:|"]
        out += [f"| {s} | {m.whole_model_ratio(m.scheme(s), L):.3f} | {r.whole_model_ratio(r.scheme(s), L):.3f} |"
                for s in both]
    out += ["", "Shipped profiles re-planned under each file (`plan profile --profile P --costs C`, no model):", "",
            "| profile | measured: ships | predicted | roofline: ships | predicted |", "|---|---|---:|---|---:|"]
    from skipsearch.methods.summary import config_summary

    for name in RECORDED:
        prof = load_profile(PROFILES / name, num_layers=L)
        cells = []
        for target, source in ((measured, "measured"), (roof, "roofline")):
            try:
                new, plan = device_replan.replan_profile(prof, target, source=name, costs_source=source)
            except ProfileError as e:
                cells += [f"refused: {e}", "-"]
                continue
            cells += [config_summary(new.draft), f"{plan.predicted.speedup:.3f}x" if plan.predicted else "-"]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", type=Path, required=True, help="a cost file measured here (skipsearch costs)")
    ap.add_argument("--roofline", type=Path, required=True, help="skipsearch costs --roofline cpu's file")
    ap.add_argument("--out", type=Path, default=ROOT / "studies" / "roofline-cpu-check.md")
    args = ap.parse_args(argv)
    try:
        measured, roof = load_costs(args.measured), load_costs(args.roofline)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problem = ("the first file is a roofline, not a measured one" if measured.roofline is not None else
               "the second file is not a roofline file" if roof.roofline is None else
               "the two files are for different models" if measured.model.num_layers != roof.model.num_layers else
               f"the files price different contexts ({measured.run.context_tokens} and {roof.run.context_tokens} "
               f"tokens): make the roofline with --context-tokens {measured.run.context_tokens}"
               if measured.run and roof.run and measured.run.context_tokens != roof.run.context_tokens else None)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    command = " ".join(["python", "scripts/roofline_cpu_check.py", "--measured", str(args.measured), "--roofline",
                        str(args.roofline), "--out", str(args.out)])
    args.out.write_text(compare(measured, roof, command=command))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
