"""Why a profile's acceptance can move with the verify's graph while its output does not: the two sides of
``widths_ab.py`` (blocks padded to the kernel's, blocks of their own width) in one process.

1. A forward of 1 to C tokens after a 200-token context on each side: its logits' largest difference from the
   model's eager forward, and the largest difference between the two sides' keys and values in the cache.
2. Each held-out prompt decoded with a profile on each side: τ, acceptance, drafted and accepted tokens, verify
   passes, and whether the two outputs are the same tokens.

    .venv/bin/python studies/int8-target/widths_drift.py --precision native --kernel panel-c8 \\
        --profile profiles/smollm2-135m/quickstart.yaml --prompts 4 --tokens 64

Nothing here is timed.
"""

from __future__ import annotations

import json
import warnings


def main() -> None:
    from step import ab_options
    from widths_ab import padded_and_own

    a = ab_options(kernel="panel-c8")
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(a.threads)

    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate
    from skipsearch.model.loader import load_model

    sides = padded_and_own(a)
    eager = load_model("smollm2-135m", device="cpu", dtype="float32", precision=a.precision)
    C, start = sides["padded"][0].kernel.chunk, 200
    ids = torch.randint(0, 1000, (start + C,), generator=torch.Generator().manual_seed(0))
    forwards, per_prompt = [], []
    with torch.inference_mode():
        ref = eager.forward(ids, start=0, cache=eager.decode_cache(start + C))
        caches = {}
        for name, (sm, _) in sides.items():
            caches[name] = sm.decode_cache(start + C)
            sm.forward(ids[:start], start=0, cache=caches[name])
        for w in range(1, C + 1):
            logits = {}
            for name, (sm, _) in sides.items():
                sm.crop(caches[name], start)
                logits[name] = sm.forward(ids[start:start + w], start=start, cache=caches[name])
            kv = max(max((x.keys[0, :, start:start + w] - y.keys[0, :, start:start + w]).abs().max().item(),
                         (x.values[0, :, start:start + w] - y.values[0, :, start:start + w]).abs().max().item())
                     for x, y in zip(caches["own width"].layers, caches["padded"].layers, strict=True))
            forwards.append({"tokens": w, **{f"logits vs eager, {n}": f"{(lg - ref[start:start + w]).abs().max():.2e}"
                                             for n, lg in logits.items()}, "kv own width vs padded": f"{kv:.2e}"})
        for p in load_prompts("mtbench,humaneval", split="heldout", n=a.prompts, seed=0):
            prompt, row = encode_prompt(sides["padded"][0].tokenizer, p), {}
            outs = {}
            for name, (sm, drafters) in sides.items():
                r = generate(sm, prompt, drafter=drafters(), max_new_tokens=a.tokens)
                s, outs[name] = r.stats, r.token_ids
                row[name] = {"tau": round(s.tau, 2), "acceptance": round(s.acceptance_rate or 0.0, 3),
                             "drafted": s.drafted_tokens, "accepted": s.accepted_tokens, "verifies": s.verify_steps}
            per_prompt.append({**row, "same tokens": outs["padded"] == outs["own width"]})
    print(json.dumps({"precision": a.precision, "kernel": a.kernel, "profile": a.profile, "forwards": forwards,
                      "prompts": per_prompt}, indent=1))


if __name__ == "__main__":
    main()
