"""What a compiled draft token and a compiled step spend around their graph, before and after this round's change,
in one process, interleaved by the one harness.

Before: every call of a compiled graph had dynamo check all its guards and patched inductor's settings, and each
draft step switched every attention to the ``panel`` kernel's packed one and back (31 configs). After: a call whose
graph has run again without compiling skips the guards that do not tell the graphs apart and the settings patch
(``CompiledBlocks._call_key``), and a draft switches the attentions once for all its steps
(``CompiledBlocks.drafting``, held by ``SkippableModel.compiled_draft``). Both run the same graphs; the probe
checks that both give the same tokens and logits.

Timed: a K-token greedy draft of the whole-model int8 (and int4) copy, as a precision draft or a hybrid's fallback
runs it (one-token forwards, argmax, the cache cut back after), per token; the full model's one-token step; an
8-token verify block. c is a draft token over the step of the same mode.

Usage: python scripts/draft_overhead_probe.py --threads 2 --schemes int8 int4 --rounds 25
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from skipsearch.engine.harness import time_interleaved
from skipsearch.methods.precision.copy import quantized_copy


class _Forgetful(set):
    """A set that keeps nothing: every call is checked in full, as before the change."""

    def add(self, item) -> None:
        return None


def main() -> None:
    from _common import compiled_probe, print_before_after

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=6, help="draft tokens per timed draft")
    args, sm = compiled_probe(ap)
    runner = sm._runner  # the probe switches the runner between the two ways; nothing else reaches into it
    reused, forgetful = runner._reused, _Forgetful()
    cache = sm.decode_cache(args.context + args.k + 8)
    n = args.context
    sm.forward(torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(0)), start=0, cache=cache)
    block = torch.tensor([42, 7, 9, 11, 3, 5, 8, 100])

    @contextlib.contextmanager
    def way(name: str):
        before = name == "before"
        runner._reused = forgetful if before else reused
        if before:  # the draft context per step, as before: compiled_draft holds none
            runner.drafting = contextlib.nullcontext
        try:
            yield before
        finally:
            runner._reused = reused
            runner.__dict__.pop("drafting", None)

    def draft(scheme: str, name: str) -> list[int]:
        copy, every = quantized_copy(sm, scheme), range(sm.num_layers)
        tokens, token = [], 42
        with way(name) as before, sm.substituted(**copy.stand_ins(every, every)), sm.draft_head(copy.head), \
                sm.compiled_draft():
            for j in range(args.k):
                with runner._draft_context() if before else contextlib.nullcontext():
                    logits = sm.forward(torch.tensor([token]), start=n + j, cache=cache, last_only=True)[-1]
                token = int(logits.argmax())
                tokens.append(token)
        sm.crop(cache, n)
        return tokens

    def full(ids: torch.Tensor, name: str) -> torch.Tensor:
        with way(name):
            out = sm.forward(ids, start=n, cache=cache)
        sm.crop(cache, n)
        return out

    ways = ("before", "after")
    calls = {f"step {w}": (lambda w=w: full(torch.tensor([42]), w)) for w in ways}
    calls |= {f"block {w}": (lambda w=w: full(block, w)) for w in ways}
    for scheme in args.schemes:
        calls |= {f"{scheme} {w}": (lambda s=scheme, w=w: draft(s, w)) for w in ways}
    for name in ("step", "block", *args.schemes):  # compiles what is new; both ways give the same
        a, b = calls[f"{name} before"](), calls[f"{name} after"]()
        same = a == b if isinstance(a, list) else bool(torch.equal(a, b))
        print(f"{name}: the same {'tokens' if isinstance(a, list) else 'logits'} both ways: {same}")
    med = {k: t.median * 1e3 for k, t in time_interleaved(calls, rounds=args.rounds, device=sm.device).items()}
    print(f"\n{args.model} on {args.kernel}, {args.threads} thread(s), context {n}, {args.rounds} rounds, "
          f"drafts of {args.k} tokens (ms per token)")
    print_before_after(med, ("step", "block", *args.schemes), drafts=tuple(args.schemes), k=args.k,
                       columns=("before: ms", "after: ms", "c before", "c after"), ratio_of=tuple(args.schemes))


if __name__ == "__main__":
    main()
