"""The shipped hybrid profile's predicted speedup as a search times its costs (``measure_costs`` and the int8
scheme's ``measure_scheme``, ``rounds`` rounds) before and after the forty-seventh round's change, alternated in one
process with the real decode of the same 8 calibration prompts x 96 tokens (our plain loop against the profile's
drafter, outputs checked identical): ``one rotation`` puts the kernel's calls back among the eager steps, as before
the change; ``apart`` is that change (``surrogate._medians``). It runs on 0bfaf34, the commit that made the change:
the change was reverted in the same round (studies/search-gap.md). Alone on the machine.

    PYTHONPATH=. .venv/bin/python studies/search-gap/predict_rotation_ab.py [reps] [rounds]
"""

from __future__ import annotations

import sys

from _common import alternate, predict_with, real_speedup, shipped_hybrid


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
        return predict_with(objective, profile.candidate, cm, sc), cm.verify(7), sc.whole_seconds / sc.unit

    alternate(reps, {"one rotation": lambda: predict(True), "apart": lambda: predict(False),
                     "real": lambda: (real_speedup(sm, prompts, drafters), float("nan"), float("nan"))})


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
