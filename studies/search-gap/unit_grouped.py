"""Does an eager step slow the compiled call after it? The kernel's unit and its 8-token verify block timed three
ways, alternated in one process: ``mixed`` (one rotation with the eager one-token steps ``measure_costs`` times:
full, no attention, no MLP; as today), ``grouped`` (every round the compiled calls back to back, then the eager
ones, each group rotated within itself) and ``alone`` (the compiled calls only). Medians over ``rounds`` rounds, ms.
Alone on the machine.

    PYTHONPATH=. .venv/bin/python studies/search-gap/unit_grouped.py [reps] [rounds]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from _common import setup, spread


def rotate(names: list[str], r: int) -> list[str]:
    shift = r % len(names)
    return [*names[shift:], *names[:shift]]


def main(reps: int = 3, rounds: int = 30) -> None:
    from skipsearch.config import DraftConfig
    from skipsearch.engine import surrogate

    sm, _, context = setup()
    every = tuple(range(sm.num_layers))
    sizes = surrogate.timed_verify_sizes((1, 2, 3, 4, 6, 9), sm.kernel.chunk)
    kcache = surrogate._kernel_cache(sm, context, max(sizes))
    cache = sm.new_cache()
    sm.forward(torch.tensor(list(context)), start=0, cache=cache)
    kernel = {f"v{k}": surrogate._verify_call(sm, context, k, kcache, None) for k in sizes}
    eager = {"full": surrogate._step_call(sm, context, cache, None),
             "no_attn": surrogate._step_call(sm, context, cache, DraftConfig(skip_attn=every)),
             "no_mlp": surrogate._step_call(sm, context, cache, DraftConfig(skip_mlp=every))}

    def measure(mode: str) -> dict[str, float]:
        calls = {**kernel, **eager}
        for call in calls.values():
            for _ in range(3):
                call()
        samples: dict[str, list[float]] = {k: [] for k in kernel}
        for r in range(rounds):
            if mode == "mixed":
                order = rotate([*kernel, *eager], r)
            elif mode == "grouped":
                order = [*rotate(list(kernel), r), *rotate(list(eager), r)]
            else:
                order = rotate(list(kernel), r)
            for name in order:
                t = time.perf_counter()
                calls[name]()
                if name in samples:
                    samples[name].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in samples.items()}
        unit = med["v1"]
        return {"unit_ms": unit * 1e3, "v8_over_unit": med["v8"] / unit, "v9_over_unit": med["v9"] / unit}

    res: dict[str, list[float]] = {}
    for _ in range(reps):
        for mode in ("mixed", "grouped", "alone"):
            row = measure(mode)
            print(mode, {k: round(v, 3) for k, v in row.items()}, flush=True)
            for k, v in row.items():
                res.setdefault(f"{mode:8s} {k}", []).append(v)
    for k, v in sorted(res.items()):
        print(spread(f"{k:24s}", v))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
