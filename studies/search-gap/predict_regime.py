"""The shipped hybrid profile's predicted speedup under two cost models, alternated in one process with the real
decode of the same 8 calibration prompts x 96 tokens (our plain loop against the profile's drafter, decode time
only, outputs checked identical):

- ``rotated``: as a search times it: ``measure_costs`` and the int8 scheme's ``measure_scheme``, where the kernel's
  unit, its verify blocks and the compiled int8 draft step rotate among eager one-token steps (full, no attention,
  no MLP, the scheme's stand-ins), each ``rounds`` rounds;
- ``kernel only``: the same cost models with the unit, the verify curve and the int8 draft step re-timed in a
  rotation of their own (only compiled calls, as the decode loop runs them), ``rounds`` rounds.

    PYTHONPATH=. .venv/bin/python studies/search-gap/predict_regime.py [reps] [rounds]
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch
from _common import alternate, predict_with, real_speedup, shipped_hybrid

PROFILE = "profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml"


def main(reps: int = 3, rounds: int = 25) -> None:
    from skipsearch.engine import surrogate
    from skipsearch.engine.harness import time_interleaved
    from skipsearch.methods.precision import surrogate as precision
    from skipsearch.methods.precision.copy import quantized_copy

    sm, prompts, profile, objective, drafters = shipped_hybrid(PROFILE)
    cal = objective.cal
    context = cal.cost_context
    n, token = len(context), torch.tensor([context[-1]])
    sizes = surrogate.timed_verify_sizes((1, 2, 3, 4, 6, 9), sm.kernel.chunk)
    kcache = surrogate._kernel_cache(sm, context, max(sizes))
    copy = quantized_copy(sm, "int8")

    def whole() -> None:
        with surrogate.whole_draft(sm, copy):
            surrogate._one_step(sm, token, n, kcache, None)

    kernel_calls = {**{f"v{k}": surrogate._verify_call(sm, context, k, kcache, None) for k in sizes},
                    "unit": lambda: surrogate._one_step(sm, token, n, kcache, None), "whole": whole}

    def predict(kernel_only: bool) -> tuple[float, float, float]:
        cm = surrogate.measure_costs(sm, context, repeats=rounds)
        sc = precision.measure_scheme(sm, context, "int8", repeats=rounds)
        if kernel_only:
            med = {k: t.median for k, t in time_interleaved(kernel_calls, rounds=rounds, warmup=3).items()}
            unit = med["v1"]
            cm = replace(cm, step_seconds=unit, verify_ratio=surrogate._curve(sizes, lambda k: med[f"v{k}"], unit))
            sc = replace(sc, unit_seconds=med["unit"], whole_seconds=med["whole"])
        return predict_with(objective, profile.candidate, cm, sc), cm.verify(7), sc.whole_seconds / sc.unit

    alternate(reps, {"rotated": lambda: predict(False), "kernel only": lambda: predict(True),
                     "real": lambda: (real_speedup(sm, prompts, drafters), float("nan"), float("nan"))})


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
