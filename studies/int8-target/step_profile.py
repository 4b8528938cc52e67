"""Where a one-thread step of each target goes: torch.profiler over a 64-token decode of one held-out prompt, both
targets on ``panel-c8``, after a warm-up, self CPU time per op (the compiled graph's own kernels and wrapper are its
``Call CompiledFxGraph`` row's self time; the prompt runs eagerly: ``aten::mm`` in fp32, the int8 op in int8).

    .venv/bin/python studies/int8-target/step_profile.py        (alone on the machine)
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate
    from skipsearch.model.loader import load_model

    torch.set_num_threads(1)
    for precision in ("int8", "native"):
        sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision=precision)
        sm.use_kernel("panel-c8", capacity=1024)
        ids = encode_prompt(sm.tokenizer, load_prompts("mtbench,humaneval", split="heldout", n=1, seed=0)[0])
        generate(sm, ids, max_new_tokens=8)  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            result = generate(sm, ids, max_new_tokens=64)
        s = result.stats
        print(f"===== {precision}: {s.new_tokens} tokens, {s.seconds:.3f} s, prefill {s.prefill_seconds:.3f} s")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
