"""One process, interleaved: panel-c8's one-token step and 8-token block run as precompiled calls (as shipped: loaded
from the kept folder, dynamo's trace included) and through torch.compile (traced in this process, as every process did
before this round). 10 rounds x 15 calls each, the order alternating; each checked against eager.
Run from the checkout, after one decode has kept the calls: .venv/bin/python studies/startup/precompiled_ab.py"""

import time

import torch
from interleave import compare  # beside this file

from skipsearch.api.loading import open_model
from skipsearch.kernels import Kernel, graphs, panel
from skipsearch.kernels.inductor import CompiledBlocks

torch.set_num_threads(2)
sm, _ = open_model(model="smollm2-135m", device="cpu")
ids = torch.randint(0, 40000, (200,), generator=torch.Generator().manual_seed(0))
k = Kernel("panel", 8)
t = time.perf_counter()
loaded = panel.build(sm, k, 512)
print(f"precompiled: built in {time.perf_counter() - t:.1f} s", flush=True)
copy = panel.shared_copy(sm.hf, panels=True)
t = time.perf_counter()
traced = CompiledBlocks(sm, k, capacity=graphs.bucket(512 + 8), step_model=copy, rows_model=copy,
                        settings=panel.SETTINGS, draft_context=lambda: panel.packed_attention(sm))
print(f"torch.compile: built in {time.perf_counter() - t:.1f} s", flush=True)
runners = {"precompiled": loaded, "torch.compile": traced}
compare(sm, runners, ids)
