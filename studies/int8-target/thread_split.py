"""Where each of the two threads of the int8 target's plain decoding spends its time: the loop here decodes 4
held-out prompts x 96 tokens on `panel-c2` over and over (prefill included, as a user's decode has it), and
``perf record`` samples both threads for 10 s once it is warm; then every sample is put in one bucket by its
symbol and library, thread by thread.

    bash -c '.venv/bin/python studies/int8-target/thread_split.py loop & sleep 60; \
             .venv/bin/python studies/int8-target/thread_split.py record'      (alone on the machine)

or simply ``.venv/bin/python studies/int8-target/thread_split.py`` (both, in order). Needs ``perf``.
"""

from __future__ import annotations

import collections
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

READY = Path("/tmp/thread_split.ready")
DATA = Path("/tmp/thread_split.perf")
BUCKETS = (  # (bucket, test on (symbol, library)), the first that matches
    ("int8 products", lambda s, d: "dense_panel" in s or "run_dense" in s),
    ("OpenMP: waiting for the next parallel region", lambda s, d: "libgomp" in d),
    ("attention op", lambda s, d: "attend" in s or "attention::" in s),
    ("compiled graph's kernels and wrapper", lambda s, d: d.endswith(".main.so")),
    ("Python", lambda s, d: "libpython" in d or "libtorch_python" in d),
    ("libc / libstdc++ (allocation, casts)", lambda s, d: "libc.so" in d or "libstdc" in d),
    ("libtorch_cpu (eager ops, dispatcher, MKL)", lambda s, d: "libtorch_cpu" in d or "libc10" in d),
    ("the kernel", lambda s, d: "kernel" in d),
)


def loop(seconds: float = 40.0) -> None:
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate
    from skipsearch.model.loader import load_model

    sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision="int8")
    sm.use_kernel("panel-c2", capacity=1024)
    prompts = [encode_prompt(sm.tokenizer, q) for q in load_prompts("mtbench,humaneval", split="heldout", n=4, seed=0)]
    generate(sm, prompts[0], max_new_tokens=8)
    READY.write_text(str(os.getpid()))
    t, steps = time.time(), []
    while time.time() - t < seconds:
        for ids in prompts:
            s = generate(sm, ids, max_new_tokens=96).stats
            steps.append((s.seconds - s.prefill_seconds) / (s.new_tokens - 1))
    print(f"step: median {statistics.median(steps) * 1e3:.2f} ms over {len(steps)} decodes")


def record() -> None:
    while not READY.exists():
        time.sleep(1)
    time.sleep(2)
    subprocess.run(["perf", "record", "-F", "1999", "-o", str(DATA), "-p", READY.read_text(), "--", "sleep", "10"],
                   check=True, capture_output=True)
    out = subprocess.run(["perf", "script", "-i", str(DATA), "-F", "tid,ip,sym,dso"], check=True,
                         capture_output=True, text=True).stdout
    counts: collections.Counter = collections.Counter()
    per_thread: collections.Counter = collections.Counter()
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        tid, _, rest = parts
        m = re.match(r"(.*) \((.*)\)$", rest)
        sym, lib = (m.group(1), m.group(2).rsplit("/", 1)[-1]) if m else (rest, "?")
        bucket = next((name for name, test in BUCKETS if test(sym, lib)), "other")
        counts[tid, bucket] += 1
        per_thread[tid] += 1
    for i, (tid, n) in enumerate(per_thread.most_common()):
        print(f"thread {i + 1} ({n} samples)")
        for (t, bucket), k in counts.most_common():
            if t == tid and k / n >= 0.005:
                print(f"  {bucket:46s} {100 * k / n:5.1f}%")


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "both"
    if what == "loop":
        loop()
    elif what == "record":
        record()
    else:
        READY.unlink(missing_ok=True)
        child = subprocess.Popen([sys.executable, __file__, "loop"])
        record()
        child.wait()


if __name__ == "__main__":
    main()
