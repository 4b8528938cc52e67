"""The shipped hybrid profile's predicted speedup as a search times its costs (``measure_costs`` and the int8
scheme's ``measure_scheme``, ``rounds`` rounds) before and after the forty-seventh round's change, alternated in one
process with the real decode of the same 8 calibration prompts x 96 tokens (our plain loop against the profile's
drafter, outputs checked identical): ``one rotation`` puts the kernel's calls back among the eager steps, as before
the change; ``apart`` is that change (``surrogate._medians``). It runs on 0bfaf34, the commit that made the change:
the change was reverted in the same round (studies/search-gap.md). Alone on the machine.

    PYTHONPATH=. .venv/bin/python studies/search-gap/predict_rotation_ab.py [reps] [rounds]
"""

from __future__ import annotations

import statistics
import sys

from _common import real_speedup, shipped_hybrid, spread


def main(reps: int = 3, rounds: int = 9) -> None:
    from skipsearch.engine import surrogate
    from skipsearch.methods.precision import surrogate as precision

    sm, prompts, profile, objective, drafters = shipped_hybrid()
    context = objective.cal.cost_context
    apart = surrogate._medians

    def one_rotation(sm, calls, kernel_calls, rounds):
        return apart(sm, {**calls, **kernel_calls}, {}, rounds)

    def predict(before: bool) -> tuple[float, float, float]:
        surrogate._medians = one_rotation if before else apart
        try:
            cm = surrogate.measure_costs(sm, context, repeats=rounds)
            sc = precision.measure_scheme(sm, context, "int8", repeats=rounds)
        finally:
            surrogate._medians = apart
        objective._costs = cm
        memo = precision._memo(objective)
        memo.costs.clear()
        memo.costs["int8"] = sc
        memo.head_savings.clear()
        return objective.predict(profile.candidate).speedup, cm.verify(7), sc.whole_seconds / sc.unit

    out: dict[str, list[tuple[float, float, float]]] = {"one rotation": [], "apart": [], "real": []}
    for _ in range(reps):
        for what in ("one rotation", "apart", "real"):
            if what == "real":
                v = (real_speedup(sm, prompts, drafters), float("nan"), float("nan"))
            else:
                v = predict(what == "one rotation")
            out[what].append(v)
            print(f"{what:12s} speedup {v[0]:.3f}  v(7) {v[1]:.3f}  c {v[2]:.3f}", flush=True)
    for what, vs in out.items():
        print(spread(f"{what:12s} speedup", [v[0] for v in vs]))
        if what != "real":
            print(spread(f"{what:12s} v(7)   ", [v[1] for v in vs]))
            print(spread(f"{what:12s} c      ", [v[2] for v in vs]))
    real = statistics.mean(v[0] for v in out["real"])
    print("prediction over the real decode, mean:",
          {w: round(statistics.mean(v[0] for v in out[w]) / real, 3) for w in ("one rotation", "apart")})


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
