"""Does an eager step slow the compiled call that follows it? Blocks of 20 one-token units and 8-token verify blocks
through the kernel, back to back (``alone``) or each after an eager one-token step of the full model (``after
eager``, as ``measure_costs``'s rotation can place them), alternated ten times in one process; medians, ms. Alone.

    PYTHONPATH=. .venv/bin/python studies/search-gap/neighbour_ab.py [pairs]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from _common import setup, spread


def main(pairs: int = 10) -> None:
    from skipsearch.engine import surrogate

    sm, _, context = setup()
    kcache = surrogate._kernel_cache(sm, context, 9)
    cache = sm.new_cache()
    sm.forward(torch.tensor(list(context)), start=0, cache=cache)
    v1 = surrogate._verify_call(sm, context, 1, kcache, None)
    v8 = surrogate._verify_call(sm, context, 8, kcache, None)
    eager = surrogate._step_call(sm, context, cache, None)
    for _ in range(5):
        v1(), v8(), eager()

    def block(after_eager: bool) -> tuple[float, float]:
        ones, eights = [], []
        for _ in range(20):
            for call, out in ((v1, ones), (v8, eights)):
                if after_eager:
                    eager()
                t = time.perf_counter()
                call()
                out.append(time.perf_counter() - t)
        unit = statistics.median(ones)
        return unit * 1e3, statistics.median(eights) / unit

    res: dict[str, list[float]] = {}
    for _ in range(pairs):
        a, b = block(False), block(True)
        print(f"alone unit {a[0]:.1f} v8/unit {a[1]:.2f} | after eager unit {b[0]:.1f} v8/unit {b[1]:.2f}", flush=True)
        for k, v in (("alone unit ms", a[0]), ("alone v8/unit", a[1]), ("after eager unit ms", b[0]),
                     ("after eager v8/unit", b[1]), ("after eager / alone, unit", b[0] / a[0])):
            res.setdefault(k, []).append(v)
    for k, v in res.items():
        print(spread(f"{k:26s}", v))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
