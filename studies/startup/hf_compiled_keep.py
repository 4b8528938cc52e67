"""Can HF compiled greedy's step (bench's hf-compiled peer) be kept for the next process, as the kernels' graphs
are? One process per call: the peer compiled under one of three inductor settings, then 4 prompts x 64 tokens,
three rounds, decode speed (prompt included) and inductor's cache counters.

    .venv/bin/python studies/startup/hf_compiled_keep.py {kernel|freezing|defaults}

kernel: the peer as bench runs it (the inductor kernel's settings: freezing and max-autotune); freezing: without
max-autotune; defaults: torch.compile's own. Run each in its own process, with SKIPSEARCH_CACHE pointing at a new
folder (its models linked) so that the first process of a kind compiles from nothing."""

import sys
import time

import torch

from skipsearch.bench.peers import hf_compiled_method
from skipsearch.kernels import graphs, inductor
from skipsearch.model.loader import load_model

variant = sys.argv[1]
if variant in ("freezing", "defaults"):
    inductor._SETTINGS["max_autotune"] = False
if variant == "defaults":
    inductor._SETTINGS["freezing"] = False
torch.set_num_threads(2)
sm = load_model("smollm2-135m", device="cpu", dtype="float32", max_tokens=512)
graphs.use(2)  # inductor's caches where bench keeps them
began = time.perf_counter()
peer = hf_compiled_method(sm, capacity=512)
compiled = time.perf_counter() - began
prompts = [sm.tokenizer(text)["input_ids"] for text in
           ("def fib(n):", "Write a haiku about the sea.", "def is_prime(x):\n    ", "Explain photosynthesis briefly.")]
peer.decode(prompts[0], 8)
rates, outputs = [], []
for _ in range(3):
    n, began = 0, time.perf_counter()
    outputs = [peer.decode(p, 64).token_ids for p in prompts]
    rates.append(sum(map(len, outputs)) / (time.perf_counter() - began))
from torch._dynamo.utils import counters  # noqa: E402

caches = {k: v for k, v in {**counters["inductor"], **counters["aot_autograd"]}.items() if "cache" in k}
print(f"{variant}: compiled in {compiled:.1f} s; tokens/s {' '.join(f'{r:.1f}' for r in rates)}; caches {caches}; "
      f"first tokens {[o[:4] for o in outputs]}", flush=True)
