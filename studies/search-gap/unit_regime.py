"""Is the cost model's unit what a plain decoding token costs? In the same rotated rounds as ``measure_costs``
(``harness.time_interleaved``), the unit as it is priced (a one-token verify at a fixed position, cropped back),
a run of 8 greedy one-token steps as the decode loop takes them (each feeding the last's argmax, the cache growing,
cropped back after the 8th), and the 8-token verify block; with the eager steps ``measure_costs`` rotates among them
and without; and our plain loop decoding 24 tokens of the first calibration prompt (its time a token past the prompt).
Each round's run and loop are paired with the unit of the same round. Alone.

    PYTHONPATH=. .venv/bin/python studies/search-gap/unit_regime.py [measurements] [rounds]
"""

from __future__ import annotations

import json
import statistics
import sys

import torch
from _common import setup, spread


def main(measurements: int = 6, rounds: int = 45) -> None:
    from skipsearch.config import DraftConfig
    from skipsearch.engine import surrogate
    from skipsearch.engine.decoding import generate
    from skipsearch.engine.harness import time_interleaved

    sm, prompts, context = setup()
    n, every = len(context), tuple(range(sm.num_layers))
    kcache = surrogate._kernel_cache(sm, context, 16)
    cache = sm.new_cache()
    sm.forward(torch.tensor(list(context)), start=0, cache=cache)

    def run(steps: int):
        def once():
            token = context[-1]
            for i in range(steps):
                token = int(sm.forward(torch.tensor([token]), start=n + i, cache=kcache)[-1].argmax())
            sm.crop(kcache, n)
        return once

    loop_tokens: list[float] = []

    def loop():  # our plain loop, as a search's calibration and a bench run it: its time a token past the prompt
        r = generate(sm, prompts[0], max_new_tokens=24)
        loop_tokens.append((r.stats.seconds - r.stats.prefill_seconds) / (len(r.token_ids) - 1))

    calls = {"v1": surrogate._verify_call(sm, context, 1, kcache, None), "run8": run(8),
             "v8": surrogate._verify_call(sm, context, 8, kcache, None), "loop": loop}
    eager = {"full": surrogate._step_call(sm, context, cache, None),
             "no_attn": surrogate._step_call(sm, context, cache, DraftConfig(skip_attn=every)),
             "no_mlp": surrogate._step_call(sm, context, cache, DraftConfig(skip_mlp=every))}
    generate(sm, prompts[0], max_new_tokens=8)
    res: dict[str, list[float]] = {}
    for m in range(measurements):
        with_eager = m % 2 == 0
        timed = time_interleaved({**calls, **(eager if with_eager else {})}, rounds=rounds, warmup=3)
        v1, run8, v8 = (timed[k].seconds for k in ("v1", "run8", "v8"))
        loop_t = loop_tokens[-rounds:]
        row = {
            "unit_ms": statistics.median(v1) * 1e3,
            "run_token_ms": statistics.median(run8) * 1e3 / 8,
            "paired_run_over_unit": statistics.median(r / 8 / u for r, u in zip(run8, v1, strict=True)),
            "v8_over_unit": statistics.median(v8) / statistics.median(v1),
            "v8_over_run_token": statistics.median(v8) / (statistics.median(run8) / 8),
            "loop_token_ms": statistics.median(loop_t) * 1e3,
            "paired_loop_over_unit": statistics.median(t / u for t, u in zip(loop_t, v1, strict=True)),
        }
        label = "with eager" if with_eager else "alone"
        print(json.dumps({"rounds": label, **{k: round(v, 3) for k, v in row.items()}}), flush=True)
        for k, v in row.items():
            res.setdefault(f"{label:10s} {k}", []).append(v)
    for k, v in sorted(res.items()):
        print(spread(f"{k:40s}", v))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
