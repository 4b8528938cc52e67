"""What the noise scripts share: smollm2-135m on ``panel-c8`` at 2 threads, the calibration prompts a README search
draws (mtbench and humaneval, calib split, seed 0), and the cost context ``unit_probe.py`` uses (the first prompt
and 48 more tokens, as ``Calibration.cost_context`` has)."""

from __future__ import annotations

import torch


def setup(threads: int = 2):
    """(model on panel-c8, the 8 encoded calibration prompts, the cost context)."""
    torch.set_num_threads(threads)
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.model.loader import load_model

    sm = load_model("smollm2-135m", device="cpu", dtype="float32")
    sm.use_kernel("panel-c8", capacity=1024)
    prompts = [encode_prompt(sm.tokenizer, p) for p in load_prompts("mtbench,humaneval", split="calib", n=8, seed=0)]
    context = tuple(prompts[0]) + tuple(range(100, 148))
    return sm, prompts, context


def spread(label: str, xs) -> str:
    import statistics

    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{label} n={len(xs)} mean {statistics.mean(xs):.3f} sd {sd:.3f} min {min(xs):.3f} max {max(xs):.3f}"
