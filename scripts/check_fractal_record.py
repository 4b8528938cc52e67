"""How well a fractal profile's record (measured.fractal_matches) stands for the engine's own cycles.

For each grid point, the calibration is recorded as ``optimize`` records it (fractal.surrogate.record: one
draft pass per cycle over a teacher-forced KV), replayed by the engine's rules (ngram.replay_cycles), and
compared with the cycles ``decoding.generate`` runs with the fractal drafter on the same prompts (same greedy
output, checked). Nothing is timed: the figures are token counts, so the machine's load does not matter.

    PYTHONPATH=. .venv/bin/python scripts/check_fractal_record.py --grid 3x3,5x3 --n-prompts 4 \\
        --max-new-tokens 64 --out studies/fractal-record-smollm2-cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys

from _common import script_model

from skipsearch.engine.calibration import calibrate_on
from skipsearch.engine.decoding import generate
from skipsearch.methods.fractal import FractalParams
from skipsearch.methods.fractal.drafter import FractalDrafter
from skipsearch.methods.fractal.surrogate import record
from skipsearch.methods.ngram import replay_cycles


def engine_cycles(sm, params, prompt, cont, max_new_tokens):
    """(drafted, accepted) of every drafting cycle the engine runs; the output must be the calibration's."""
    drafter = FractalDrafter(sm, params)
    cycles = []
    observe = drafter.observe
    drafter.observe = lambda d, a: (cycles.append((d, a)), observe(d, a))
    out = generate(sm, list(prompt), max_new_tokens=max_new_tokens, drafter=drafter)
    if tuple(out.token_ids) != tuple(cont):
        raise SystemExit("the fractal draft changed the greedy output: not lossless")
    return cycles


def replayed_cycles(rec, seq, cont):
    def propose(_s, t, limit):
        drafted = min(rec.drafted, limit)
        return "fractal", drafted, min(seq[t - 1], drafted)
    return [(c[1], c[2]) for c in replay_cycles((), cont, max_new_tokens=rec.max_new_tokens, propose=propose) if c[1]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", default="3x3,5x3", help="n x w points, comma-separated")
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--n-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default="studies/fractal-record-smollm2-cpu.md")
    a = ap.parse_args()
    sm = script_model("smollm2-135m", threads=1, device="cpu", dtype="float32")
    cal = calibrate_on(sm, dataset=a.dataset, n_prompts=a.n_prompts, max_new_tokens=a.max_new_tokens, seed=0)
    rows = []
    for point in a.grid.split(","):
        n, w = (int(x) for x in point.split("x"))
        params = FractalParams(n=n, w=w, quantization=a.quantization)
        params = FractalParams(n=n, w=w, layers=params.positions(sm.num_layers), quantization=a.quantization)
        rec = record(sm, cal, params)
        real = replay = same = 0
        cycles_real = cycles_replay = 0
        for prompt, cont, seq in zip(cal.prompts, cal.continuations, rec.positions(), strict=True):
            e, r = engine_cycles(sm, params, prompt, cont, a.max_new_tokens), replayed_cycles(rec, seq, cont)
            real += sum(x[1] for x in e)
            replay += sum(x[1] for x in r)
            cycles_real, cycles_replay = cycles_real + len(e), cycles_replay + len(r)
            same += e == r
        rows.append((n, w, rec.scheme, cycles_real, cycles_replay, real, replay, same))
        print(rows[-1], flush=True)
    lines = [
        "# The fractal record against the engine's cycles: smollm2-135m on cpu", "",
        f"`{shlex.join(['scripts/check_fractal_record.py', *sys.argv[1:]])}`, {datetime.date.today()}; "
        f"{a.n_prompts} prompts of {a.dataset} (calib split) x {a.max_new_tokens} tokens, fp32, greedy. No timing: "
        "token counts only.", "",
        "The record (`measured.fractal_matches`, what `plan profile --profile` re-plans a fractal profile from) runs "
        "one draft pass per cycle over a teacher-forced KV; the engine's passes read the KV its verify forwards wrote. "
        "Where rounding in that KV flips one of the fractal layers' internal argmax choices, a draft token differs, "
        "and from there the cycles of that sequence fall on other positions.", "",
        "| n | w | scheme | cycles (engine) | cycles (replay) | accepted (engine) | accepted (replay) "
        "| sequences with identical cycles |",
        "|---|---|---|---|---|---|---|---|",
        *(f"| {n} | {w} | {s} | {ce} | {cr} | {ae} | {ar} | {same}/{a.n_prompts} |"
          for n, w, s, ce, cr, ae, ar, same in rows), ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
