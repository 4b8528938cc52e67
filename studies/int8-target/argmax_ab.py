"""The decode loop's greedy choice on ATen's argmax (as before) and on ``skipsearch::argmax_rows``
(``kernels/lowbit/csrc/argmax.cpp``), in one process on one model: the same graphs and drafts, only the argmax
switched before each decode, the two sides' decodes interleaved prompt by prompt with their order rotated
(``step.interleaved_steps``). Prints each side's time a token after the first (prefill excluded), the ratio, and
whether both decoded the same tokens. The op is not in the tree: apply ``argmax-rows.patch`` (this folder) first.

    .venv/bin/python studies/int8-target/argmax_ab.py --precision int8 --kernel panel-c2       (alone on the machine)
    .venv/bin/python studies/int8-target/argmax_ab.py --precision native --kernel panel-c8 \
        --profile profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml
"""

from __future__ import annotations

import json
import statistics
import warnings


def main() -> None:
    from step import ab_options, interleaved_steps  # this folder's options and its one interleaved loop

    a = ab_options()
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(a.threads)

    from skipsearch.api.decode import drafter_factory
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine import decoding
    from skipsearch.kernels.lowbit import greedy_argmax
    from skipsearch.model.loader import load_model
    from skipsearch.profile import load_profile

    sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision=a.precision)
    sm.use_kernel(a.kernel, capacity=1024)
    drafters = drafter_factory(load_profile(a.profile), sm) if a.profile else (lambda: None)

    def side(argmax):
        def make():
            decoding.greedy_argmax = argmax  # what generate's greedy choices call, for this decode
            return drafters()
        return sm, make

    sides = {"aten argmax": side(lambda x: x.argmax(-1)), "argmax_rows": side(greedy_argmax)}
    prompts = [encode_prompt(sm.tokenizer, q) for q in
               load_prompts("mtbench,humaneval", split="heldout", n=a.prompts, seed=0)]
    steps, tokens = interleaved_steps(sides, prompts, rounds=a.rounds, tokens=a.tokens, warmup=16)
    decoding.greedy_argmax = greedy_argmax
    med = {k: statistics.median(v) * 1e3 for k, v in steps.items()}
    print(json.dumps({"precision": a.precision, "kernel": a.kernel, "profile": a.profile, "threads": a.threads,
                      "prompts": a.prompts, "tokens": a.tokens, "rounds": a.rounds,
                      "step_ms": {k: round(v, 3) for k, v in med.items()},
                      "ours_over_aten": round(med["argmax_rows"] / med["aten argmax"], 3),
                      "same_tokens": sum(x == y for x, y in zip(*tokens.values(), strict=True))}, indent=1))


if __name__ == "__main__":
    main()
