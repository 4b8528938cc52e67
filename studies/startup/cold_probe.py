"""A cold build of panel-c8's step and block (kept graphs cleared, in a cache folder of its own), with torch's
compile-time table and the step's and block's medians; with any argument, inductor's cpp_wrapper_build_separate on.
Run from the checkout: .venv/bin/python studies/startup/cold_probe.py [sep]"""

import os
import shutil
import statistics
import sys
import time

import torch
import torch._inductor.config as inductor_config
from torch._dynamo.utils import compile_times

from skipsearch.api.loading import open_model
from skipsearch.kernels import Kernel, panel

os.environ["SKIPSEARCH_CACHE"] = "/tmp/p62/coldcache"  # read when the kernel builds
shutil.rmtree("/tmp/p62/coldcache/graphs", ignore_errors=True)
if len(sys.argv) > 1:
    inductor_config.cpp_wrapper_build_separate = True
torch.set_num_threads(2)
sm, _ = open_model(model="smollm2-135m", device="cpu")
t = time.perf_counter()
R = panel.build(sm, Kernel("panel", 8), 512)
print(f"build {time.perf_counter() - t:.1f} s")
print(compile_times(repr="str", aggregate=True))
ids = torch.randint(0, 40000, (200,), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    R.forward(ids[:100], 0)
    for n in (1, 8):
        ts = []
        for _ in range(40):
            s = time.perf_counter()
            R.forward(ids[100:100 + n], 100)
            ts.append(time.perf_counter() - s)
        print(n, f"median {1e3 * statistics.median(ts):.2f} ms")
