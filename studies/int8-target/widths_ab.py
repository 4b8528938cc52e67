"""A verify block of its own width against one padded to the kernel's block, in one process: the same target loaded
twice on the same kernel, one side's block call compiled for every width from 2 to the block (as shipped), the
other's for the block's width alone, every shorter block padded to it (as before). First the cost of a forward of
1 to C tokens after a 200-token context, both sides interleaved (median ms, and over the one-token step: v(k)); then
each side's plain loop, or a profile's drafts, over held-out prompts, interleaved prompt by prompt
(``step.interleaved_steps``): ms a token after the first, prefill excluded, and whether both decoded the same tokens.

    .venv/bin/python studies/int8-target/widths_ab.py --kernel panel-c8 \
        --profile studies/int8-target/cpu-int8-zen4-r41-panel-c2.yaml                       (alone on the machine)
    .venv/bin/python studies/int8-target/widths_ab.py --precision native --kernel panel-c8 \
        --profile profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml

A side whose graphs are not kept yet builds them first (about a minute, once per machine): nothing is timed until
both sides are warm.
"""

from __future__ import annotations

import json
import statistics
import time
import warnings


def widths(sides: dict, C: int, *, start: int = 200, reps: int = 30) -> dict:
    """Median ms of a forward of 1..C tokens at ``start`` on each side's kernel cache, the sides and widths
    interleaved, the cache rewound before each."""
    import torch

    ids = torch.randint(0, 1000, (start + C,), generator=torch.Generator().manual_seed(0))
    caches = {}
    for name, (sm, _) in sides.items():
        caches[name] = sm.decode_cache(start + C)
        sm.forward(ids[:start], start=0, cache=caches[name])
    times: dict = {name: {w: [] for w in range(1, C + 1)} for name in sides}
    for r in range(reps):
        for w in range(1, C + 1):
            for name in list(sides) if (r + w) % 2 == 0 else list(reversed(sides)):
                sm, cache = sides[name][0], caches[name]
                sm.crop(cache, start)
                t = time.perf_counter()
                sm.forward(ids[start:start + w], start=start, cache=cache)
                times[name][w].append(time.perf_counter() - t)
    return {name: {w: round(statistics.median(v) * 1e3, 3) for w, v in per.items()} for name, per in times.items()}


def padded_and_own(a) -> dict:
    """The two sides of ``a`` (``step.ab_options``): name -> (the target on ``a.kernel``, its drafters), one side's
    blocks padded to the kernel's block (before this change), the other's of their own width (as shipped)."""
    from step import loaded_side

    from skipsearch.kernels import inductor, panel

    class Padded(inductor.CompiledBlocks):  # the block's width alone, shorter blocks padded (before this change)
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "exact_rows": False})

    shipped = panel.CompiledBlocks
    sides = {}
    for name, blocks in (("padded", Padded), ("own width", shipped)):
        panel.CompiledBlocks = blocks
        sides[name] = loaded_side(a)  # its graphs, and its drafts', built on this side's kernel
    panel.CompiledBlocks = shipped
    return sides


def main() -> None:
    from step import ab_options, timed_ab  # this folder's options and its one interleaved loop

    a = ab_options(kernel="panel-c8")
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(a.threads)

    sides = padded_and_own(a)
    C = sides["padded"][0].kernel.chunk
    with torch.inference_mode():
        cost = widths(sides, C)
    med, same = timed_ab(sides, a)
    print(json.dumps({"precision": a.precision, "kernel": a.kernel, "profile": a.profile, "threads": a.threads,
                      "forward_ms": cost,
                      "v": {name: {w: round(ms / per[1], 2) for w, ms in per.items()} for name, per in cost.items()},
                      "prompts": a.prompts, "tokens": a.tokens, "rounds": a.rounds,
                      "ms_a_token": {k: round(v, 3) for k, v in med.items()},
                      "own_over_padded": round(med["own width"] / med["padded"], 3),
                      "same_tokens": same}, indent=1))


if __name__ == "__main__":
    main()
