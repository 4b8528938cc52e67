"""The cost model's unit and verify curve (``surrogate.measure_costs``, as a search measures them) beside the same
forwards timed one after another in a plain loop, on ``panel-c8`` at a calibration context; alone on the machine.

    PYTHONPATH=. .venv/bin/python studies/search-gap/unit_probe.py
"""

from __future__ import annotations

import statistics
import time

import torch


def main() -> None:
    torch.set_num_threads(2)
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine import surrogate
    from skipsearch.model.loader import load_model

    sm = load_model("smollm2-135m", device="cpu", dtype="float32")
    sm.use_kernel("panel-c8", capacity=1024)
    prompt = encode_prompt(sm.tokenizer, load_prompts("mtbench,humaneval", split="calib", n=8, seed=0)[0])
    context = tuple(prompt) + tuple(range(100, 148))  # the prompt and 48 more tokens, as cost_context has
    cm = surrogate.measure_costs(sm, context)
    print(f"cost model: unit {cm.step_seconds * 1e3:.2f} ms, v(1..9) "
          f"{', '.join(f'{v:.3f}' for v in cm.verify_ratio)}")
    cache = surrogate._kernel_cache(sm, context, 16)
    # the very calls measure_costs times for v(k): k rows, every row's argmax read back, cropped
    calls = {k: surrogate._verify_call(sm, context, k, cache, None) for k in (1, 2, 7, 8)}
    for once in calls.values():
        for _ in range(3):
            once()
    seconds: dict[int, list[float]] = {k: [] for k in calls}
    for _ in range(15):
        for k, runs in seconds.items():
            t = time.perf_counter()
            calls[k]()
            runs.append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in seconds.items()}
    print("the same forwards in a loop, median ms: " + ", ".join(f"k={k} {v:.2f}" for k, v in med.items())
          + f"; v(7) {med[7] / med[1]:.3f}")


if __name__ == "__main__":
    main()
