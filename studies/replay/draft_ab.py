"""The replay of a compiled draft's calls (studies/replay-cpu.md), in one process: the shipped fp32 hybrid profile
(lookup, the model's int8 copy drafting on a miss) on ``panel-c8``, its draft calls replayed or run through dynamo's
bytecode, alternating prompt by prompt, 4 held-out prompts x 96 tokens x 3 rounds; the kernel's own calls replay in
both. Prints one JSON line: each side's median tokens/s, its median draft-call time in ms, and whether the tokens
agree.

    .venv/bin/python studies/replay/draft_ab.py [PROFILE] [KERNEL]      (alone on the machine)
"""

import json
import statistics
import sys
import time

import torch

from skipsearch.api.decode import drafter_factory
from skipsearch.data import encode_prompt, load_prompts
from skipsearch.engine.decoding import generate
from skipsearch.kernels import precompiled
from skipsearch.model.loader import load_model
from skipsearch.profile import load_profile

path = sys.argv[1] if len(sys.argv) > 1 else "profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml"
kernel = sys.argv[2] if len(sys.argv) > 2 else "panel-c8"
torch.set_num_threads(2)
sm = load_model("smollm2-135m", device="cpu", dtype="float32")
sm.use_kernel(kernel, capacity=1024)
make = drafter_factory(load_profile(path), sm)
prompts = [encode_prompt(sm.tokenizer, q) for q in load_prompts("mtbench,humaneval", split="heldout", n=4, seed=0)]
for _ in range(2):  # every call past its recorded runs
    generate(sm, prompts[0], drafter=make(), max_new_tokens=32)
runner = sm._runner
drafts = {key: call for key, call in runner._calls.items() if key[0] is runner._module}
replays = {key: call._replay for key, call in drafts.items()}
assert replays and all(r._run is not None for r in replays.values()), "no replayed draft call"
seconds: list[float] = []
run = precompiled.Call.__call__


def timed(self, model, *args):
    t = time.perf_counter()
    out = run(self, model, *args)
    if self in drafts.values():
        seconds.append(time.perf_counter() - t)
    return out


precompiled.Call.__call__ = timed
bytecode = precompiled._Replay()  # one that never replays: every run through dynamo's bytecode
bytecode._off = True
sides = {"bytecode": {key: bytecode for key in drafts}, "replay": replays}
rates = {k: [] for k in sides}
call_ms = {k: [] for k in sides}
tokens = {k: [] for k in sides}
for r in range(3):
    for i, ids in enumerate(prompts):
        for name in (list(sides) if (r + i) % 2 == 0 else list(reversed(sides))):
            for key, call in drafts.items():
                call._replay = sides[name][key]
            seconds.clear()
            res = generate(sm, ids, drafter=make(), max_new_tokens=96)
            rates[name].append(res.stats.tokens_per_s)
            call_ms[name].append(1000 * statistics.median(seconds))
            if r == 0:
                tokens[name].append(res.token_ids)
print(json.dumps({"profile": path, "kernel": kernel, "rounds": 3,
                  **{name: {"tokens_per_s": round(statistics.median(rates[name]), 1),
                            "draft_call_ms": round(statistics.median(call_ms[name]), 3)} for name in sides},
                  "same_tokens": tokens["bytecode"] == tokens["replay"]}))
