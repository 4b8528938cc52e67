"""HF compiled greedy, three ways, in one process: each built from a cleared inductor cache (compile time), then
timed interleaved over the same held-out prompts (4 x 64 tokens, 5 rounds, the order alternating), every output
checked against HF greedy.

- whole, kernel settings: ``torch.compile(model.forward)`` under the inductor kernel's settings (freezing,
  max-autotune), prompts and steps compiled (the bench's peer until this round);
- step, kernel settings: the same settings, only the one-token step compiled, the prompt run eagerly (what
  transformers' own ``generate`` compiles);
- step, inductor defaults: only the step, torch.compile's defaults."""

import os
import shutil
import statistics
import sys
import time

os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/hfc-ab/inductor"
shutil.rmtree("/tmp/hfc-ab", ignore_errors=True)

import torch  # noqa: E402

from skipsearch.api.loading import open_model  # noqa: E402
from skipsearch.data import encode_prompt, load_prompts  # noqa: E402
from skipsearch.engine.decoding import hf_generate  # noqa: E402
from skipsearch.kernels.inductor import _SETTINGS  # noqa: E402
from skipsearch.kv_cache import static_cache  # noqa: E402

torch.set_num_threads(2)
sm, _ = open_model(model="smollm2-135m", device="cpu")
prompts = [encode_prompt(sm.tokenizer, p) for p in load_prompts("mtbench,humaneval", split="heldout", n=4)]
TOKENS = 64
reference = [hf_generate(sm, p, max_new_tokens=TOKENS) for p in prompts]
eager_forward = sm.hf.forward


def variant(step_only: bool, options):
    cache = static_cache(sm.hf.config, capacity=512, dtype=sm.dtype, device=sm.device)
    compiled = torch.compile(eager_forward, options=options)  # options, not a patch: dynamo keeps each apart

    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids")
        if step_only and (ids is None or ids.shape[1] != 1):
            return eager_forward(*args, **kwargs)
        return compiled(*args, **kwargs)

    def run(ids, n):
        sm.hf.forward = forward
        try:
            with torch.inference_mode():
                cache.reset()
            return hf_generate(sm, ids, max_new_tokens=n, cache=cache)
        finally:
            del sm.hf.forward

    return run


builders = {
    "step, inductor defaults": (True, {}),
    "step, kernel settings": (True, dict(_SETTINGS)),
    "whole, kernel settings": (False, dict(_SETTINGS)),
}
only = sys.argv[1:] or list(builders)
runs = {}
for name in only:
    t = time.perf_counter()
    run = variant(*builders[name])
    for length in (3, 7):
        run([1] * length, 2)
    print(f"{name}: compiled in {time.perf_counter() - t:.1f} s", flush=True)
    runs[name] = run

times = {name: [] for name in runs}
same = {name: 0 for name in runs}
for r in range(5):
    for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
        t = time.perf_counter()
        outs = [runs[name](p, TOKENS) for p in prompts]
        times[name].append(len(prompts) * TOKENS / (time.perf_counter() - t))
        same[name] = sum(o == ref for o, ref in zip(outs, reference))
for name, v in times.items():
    print(f"{name}: median {statistics.median(v):.1f} tok/s  min {min(v):.1f}  max {max(v):.1f}  "
          f"identical {same[name]}/{len(prompts)}", flush=True)
