"""The one-token unit and v(8) as ``measure_costs`` times them (rotated among eager steps) and in runs of 20 alike,
and our plain loop's decode time a token (64 tokens), alternated six times in one process, in ms. Alone.

    PYTHONPATH=. .venv/bin/python studies/search-gap/unit_ab.py
"""

from __future__ import annotations

import json
import statistics
import time

from _common import setup, spread


def main() -> None:
    from skipsearch.engine import surrogate
    from skipsearch.engine.decoding import generate

    sm, prompts, context = setup()
    cache = surrogate._kernel_cache(sm, context, 16)
    v1 = surrogate._verify_call(sm, context, 1, cache, None)
    v8 = surrogate._verify_call(sm, context, 8, cache, None)
    generate(sm, prompts[0], max_new_tokens=8)
    res: dict[str, list[float]] = {k: [] for k in ("costs_unit", "costs_v8", "run_unit", "run_v8", "plain_loop")}
    for rep in range(6):
        cm = surrogate.measure_costs(sm, context)
        res["costs_unit"].append(cm.step_seconds * 1e3)
        res["costs_v8"].append(cm.verify_ratio[7] * cm.step_seconds * 1e3)
        for name, call in (("run_unit", v1), ("run_v8", v8)):
            xs = []
            for _ in range(20):
                t = time.perf_counter()
                call()
                xs.append(time.perf_counter() - t)
            res[name].append(statistics.median(xs) * 1e3)
        r = generate(sm, prompts[rep % 8], max_new_tokens=64)
        res["plain_loop"].append((r.stats.seconds - r.stats.prefill_seconds) / (len(r.token_ids) - 1) * 1e3)
        print(json.dumps({k: round(v[-1], 2) for k, v in res.items()}), flush=True)
    for k, v in res.items():
        print(spread(f"{k:12s} ms", v))


if __name__ == "__main__":
    main()
