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


def ab_options(precision: str = "int8", kernel: str = "panel-c2") -> argparse.Namespace:
    """The options of this folder's in-process A/B scripts (``asserts_ab.py``, ``argmax_ab.py``): the target's
    precision, the kernel, threads, tokens, prompts, rounds, and a profile whose drafts both sides decode with."""
    p = argparse.ArgumentParser()
    p.add_argument("--precision", default=precision)
    p.add_argument("--kernel", default=kernel)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", default=None, help="decode with this profile's drafts (default: plain)")
    return p.parse_args()


def loaded_side(a: argparse.Namespace) -> tuple:
    """One side of an in-process A/B (``ab_options``): the target on ``a.kernel``, loaded under whatever the caller
    has patched meanwhile, and a callable giving a fresh drafter (a profile's; None for plain decoding), called once
    here so that the drafts' copies are made and their graphs built under the same patch."""
    from skipsearch.api.decode import drafter_factory
    from skipsearch.model.loader import load_model
    from skipsearch.profile import load_profile

    sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision=a.precision)
    sm.use_kernel(a.kernel, capacity=1024)
    drafters = drafter_factory(load_profile(a.profile), sm) if a.profile else (lambda: None)
    drafters()
    return sm, drafters


def timed_ab(sides: dict, a: argparse.Namespace) -> tuple[dict, int]:
    """``interleaved_steps`` over ``a.prompts`` held-out prompts (as bench draws them) after a 16-token warm-up:
    each side's median ms a token, and on how many prompts the sides decoded the same tokens."""
    from skipsearch.data import encode_prompt, load_prompts

    tokenizer = next(iter(sides.values()))[0].tokenizer
    prompts = [encode_prompt(tokenizer, q) for q in load_prompts("mtbench,humaneval", split="heldout", n=a.prompts,
                                                                 seed=0)]
    steps, tokens = interleaved_steps(sides, prompts, rounds=a.rounds, tokens=a.tokens, warmup=16)
    med = {k: statistics.median(v) * 1e3 for k, v in steps.items()}
    return med, sum(x == y for x, y in zip(*tokens.values(), strict=True))


def interleaved_steps(sides: dict, prompts: list, *, rounds: int, tokens: int, warmup: int = 8):
    """Each side's plain decoding (or a profile's, where a side gives its drafters) of every prompt, the sides
    alternating prompt by prompt, their order reversed every other prompt and round, ``rounds`` times, after one
    untimed decode of the first prompt each. ``sides``: name -> (model, drafters: a callable giving a fresh drafter,
    or None for plain decoding). Returns name -> [seconds a token after the first, prefill excluded, per decode], and
    name -> [the first round's token ids per prompt]. The study scripts' one loop; nothing else may run meanwhile."""
    from skipsearch.engine.decoding import generate

    def decode(name: str, ids: list, n: int):
        sm, drafters = sides[name]
        return generate(sm, ids, drafter=drafters() if drafters else None, max_new_tokens=n)

    for name in sides:
        decode(name, prompts[0], warmup)
    steps: dict[str, list[float]] = {k: [] for k in sides}
    outputs: dict[str, list] = {k: [] for k in sides}
    for r in range(rounds):
        for i, ids in enumerate(prompts):
            for name in list(sides) if (r + i) % 2 == 0 else list(reversed(sides)):
                res = decode(name, ids, tokens)
                s = res.stats
                steps[name].append((s.seconds - s.prefill_seconds) / (s.new_tokens - 1))
                if r == 0:
                    outputs[name].append(list(res.token_ids))
    return steps, outputs


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
    steps, outputs = interleaved_steps({k: (sm, None) for k, (sm, _) in targets.items()}, prompts,
                                       rounds=a.rounds, tokens=a.tokens)
    rates = {k: [1 / x for x in v] for k, v in steps.items()}
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
