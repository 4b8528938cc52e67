"""One process, interleaved: panel-c8's step and block built with the C++ wrapper and kernels compiled in one file (as
shipped before) and separately (inductor's cpp_wrapper_build_separate), both from a cleared cache; 10 rounds x 15
calls each, the order alternating; each checked against eager."""

import os
import shutil
import time

import torch
from interleave import compare  # beside this file

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
compare(sm, runners, ids)
