"""llama.cpp Q8_0 plain, 12 held-out prompts x 96 tokens, five passes back to back, each in a server of its own,
alone: how much llama.cpp's own figure moves with nothing else changing. Needs SKIPSEARCH_LLAMA_SERVER and the
Q8_0 GGUF a bench with --target-precision int8 wrote.

    PYTHONPATH=. .venv/bin/python studies/int8-target/llama_spread.py [THREADS ...]
"""
import glob
import os
import sys
import tempfile
from pathlib import Path

from skipsearch.bench import llamacpp as lp
from skipsearch.data import context_of, encode_all_within, load_prompts
from skipsearch.model.loader import load_model

sm = load_model("smollm2-135m", device="cpu", dtype="float32")
prompts = load_prompts("mtbench,humaneval", split="heldout", n=12)
ids = encode_all_within(sm.tokenizer, prompts, context=context_of(sm.hf.config), max_new_tokens=96)
target = glob.glob(os.path.expanduser("~/.cache/skipsearch/llama.cpp/*/target-q8_0.gguf"))[0]
server = os.environ["SKIPSEARCH_LLAMA_SERVER"]
plain = lp.Setting("plain", lp.PLAIN, ())
ctx = lp.context_size(ids, 96)
for threads in [int(t) for t in sys.argv[1:]] or [2]:
    for i in range(5):
        r = lp.run_setting(server, target, plain, ids, [()] * len(ids), max_new_tokens=96, threads=threads,
                           context=ctx, log=Path(tempfile.gettempdir()) / f"llama-spread-{i}.log")
        assert r.error is None, r.error
        print(f"threads {threads} pass {i}: decode {r.tokens_per_s:.1f} tok/s, "
              f"with prompt {r.tokens_per_s_with_prompt:.1f}", flush=True)
