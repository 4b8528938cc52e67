"""A prompt's forward on the model itself (transformers' modules: MKL's products, SDPA; as before) and on the
compiled kernel's own copy of it (``panel``'s: its panel products and packed attention), in one process on one
model with one kernel: only ``model.skippable.PROMPT_ROWS`` switched before each decode (0: every prompt on the model
itself), the two sides interleaved prompt by prompt with their order rotated, ``--rounds`` times, after one untimed
decode each. Prints each side's prompt time (median ms a prompt token, and the sum), its tokens/s with the prompt
included (as ``bench`` counts them), and how many prompts both sides and HF greedy decoded alike.

    .venv/bin/python studies/prompt/prompt_ab.py                                   (alone on the machine)
    .venv/bin/python studies/prompt/prompt_ab.py --profile profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml
    .venv/bin/python studies/prompt/prompt_ab.py --precision int8 --kernel panel-c2
"""

from __future__ import annotations

import argparse
import json
import statistics
import warnings


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--precision", default="native")
    p.add_argument("--kernel", default="panel-c8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--profile", default=None, help="decode with this profile's drafts (default: plain)")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(a.threads)
    from skipsearch.api.decode import drafter_factory
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate, hf_generate
    from skipsearch.model import skippable
    from skipsearch.model.loader import load_model
    from skipsearch.profile import load_profile

    sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision=a.precision)
    sm.use_kernel(a.kernel, capacity=1024)
    drafters = drafter_factory(load_profile(a.profile), sm) if a.profile else (lambda: None)
    sides = {"the model itself": 0, "the kernel's copy": skippable.PROMPT_ROWS}
    prompts = [encode_prompt(sm.tokenizer, q) for q in
               load_prompts("mtbench,humaneval", split="heldout", n=a.prompts, seed=0)]

    def decode(rows: int, ids: list, n: int):
        skippable.PROMPT_ROWS = rows
        return generate(sm, ids, drafter=drafters(), max_new_tokens=n)

    for rows in sides.values():
        decode(rows, prompts[0], 8)
    per_token = {k: [] for k in sides}
    prefill = {k: 0.0 for k in sides}
    total = {k: 0.0 for k in sides}
    outputs = {k: [] for k in sides}
    for r in range(a.rounds):
        for i, ids in enumerate(prompts):
            for name in list(sides) if (r + i) % 2 == 0 else list(reversed(sides)):
                res = decode(sides[name], ids, a.tokens)
                per_token[name].append(res.stats.prefill_seconds / len(ids))
                prefill[name] += res.stats.prefill_seconds
                total[name] += res.stats.seconds
                if r == 0:
                    outputs[name].append(list(res.token_ids))
    skippable.PROMPT_ROWS = sides["the kernel's copy"]
    hf = [list(hf_generate(sm, ids, max_new_tokens=a.tokens)) for ids in prompts]
    new_tokens = a.rounds * a.tokens * len(prompts)
    print(json.dumps({
        "precision": a.precision, "kernel": a.kernel, "profile": a.profile, "threads": a.threads,
        "prompts": len(prompts), "prompt_tokens": [len(ids) for ids in prompts], "tokens": a.tokens,
        "rounds": a.rounds,
        "ms_a_prompt_token": {k: round(statistics.median(v) * 1e3, 3) for k, v in per_token.items()},
        "prompt_seconds": {k: round(v, 2) for k, v in prefill.items()},
        "tokens_per_s_with_the_prompt": {k: round(new_tokens / v, 1) for k, v in total.items()},
        "copy_over_model_prompt_seconds": round(prefill["the kernel's copy"] / prefill["the model itself"], 3),
        "same_tokens_both_sides": sum(x == y for x, y in zip(*outputs.values(), strict=True)),
        "identical_to_hf_greedy": {k: sum(x == y for x, y in zip(v, hf, strict=True)) for k, v in outputs.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
