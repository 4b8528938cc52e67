"""HF compiled greedy's one-token step, compiled one way per process (argument: patch, options, freeze or defaults),
from a cleared inductor cache: the compile's wall time, then the compiled step's mean over two 64-token decodes of
one held-out prompt (the prompt runs eagerly, as transformers' generate runs it).

- patch: the inductor kernel's settings (freezing, max-autotune) patched around the call that compiles (the bench);
- options: the same settings as ``torch.compile(options=...)``;
- freeze: freezing alone, patched; defaults: torch.compile's defaults."""

import contextlib
import os
import shutil
import sys
import time

os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/hfc-step/inductor"
shutil.rmtree("/tmp/hfc-step", ignore_errors=True)

import torch  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402

from skipsearch.api.loading import open_model  # noqa: E402
from skipsearch.data import encode_prompt, load_prompts  # noqa: E402
from skipsearch.engine.decoding import hf_generate  # noqa: E402
from skipsearch.kernels.inductor import _SETTINGS, inductor_settings  # noqa: E402
from skipsearch.kv_cache import static_cache  # noqa: E402

torch.set_num_threads(2)
mode = sys.argv[1]
sm, _ = open_model(model="smollm2-135m", device="cpu")
prompt = encode_prompt(sm.tokenizer, load_prompts("mtbench,humaneval", split="heldout", n=1)[0])
eager = sm.hf.forward
compiled = torch.compile(eager, options=dict(_SETTINGS)) if mode == "options" else torch.compile(eager)
context = {"patch": inductor_settings, "freeze": lambda: inductor_config.patch(freezing=True)}.get(
    mode, contextlib.nullcontext)
cache = static_cache(sm.hf.config, capacity=512, dtype=sm.dtype, device=sm.device)
steps = {"n": 0, "s": 0.0}


def forward(*args, **kwargs):
    ids = kwargs.get("input_ids")
    if ids is None or ids.shape[1] != 1:
        return eager(*args, **kwargs)
    t = time.perf_counter()
    out = compiled(*args, **kwargs)
    steps["n"], steps["s"] = steps["n"] + 1, steps["s"] + time.perf_counter() - t
    return out


def run(ids, n):
    sm.hf.forward = forward
    try:
        with torch.inference_mode():
            cache.reset()
        with context():
            return hf_generate(sm, ids, max_new_tokens=n, cache=cache)
    finally:
        del sm.hf.forward


t = time.perf_counter()
run([1] * 3, 2)
print(mode, "compile", round(time.perf_counter() - t, 1), "s", flush=True)
reference = hf_generate(sm, prompt, max_new_tokens=64)
for _ in range(2):
    steps.update(n=0, s=0.0)
    same = run(prompt, 64) == reference
    print(mode, "step", round(1e3 * steps["s"] / steps["n"], 1), "ms", "identical" if same else "DIFFERENT", flush=True)
