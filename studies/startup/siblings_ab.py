"""One process, interleaved: panel-c8's one-token step and 8-token block with a layer's sibling products merged (as
shipped) and with each sibling running the whole product itself (as the kept graphs ran them before this round: AOT
autograd does not merge the calls when the weights are graph inputs). The second runner is traced with the old
``LowbitLinear.forward`` patched in, on a copy of its own. 10 rounds x 15 calls each, the order alternating; each
checked against eager. Run from the checkout: .venv/bin/python studies/startup/siblings_ab.py"""

import torch
from interleave import compare  # beside this file
from torch.profiler import ProfilerActivity, profile

from skipsearch.api.loading import open_model
from skipsearch.kernels import Kernel, panel
from skipsearch.kernels.lowbit.modules import LowbitLinear

torch.set_num_threads(2)
sm, _ = open_model(model="smollm2-135m", device="cpu")
ids = torch.randint(0, 40000, (200,), generator=torch.Generator().manual_seed(0))
merged = panel.build(sm, Kernel("panel", 8), 512)
shipped_forward = LowbitLinear.forward


def unmerged_forward(self, x):  # before this round: every sibling runs the whole product and slices it
    x32 = x if x.dtype is torch.float32 else x.float()
    if self.columns is not None and torch.compiler.is_compiling():
        start, stop, total = self.columns
        whole = tuple(getattr(self, f"siblings_{name}") for name in self.STREAMED)
        out = self._run(x32, *whole, self.siblings_bias, total)[..., start:stop]
    else:
        out = self._run(x32, *self._streamed(), self.bias, self.out_features)
    return out if x.dtype is torch.float32 else out.to(x.dtype)


LowbitLinear.forward = unmerged_forward
try:
    unmerged = panel.build(sm, Kernel("panel", 8), 512)
    with torch.inference_mode():  # traced now, with the old forward
        unmerged.forward(ids[:100], 0)
        unmerged.forward(ids[100:101], 100)
        unmerged.forward(ids[100:108], 100)
finally:
    LowbitLinear.forward = shipped_forward
runners = {"merged": merged, "unmerged": unmerged}
with torch.inference_mode():
    for R in runners.values():
        R.forward(ids[:100], 0)
        R.forward(ids[100:101], 100)
        R.forward(ids[100:108], 100)
    for name, R in runners.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            R.forward(ids[100:108], 100)
        print(name, "panel products in an 8-token block:",
              sum(e.count for e in prof.key_averages() if e.key == "skipsearch::f32_panel_linear"))
compare(sm, runners, ids)
