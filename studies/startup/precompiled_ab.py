"""One process, interleaved: panel-c8's one-token step and 8-token block run as precompiled calls (as shipped: loaded
from the kept folder, dynamo's trace included) and through torch.compile (traced in this process, as every process did
before this round). 10 rounds x 15 calls each, the order alternating; each checked against eager.
Run from the checkout, after one decode has kept the calls: .venv/bin/python studies/startup/precompiled_ab.py"""

import statistics
import time

import torch

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
