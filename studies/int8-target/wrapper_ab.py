"""The panel kernel's C++ wrapper compiled at two or more levels (-O0 against -O1 by default; kernels/panel.py has
-Og since the thirty-second round), one process, each level's graphs built (or loaded) first, then plain decoding of
4 held-out prompts x 96 tokens, the levels alternating prompt by prompt, 4 rounds; prints each one's median and least
ms a step (decode only) and whether their tokens agree.

    .venv/bin/python studies/int8-target/wrapper_ab.py [THREADS] [int8|native] [O0,Og,...]      (alone on the machine)
"""

import json
import statistics
import sys
import time

import torch
from step import interleaved_steps  # this folder's one interleaved loop

from skipsearch.data import encode_prompt, load_prompts
from skipsearch.kernels import panel
from skipsearch.model.loader import load_model

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
precision = sys.argv[2] if len(sys.argv) > 2 else "int8"
models = {}
LEVELS = sys.argv[3].split(",") if len(sys.argv) > 3 else ["O0", "O1"]
for level in LEVELS:
    panel.SETTINGS = {**panel.SETTINGS, "aot_inductor.compile_wrapper_opt_level": level}
    sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision=precision)
    t = time.perf_counter()
    sm.use_kernel("panel-c8", capacity=1024)
    print(level, "built/loaded in", round(time.perf_counter() - t, 1), "s", sm.kernel_report.cache_dir, file=sys.stderr)
    models[level] = sm
prompts = [encode_prompt(models[LEVELS[0]].tokenizer, q)
           for q in load_prompts("mtbench,humaneval", split="heldout", n=4, seed=0)]
steps, outs = interleaved_steps({k: (sm, None) for k, sm in models.items()}, prompts, rounds=4, tokens=96)
rates = {k: [1000 * x for x in v] for k, v in steps.items()}
print(json.dumps({"threads": torch.get_num_threads(), "precision": precision,
                  "step_ms_median": {k: round(statistics.median(v), 3) for k, v in rates.items()},
                  "step_ms_min": {k: round(min(v), 3) for k, v in rates.items()},
                  "same_tokens": all(v == outs[LEVELS[0]] for v in outs.values())}))
