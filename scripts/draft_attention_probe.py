"""A compiled precision draft step on HF's SDPA attention against the ``panel`` kernel's packed attention, in one
process, interleaved by the one harness, beside the kernel's own one-token step.

HF's SDPA attention copies every key/value head across its group over the whole static cache (``repeat_kv``) in
every layer; the ``panel`` kernel's ``packed_gqa_attention`` stacks the queries of a group instead. The kernel's
one-token step and blocks run a copy of the model with packed attention; its drafts (the model itself with the
draft's stand-ins swapped in) run it through ``panel.packed_attention``. This script times a whole-model draft in
each scheme both ways: the same stand-ins, the same cache, the same graph but for the attention; and checks that
both give the same argmax.

Usage: python scripts/draft_attention_probe.py --threads 2 --schemes int8 int4 --rounds 25
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from skipsearch.engine.harness import time_interleaved
from skipsearch.kernels.panel import packed_attention
from skipsearch.methods.precision.copy import quantized_copy


def main() -> None:
    from _common import compiled_probe

    args, sm = compiled_probe(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    runner = sm._runner  # the probe swaps the draft's attention; nothing else reaches into the runner
    cache = sm.decode_cache(args.context + 2)
    token = torch.tensor([42])
    sm.forward(torch.randint(0, 1000, (args.context,), generator=torch.Generator().manual_seed(0)), start=0,
               cache=cache)
    ways = {"hf-sdpa": contextlib.nullcontext, "packed": lambda: packed_attention(sm)}
    print(f"{args.model} on {args.kernel}, {args.threads} thread(s), context {args.context}, {args.rounds} rounds")
    print("| scheme | step ms | draft, HF SDPA attention: ms, c | draft, packed attention: ms, c | same argmax |")
    print("|---|---:|---:|---:|---|")
    for scheme in args.schemes:
        copy, every = quantized_copy(sm, scheme), range(sm.num_layers)

        def draft(way: str, copy=copy, every=every):
            runner._draft_context = ways[way]
            with sm.substituted(**copy.stand_ins(every, every)), sm.draft_head(copy.head), sm.compiled_draft():
                return sm.forward(token, start=args.context, cache=cache, last_only=True)

        argmax = {way: int(draft(way).argmax()) for way in ways}  # compiles both graphs, untimed
        calls = {"step": lambda: sm.forward(token, start=args.context, cache=cache),
                 **{way: (lambda w=way: draft(w)) for way in ways}}
        med = {k: t.median * 1e3 for k, t in time_interleaved(calls, rounds=args.rounds, device=sm.device).items()}
        cells = " | ".join(f"{med[w]:.2f}, {med[w] / med['step']:.3f}" for w in ways)
        print(f"| {scheme} | {med['step']:.2f} | {cells} | {argmax['hf-sdpa'] == argmax['packed']} |", flush=True)


if __name__ == "__main__":
    main()
