"""One process, interleaved: the one-token step of panel-c8 three ways, each beside the others in every round.
- panel: as shipped (every linear on skipsearch's panel product; no frozen weights, so its graphs are kept);
- plain: the step on a copy with the model's own nn.Linear weights (inductor's extern mm), no frozen weights either;
- frozen: the step as shipped before graphs were kept (the same copy, inductor's freezing: packed weights as constants).
Blocks of 8 rows run the panel product in all three. One-token step and 8-token block at position 100, 10 rounds x 15
calls; each checked against eager. Run from the checkout: .venv/bin/python studies/startup/step_probe.py"""

import statistics
import time

import torch

from skipsearch.api.loading import open_model
from skipsearch.kernels import Kernel, inductor, panel

torch.set_num_threads(2)
sm, _ = open_model(model="smollm2-135m", device="cpu")
k = Kernel("panel", 8)
built = {}


def variant(step_panels: bool | None):
    if step_panels:
        return panel.build(sm, k, 512)
    return inductor.CompiledBlocks(sm, k, capacity=1024, step_model=panel.shared_copy(sm.hf, panels=False),
                                   rows_model=panel.shared_copy(sm.hf, panels=True),
                                   settings={"cpp_wrapper": True, "freezing": step_panels is None},
                                   draft_context=lambda: panel.packed_attention(sm))


for name, how in (("panel", True), ("plain", False), ("frozen", None)):
    t = time.perf_counter()
    built[name] = variant(how)
    print(f"{name} built {time.perf_counter() - t:.0f} s", flush=True)
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


for R in built.values():
    prefill(R)
res = {}
names = list(built)
for r in range(10):
    order = names[r % 3:] + names[:r % 3]
    for name in order:
        for n in (1, 8):
            res.setdefault((name, n), []).extend(run(built[name], n, 15))
for key, v in sorted(res.items()):
    print(key, f"median {1e3 * statistics.median(v):.2f} ms  min {1e3 * min(v):.2f} ms")
with torch.inference_mode():
    cache = sm.new_cache()
    with sm.eager():
        ref = sm.forward(ids[:108].clone(), start=0, cache=cache)[100:108].float()
    for name, R in built.items():
        prefill(R)
        step = R.forward(ids[100:101], 100)
        prefill(R)
        got = R.forward(ids[100:108], 100)
        print(name, "step argmax = eager:", bool(step[-1].argmax() == ref[0].argmax()),
              f"max |diff| {float((step[-1] - ref[0]).abs().max()):.2e};",
              "8 rows argmax = eager:", bool((got.argmax(-1) == ref.argmax(-1)).all()),
              f"max |diff| {float((got - ref).abs().max()):.2e}")
