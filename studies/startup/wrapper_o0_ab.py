"""One process, interleaved: panel-c8's step and block with the C++ wrapper compiled at -O1 (inductor's default for
a separately built wrapper) and at -O0, both from a cleared cache; each checked against eager."""
import os
import shutil
import time

import torch
from interleave import compare

from skipsearch.api.loading import open_model
from skipsearch.kernels import Kernel, graphs, panel
from skipsearch.kernels.inductor import CompiledBlocks

os.environ["SKIPSEARCH_CACHE"] = "/tmp/p62/o0cache"
shutil.rmtree("/tmp/p62/o0cache/graphs", ignore_errors=True)
torch.set_num_threads(2)
sm, _ = open_model(model="smollm2-135m", device="cpu")
ids = torch.randint(0, 40000, (200,), generator=torch.Generator().manual_seed(0))
k = Kernel("panel", 8)
runners = {}
LEVEL = "aot_inductor.compile_wrapper_opt_level"
for name, extra in (("wrapper O1", {LEVEL: "O1"}), ("wrapper O0", {LEVEL: "O0"})):
    copy = panel.shared_copy(sm.hf, panels=True)
    t = time.perf_counter()
    R = CompiledBlocks(sm, k, capacity=graphs.bucket(512 + 8), step_model=copy, rows_model=copy,
                       settings={**panel.SETTINGS, **extra}, draft_context=lambda: panel.packed_attention(sm),
                       precompile=True)
    R.settle()
    runners[name] = R
    print(f"{name}: built in {time.perf_counter() - t:.1f} s", flush=True)
compare(sm, runners, ids)
