"""The panel copy's products streaming their weights from the kept file's mapping against a fresh huge-page block,
in one process, interleaved: every F32PanelLinear of smollm2-135m's panel copy (``kernels/panel.shared_copy``) run
on one token's input, ROUNDS rounds, alternating which copy goes first. Alone on the machine.
    .venv/bin/python studies/startup/arena_stream_ab.py [ROUNDS]"""

import statistics
import sys
import time

import torch

from skipsearch.kernels.lowbit import arena
from skipsearch.kernels.lowbit.modules import F32PanelLinear
from skipsearch.kernels.panel import shared_copy
from skipsearch.model.loader import load_model

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
torch.set_num_threads(2)
sm = load_model("smollm2-135m")
kept_from = arena.KEEP_FROM
mapped = shared_copy(sm.hf, panels=True)  # the kept file (written first where there is none: run twice)
arena.KEEP_FROM = 1 << 62
fresh = shared_copy(sm.hf, panels=True)  # a fresh block, as before the change
arena.KEEP_FROM = kept_from


def linears(model):
    return [m for m in model.modules() if isinstance(m, F32PanelLinear)]


def where(model) -> str:
    block = torch.empty(0, dtype=torch.uint8).set_(linears(model)[0].packed.untyped_storage())
    share = arena._huge_share(block)
    return f"a file, {share:.1%} of it mapped as huge pages" if share else "anonymous memory"


inputs = {id(m): torch.randn(1, m.in_features) for m in linears(mapped)}
pairs = list(zip(linears(mapped), linears(fresh), strict=True))


def run(which: int) -> float:
    t = time.perf_counter()
    with torch.no_grad():
        for pair in pairs:
            pair[which](inputs[id(pair[0])])
    return time.perf_counter() - t


times = {0: [], 1: []}
for r in range(rounds):
    for which in ((0, 1) if r % 2 == 0 else (1, 0)):
        times[which].append(run(which))
print(f"mapped copy's block: {where(mapped)}; fresh copy's: {where(fresh)}")
for which, label in ((0, "mapped from the kept file"), (1, "fresh huge-page block")):
    ms = [t * 1e3 for t in times[which]]
    print(f"{label}: {len(pairs)} products {statistics.median(ms):.2f} ms median "
          f"(min {min(ms):.2f}, max {max(ms):.2f})")
