"""The timing and the check the start-up probes share (precompiled_ab.py, build_separate_ab.py, siblings_ab.py):
each runner's one-token step and 8-token block at position 100, in one process, 10 rounds x 15 calls, the runners'
order alternating round by round; then each runner's 8-token block against eager's logits."""

import statistics
import time

import torch


def compare(sm, runners: dict, ids: torch.Tensor) -> None:
    """Print each (runner, width)'s median and min, then whether each agrees with eager on every argmax."""
    res = {}
    with torch.inference_mode():
        for R in runners.values():
            R.forward(ids[:100], 0)
        for r in range(10):
            for name in (list(runners) if r % 2 == 0 else list(runners)[::-1]):
                for n in (1, 8):
                    for _ in range(15):
                        t = time.perf_counter()
                        runners[name].forward(ids[100:100 + n], 100)
                        res.setdefault((name, n), []).append(time.perf_counter() - t)
    for key, v in sorted(res.items()):
        print(key, f"median {1e3 * statistics.median(v):.2f} ms  min {1e3 * min(v):.2f} ms")
    with torch.inference_mode():
        with sm.eager():
            ref = sm.forward(ids[:108].clone(), start=0, cache=sm.new_cache())[100:108].float()
        for name, R in runners.items():
            R.forward(ids[:100], 0)
            got = R.forward(ids[100:108], 100)
            print(name, "argmax = eager:", bool((got.argmax(-1) == ref.argmax(-1)).all()),
                  f"max |diff| {float((got - ref).abs().max()):.2e}")
