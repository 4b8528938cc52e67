"""One process, interleaved: panel-c8 as shipped before (frozen weights, inductor's one-token product, exact capacity)
against panel-c8 now (every product on the panel product, no frozen weights, kept graphs, capacity bucket 1024).
One-token step and 8-token block at position 100, 10 rounds x 15 calls; each checked against eager.
Run from the checkout: .venv/bin/python studies/startup/ab_probe.py (studies/startup-cpu.md has what it printed)."""

import statistics
import time

import torch

from skipsearch.api.loading import open_model
from skipsearch.kernels import Kernel, inductor, panel

torch.set_num_threads(2)
sm, _ = open_model(model="smollm2-135m", device="cpu")
k = Kernel("panel", 8)
t = time.perf_counter()
old = inductor.CompiledBlocks(sm, k, capacity=520, step_model=panel.shared_copy(sm.hf, panels=False),
                              rows_model=panel.shared_copy(sm.hf, panels=True),
                              settings={"cpp_wrapper": True, "freezing": True},
                              draft_context=lambda: panel.packed_attention(sm))
print(f"before built {time.perf_counter() - t:.0f} s", flush=True)
t = time.perf_counter()
new = panel.build(sm, k, 512)
print(f"now built {time.perf_counter() - t:.0f} s, capacity {new.capacity}", flush=True)
ids = torch.randint(0, 40000, (200,), generator=torch.Generator().manual_seed(0))


def prefill(R):
    with torch.inference_mode():
        R.forward(ids[:100], 0)


def run(R, n, reps):
    out = []
    with torch.inference_mode():
        for _ in range(reps):
            t = time.perf_counter()
            R.forward(ids[100:100 + n], 100)
            out.append(time.perf_counter() - t)
    return out


for R in (old, new):
    prefill(R)
res = {}
for r in range(10):
    for name, R in ((("before", old), ("now", new)) if r % 2 == 0 else (("now", new), ("before", old))):
        for n in (1, 8):
            res.setdefault((name, n), []).extend(run(R, n, 15))
for key, v in sorted(res.items()):
    print(key, f"median {1e3 * statistics.median(v):.2f} ms  min {1e3 * min(v):.2f} ms")
with torch.inference_mode():
    cache = sm.new_cache()
    with sm.eager():
        ref = sm.forward(ids[:108].clone(), start=0, cache=cache)[100:108].float()
    for name, R in (("before", old), ("now", new)):
        prefill(R)
        got = R.forward(ids[100:108], 100)
        print(name, "argmax = eager:", bool((got.argmax(-1) == ref.argmax(-1)).all()),
              f"max |diff| {float((got - ref).abs().max()):.2e}")
