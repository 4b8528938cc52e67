"""One process, interleaved: panel-c8's step and block built with the C++ wrapper and kernels compiled in one file (as
shipped before) and separately (inductor's cpp_wrapper_build_separate), both from a cleared cache; 10 rounds x 15
calls each, the order alternating; each checked against eager."""

import os
import shutil
import statistics
import time

import torch

from skipsearch.api.loading import open_model
from skipsearch.kernels import Kernel, graphs, panel
from skipsearch.kernels.inductor import CompiledBlocks

os.environ["SKIPSEARCH_CACHE"] = "/tmp/p62/coldcache"  # read when a kernel builds
shutil.rmtree("/tmp/p62/coldcache/graphs", ignore_errors=True)
torch.set_num_threads(2)
sm, _ = open_model(model="smollm2-135m", device="cpu")
ids = torch.randint(0, 40000, (200,), generator=torch.Generator().manual_seed(0))
k = Kernel("panel", 8)
runners = {}
for name, extra in (("one file", {}), ("separate", {"cpp_wrapper_build_separate": True})):
    copy = panel.shared_copy(sm.hf, panels=True)
    t = time.perf_counter()
    runners[name] = CompiledBlocks(sm, k, capacity=graphs.bucket(512 + 8), step_model=copy, rows_model=copy,
                                   settings={**panel.SETTINGS, **extra},
                                   draft_context=lambda: panel.packed_attention(sm), precompile=True)
    print(f"{name}: built in {time.perf_counter() - t:.1f} s", flush=True)
res = {}
with torch.inference_mode():
    for R in runners.values():
        R.forward(ids[:100], 0)
    for r in range(10):
        for name in (list(runners) if r % 2 == 0 else list(runners)[::-1]):
            for n in (1, 8):
                for _ in range(15):
                    t = time.perf_counter()
                    runners[name].forward(ids[100:100 + n], 100)
                    res.setdefault((name, n), []).append(time.perf_counter() - t)
for key, v in sorted(res.items()):
    print(key, f"median {1e3 * statistics.median(v):.2f} ms  min {1e3 * min(v):.2f} ms")
with torch.inference_mode():
    with sm.eager():
        ref = sm.forward(ids[:108].clone(), start=0, cache=sm.new_cache())[100:108].float()
    for name, R in runners.items():
        R.forward(ids[:100], 0)
        got = R.forward(ids[100:108], 100)
        print(name, "argmax = eager:", bool((got.argmax(-1) == ref.argmax(-1)).all()),
              f"max |diff| {float((got - ref).abs().max()):.2e}")
