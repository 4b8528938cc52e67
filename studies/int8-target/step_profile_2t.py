"""Where a two-thread step of the int8 target goes on its shipped kernel (`panel-c2`): torch.profiler over a 64-token
decode of one held-out prompt after two warm-ups, self CPU time per op (the compiled graph's own C++ kernels and
wrapper are its ``Call CompiledFxGraph`` row's self time).

    .venv/bin/python studies/int8-target/step_profile_2t.py        (alone on the machine)
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate
    from skipsearch.model.loader import load_model

    torch.set_num_threads(2)
    sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision="int8")
    sm.use_kernel("panel-c2", capacity=1024)
    ids = encode_prompt(sm.tokenizer, load_prompts("mtbench,humaneval", split="heldout", n=1, seed=0)[0])
    for _ in range(2):
        generate(sm, ids, max_new_tokens=8)  # warm-up: the graphs loaded, the replays recorded
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = generate(sm, ids, max_new_tokens=64)
    s = result.stats
    step = (s.seconds - s.prefill_seconds) / (s.new_tokens - 1)
    print(f"{s.new_tokens} tokens, {s.seconds:.3f} s, prefill {s.prefill_seconds:.3f} s, step {step * 1e3:.2f} ms")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=55))


if __name__ == "__main__":
    main()
