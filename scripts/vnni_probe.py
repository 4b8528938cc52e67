"""Weight-only products against int8-activation (VNNI) products in compiled whole-model int8 / int4 drafts, in one
process and one model, interleaved by the one harness, with each draft's acceptance on greedy continuations.

Before: a precision draft's linears run ``skipsearch::int8_wo_linear`` / ``int4_wo_linear`` (fp32 activations, each
weight widened to fp32). After: they run ``skipsearch::int8_dq_linear`` / ``int4_dq_linear``
(``kernels/lowbit/csrc/dq.cpp``: activations quantized to int8 per block, VNNI dot products). Both copies hold the
same quantized weights; the step is the kernel's own one-token step, timed in the same rounds.

α: for each held-out prompt, the full model's greedy continuation (``--new`` tokens) is fed to each draft model
teacher-forced, eagerly; α is the share of continuation positions where the draft's argmax is the full model's next
token (the acceptance rate of a greedy draft of one token).

Usage: python scripts/vnni_probe.py --threads 2 --schemes int8 int4 --rounds 25
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

from skipsearch.engine.harness import time_interleaved
from skipsearch.kernels.lowbit import convert
from skipsearch.methods.precision import copy as precision_copy


def main() -> None:
    from _common import compiled_probe, prompt_ids, whole_draft

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=6, help="draft tokens per timed draft")
    ap.add_argument("--prompts", type=int, default=12, help="held-out prompts for α (0: time only)")
    ap.add_argument("--new", type=int, default=96, help="greedy tokens per prompt for α")
    args, sm = compiled_probe(ap)
    if not convert.int8_activations():
        raise SystemExit("this CPU has no AVX-512 VNNI: the schemes run the weight-only products here")
    copies = {}
    for scheme in args.schemes:  # each copy built anew: quantized_copy keeps one per model and scheme
        with mock.patch.object(convert, "int8_activations", lambda: False):
            copies[f"{scheme} before"] = precision_copy.quantized_copy(sm, scheme)
        precision_copy._COPIES[sm].pop(scheme)
        copies[f"{scheme} after"] = precision_copy.quantized_copy(sm, scheme)

    n = args.context
    cache = sm.decode_cache(n + args.k + 8)
    sm.forward(torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(0)), start=0, cache=cache)

    def draft(name: str) -> list[int]:
        return whole_draft(sm, copies[name], cache, n, args.k)

    def step() -> torch.Tensor:
        out = sm.forward(torch.tensor([42]), start=n, cache=cache)
        sm.crop(cache, n)
        return out

    calls = {"step before": step, "step after": step} | {name: (lambda c=name: draft(c)) for name in copies}
    for scheme in args.schemes:  # compiles each draft's graph
        print(f"{scheme}: draft tokens before {calls[f'{scheme} before']()}, after {calls[f'{scheme} after']()}")
    med = {k: t.median * 1e3 for k, t in time_interleaved(calls, rounds=args.rounds, device=sm.device).items()}

    prompts = prompt_ids(sm, "mtbench,humaneval", split="heldout", n=args.prompts) if args.prompts else []
    hits = {name: 0 for name in copies}
    total = 0
    with sm.eager():
        for ids in prompts:
            cont = _greedy(sm, ids, args.new)
            seq = torch.tensor(ids + cont[:-1])
            total += len(cont)
            for name, stand_in in copies.items():
                every = range(sm.num_layers)
                with sm.substituted(**stand_in.stand_ins(every, every)), sm.draft_head(stand_in.head):
                    logits = sm.forward(seq, start=0, cache=sm.new_cache())
                hits[name] += int((logits[len(ids) - 1:].argmax(-1) == torch.tensor(cont)).sum())

    print(f"\n{args.model} on {args.kernel}, {args.threads} thread(s), context {n}, {args.rounds} rounds, drafts of "
          f"{args.k} tokens (ms per token); α over {len(prompts)} held-out prompts x {args.new} greedy tokens")
    print("| call | weight-only: ms | int8 activations: ms | saved ms | c before | c after | α before | α after |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| step | {med['step before']:.2f} | {med['step after']:.2f} | | | | | |")
    for scheme in args.schemes:
        b, a = med[f"{scheme} before"] / args.k, med[f"{scheme} after"] / args.k
        print(f"| {scheme} draft token | {b:.2f} | {a:.2f} | {b - a:.2f} | {b / med['step before']:.3f} | "
              f"{a / med['step after']:.3f} | {_share(hits[f'{scheme} before'], total)} | "
              f"{_share(hits[f'{scheme} after'], total)} |")


def _share(hits: int, total: int) -> str:
    return f"{hits / total:.3f}" if total else "–"


def _greedy(sm, ids: list[int], new: int) -> list[int]:
    """The full model's greedy continuation of ``ids``, eagerly."""
    from skipsearch.engine.surrogate import calibrate

    return list(calibrate(sm, [ids], max_new_tokens=new).continuations[0])


if __name__ == "__main__":
    main()
