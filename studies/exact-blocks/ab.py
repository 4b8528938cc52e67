"""The panel kernel's linears as fp32 panels (as before) against the exact blocks they hold (Q4_1, and Q8_0 for the
head: ``kernels/lowbit/exact.py``), in one process: the same target loaded twice, one copy's linears forced to fp32
panels, their decodes interleaved prompt by prompt with the order rotated (``step.interleaved_steps``'s loop, here
with the prefill recorded too). Prints each side's bytes a step streams, its step (ms a token after the first,
prefill excluded), its prefill (ms a prompt token), the ratios, and on how many prompts both decoded the same tokens.

    .venv/bin/python studies/exact-blocks/ab.py                      (alone on the machine; plain decoding)
    .venv/bin/python studies/exact-blocks/ab.py --profile profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml

A side whose graphs are not kept yet builds them first (minutes, once per machine): nothing is timed until both
sides are warm.
"""

from __future__ import annotations

import json
import statistics
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "int8-target"))


def copy_bytes(sm) -> int:
    """Bytes a one-token step's linears stream on the kernel's copy (weights, codes and scales; biases aside)."""
    from skipsearch.kernels.lowbit.modules import LowbitLinear

    rows = sm._runner._rows_module._orig_mod
    return sum(m.weight_bytes for m in rows.modules() if isinstance(m, LowbitLinear))


def main() -> None:
    from step import ab_options, loaded_side  # the int8 study's options and sides

    a = ab_options(precision="native", kernel="panel-c8")
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(a.threads)
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate
    from skipsearch.kernels.lowbit import exact

    shipped = exact.FORMATS
    sides = {}
    for name, formats in (("fp32 panels", ()), ("exact blocks", shipped)):
        exact.FORMATS = formats
        sides[name] = loaded_side(a)
    exact.FORMATS = shipped
    tokenizer = sides["fp32 panels"][0].tokenizer
    prompts = [encode_prompt(tokenizer, q) for q in load_prompts("mtbench,humaneval", split="heldout", n=a.prompts,
                                                                 seed=0)]
    for sm, drafters in sides.values():  # warm
        generate(sm, prompts[0], drafter=drafters(), max_new_tokens=16)
    steps = {k: [] for k in sides}
    prefill = {k: [] for k in sides}
    outputs = {k: [] for k in sides}
    for r in range(a.rounds):
        for i, ids in enumerate(prompts):
            for name in list(sides) if (r + i) % 2 == 0 else list(reversed(sides)):
                sm, drafters = sides[name]
                res = generate(sm, ids, drafter=drafters(), max_new_tokens=a.tokens)
                s = res.stats
                steps[name].append((s.seconds - s.prefill_seconds) / (s.new_tokens - 1))
                prefill[name].append(s.prefill_seconds / len(ids))
                if r == 0:
                    outputs[name].append(list(res.token_ids))
    step = {k: statistics.median(v) * 1e3 for k, v in steps.items()}
    pre = {k: statistics.median(v) * 1e3 for k, v in prefill.items()}
    print(json.dumps({
        "kernel": a.kernel, "profile": a.profile, "threads": a.threads, "prompts": a.prompts, "tokens": a.tokens,
        "rounds": a.rounds,
        "step_bytes_mb": {k: round(copy_bytes(sm) / 1e6, 1) for k, (sm, _) in sides.items()},
        "decode_ms_a_token": {k: round(v, 3) for k, v in step.items()},
        "prefill_ms_a_prompt_token": {k: round(v, 3) for k, v in pre.items()},
        "decode_blocks_over_panels": round(step["exact blocks"] / step["fp32 panels"], 3),
        "prefill_blocks_over_panels": round(pre["exact blocks"] / pre["fp32 panels"], 3),
        "same_tokens": sum(x == y for x, y in zip(*outputs.values(), strict=True)),
    }, indent=1))


if __name__ == "__main__":
    main()
