"""The shipped hybrid profile's predicted speedup, on this objective's own calibration (8 prompts x 96 tokens), under
cost models timed in 9 and in 45 rounds, alternated in one process with the real decode of the same prompts (our
plain loop against the profile's drafter, decode time only, outputs checked identical). Alone on the machine.

    PYTHONPATH=. .venv/bin/python studies/search-gap/predict_ab.py 3
"""

from __future__ import annotations

import sys

from _common import predict_with, real_speedup, shipped_hybrid, spread

PROFILE = "profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml"


def main() -> None:
    from skipsearch.engine import surrogate
    from skipsearch.methods.precision import surrogate as precision

    sm, prompts, profile, objective, drafters = shipped_hybrid(PROFILE)
    cal = objective.cal

    def predict(rounds: int) -> float:
        return predict_with(objective, profile.candidate, surrogate.measure_costs(sm, cal.cost_context, repeats=rounds),
                            precision.measure_scheme(sm, cal.cost_context, "int8", repeats=rounds))

    def real() -> float:
        return real_speedup(sm, prompts, drafters)

    out: dict = {9: [], 45: [], "real": []}
    for _ in range(int(sys.argv[1])):
        for what in (9, 45, "real", 9):
            v = real() if what == "real" else predict(what)
            out[what].append(v)
            print(what, round(v, 3), flush=True)
    for k, v in out.items():
        print(spread(f"{k}:", v))


if __name__ == "__main__":
    main()
