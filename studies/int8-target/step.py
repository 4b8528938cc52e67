"""The int8 target's plain step against its memory time, and the fp32 target's in the same process, interleaved.

    .venv/bin/python studies/int8-target/step.py [--kernel panel-c8] [--threads 2] [--tokens 96] [--rounds 3]

What it measures, on held-out prompts (mtbench,humaneval, heldout split, as bench draws them):
- read bandwidth: torch's sum of a 256 MB fp32 tensor on the threads given, median of 10;
- each target's bytes a step streams: every linear's weights as the step reads them (int8 + one fp32 scale per
  row, or fp32), the embedding row and the norms aside (under 0.1%);
- each target's plain autoregressive decoding on the kernel (no draft), tokens/s over the decode only (prefill
  excluded), median over the prompts, the two targets alternating prompt by prompt, ``--rounds`` times.
Prints one JSON object. Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def bandwidth() -> float:
    x = torch.ones(64 * 1024 * 1024)  # 256 MB
    x.sum()
    runs = []
    for _ in range(10):
        t = time.perf_counter()
        x.sum()
        runs.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(runs) / 1e9


def streamed_bytes(sm) -> int:
    from torch import nn

    from skipsearch.kernels.lowbit.modules import LowbitLinear

    total = 0
    for m in sm.hf.modules():
        if isinstance(m, LowbitLinear):
            total += m.weight_bytes
        elif isinstance(m, nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kernel", default="panel-c8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate
    from skipsearch.model.loader import load_model

    targets = {}
    for precision in ("int8", "native"):
        sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision=precision)
        t = time.perf_counter()
        sm.use_kernel(a.kernel, capacity=1024)
        built = time.perf_counter() - t
        targets[precision] = (sm, built)
    prompts = [encode_prompt(targets["native"][0].tokenizer, q) for q in
               load_prompts("mtbench,humaneval", split="heldout", n=a.prompts, seed=0)]
    for sm, _ in targets.values():  # warm-up
        generate(sm, prompts[0], max_new_tokens=8)
    rates: dict[str, list[float]] = {k: [] for k in targets}
    outputs: dict[str, list] = {k: [] for k in targets}
    for r in range(a.rounds):
        for i, ids in enumerate(prompts):
            order = list(targets) if (r + i) % 2 == 0 else list(reversed(targets))
            for name in order:
                res = generate(targets[name][0], ids, max_new_tokens=a.tokens)
                s = res.stats
                rates[name].append((s.new_tokens - 1) / (s.seconds - s.prefill_seconds))
                if r == 0:
                    outputs[name].append(res.token_ids)
    gbs = bandwidth()
    out = {"kernel": a.kernel, "threads": a.threads, "bandwidth_gb_s": round(gbs, 2), "prompts": len(prompts),
           "tokens": a.tokens, "rounds": a.rounds}
    for name, (sm, built) in targets.items():
        b = streamed_bytes(sm)
        tps = statistics.median(rates[name])
        out[name] = {"streamed_mb": round(b / 1e6, 1), "memory_time_ms": round(b / gbs / 1e6, 2),
                     "step_ms": round(1000 / tps, 2), "tokens_per_s": round(tps, 1),
                     "step_over_memory_time": round(1000 / tps / (b / gbs / 1e6), 2),
                     "kernel_built_or_loaded_s": round(built, 1)}
    out["int8_outputs_equal_fp32"] = sum(x == y for x, y in zip(outputs["int8"], outputs["native"], strict=True))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
