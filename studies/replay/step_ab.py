"""One side of the replay A/B (studies/replay-cpu.md): plain decoding's step on the ``panel`` kernel, the int8 and
fp32 targets in one process, alternating prompt by prompt, decode only (prefill excluded), with the skipsearch
code the interpreter imports (``PYTHONPATH`` picks the tree: before the change, or after it). Prints one JSON line:
each target's median step in ms over prompts x rounds, the step call's time inside it, and a hash of the tokens.

    PYTHONPATH=TREE .venv/bin/python studies/replay/step_ab.py [KERNEL] [ROUNDS]      (alone on the machine)
"""

import hashlib
import json
import statistics
import sys
import time

import torch
from torch._inductor import output_code

import skipsearch
from skipsearch.data import encode_prompt, load_prompts
from skipsearch.engine.decoding import generate
from skipsearch.model.loader import load_model

kernel = sys.argv[1] if len(sys.argv) > 1 else "panel-c2"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
torch.set_num_threads(2)
targets = {}
for precision in ("int8", "native"):
    sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision=precision)
    sm.use_kernel(kernel, capacity=1024)
    targets[precision] = sm
prompts = [encode_prompt(targets["native"].tokenizer, q)
           for q in load_prompts("mtbench,humaneval", split="heldout", n=4, seed=0)]
for sm in targets.values():  # warm-up: every call past its recorded runs
    for _ in range(2):
        generate(sm, prompts[0], max_new_tokens=8)
graph_seconds: list[float] = []  # inductor's compiled graph, each call (its Python prologue and its C++)
run = output_code.CompiledFxGraph.__call__


def timed(self, *args, **kwargs):
    t = time.perf_counter()
    out = run(self, *args, **kwargs)
    graph_seconds.append(time.perf_counter() - t)
    return out


output_code.CompiledFxGraph.__call__ = timed
steps = {k: [] for k in targets}
graph = {k: [] for k in targets}
tokens = {k: [] for k in targets}
for r in range(rounds):
    for i, ids in enumerate(prompts):
        for name in (list(targets) if (r + i) % 2 == 0 else list(reversed(targets))):
            graph_seconds.clear()
            res = generate(targets[name], ids, max_new_tokens=96)
            s = res.stats
            steps[name].append(1000 * (s.seconds - s.prefill_seconds) / (s.new_tokens - 1))
            graph[name].append(1000 * statistics.median(graph_seconds))
            if r == 0:
                tokens[name].append(res.token_ids)
print(json.dumps({"tree": skipsearch.__file__.rsplit("/skipsearch/", 1)[0], "kernel": kernel, "rounds": rounds,
                  **{name: {"step_ms": round(statistics.median(steps[name]), 3),
                            "graph_ms": round(statistics.median(graph[name]), 3),
                            "tokens": hashlib.sha256(json.dumps(tokens[name]).encode()).hexdigest()[:16]}
                     for name in targets}}))
