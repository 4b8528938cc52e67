"""Sibling products run apart against run as one call (``kernels/lowbit/siblings.py``), in one process and one
model, interleaved by the one harness: the kernel's one-token step, its 8-token verify block and whole-model int8 /
int4 drafts.

Before: each linear of a layer is its own product call (a layer's q, k and v; its gate and up), as they were. After:
the stand-ins that read one input keep their packed weights back to back, and the compiled graphs run them as one
call (q, k and v as one; gate and up as one). The blocks are two fresh compiled copies of the kernel's block model, one
with its weights packed apart, one as the kernel now packs them; the drafts are two int8 / int4 copies, one packed
apart (the same quantized numbers). Fresh copies both ways, because the kernel's own block copy, built before
anything compiles, ran 1.4-2 ms slower than a fresh copy of the same weights packed the same way
(``studies/sibling-products-cpu.md``; before each copy's weights moved into one block, ``studies/weight-arena-cpu.md``):
the kernel's own copy is timed as a third way (``block kernel's``).
The one-token step runs inductor's own product, which this does not change: it is timed both ways only as the
ratio's denominator. The probe checks that both ways give the same argmax and logits within a stated tolerance, then
times them round robin.

Usage: python scripts/sibling_probe.py --threads 2 --schemes int8 int4 --rounds 25
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

import skipsearch.kernels.panel as panel
from skipsearch.engine.harness import time_interleaved
from skipsearch.kernels.lowbit import convert


def main() -> None:
    from _common import (
        BLOCK,
        check_both_ways,
        compiled_probe,
        copies_both_ways,
        filled_cache,
        forward_on,
        print_before_after,
        whole_draft,
    )

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=6, help="draft tokens per timed draft")
    args, sm = compiled_probe(ap)
    runner = sm._runner

    def apart():
        return mock.patch.object(convert, "share_siblings", lambda module: None)

    with apart():
        rows_apart = torch.compile(panel.shared_copy(sm.hf, panels=True), dynamic=False)
    rows_one = torch.compile(panel.shared_copy(sm.hf, panels=True), dynamic=False)
    copies = copies_both_ways(sm, args.schemes, apart, ("before", "after"))
    rows = {"before": rows_apart, "after": rows_one, "kernel's": runner._rows_module}
    n = args.context
    cache = filled_cache(sm, n, args.k + 8)

    def draft(name: str) -> list[int]:
        return whole_draft(sm, copies[name], cache, n, args.k)

    def full(name: str, ids) -> torch.Tensor:
        return forward_on(sm, cache, n, torch.tensor(ids), rows[name])

    calls = {f"step {w}": (lambda w=w: full(w, [42])) for w in ("before", "after")}
    calls |= {f"block {w}": (lambda w=w: full(w, BLOCK)) for w in rows}
    calls |= {name: (lambda c=name: draft(c)) for name in copies}
    check_both_ways(calls, ("step", "block", *args.schemes))  # compiles what is new; both ways must agree
    assert torch.equal(calls["block after"](), calls["block kernel's"]()), \
        "the kernel's block copy and a fresh one disagree"
    med = {k: t.median * 1e3 for k, t in time_interleaved(calls, rounds=args.rounds, device=sm.device).items()}
    print(f"\n{args.model} on {args.kernel}, {args.threads} thread(s), context {n}, {args.rounds} rounds, drafts of "
          f"{args.k} tokens (ms per token)")
    print_before_after(med, ("step", "block", *args.schemes), drafts=tuple(args.schemes), k=args.k,
                       columns=("apart: ms", "as one: ms", "c or v(8) before", "after"),
                       ratio_of=("block", *args.schemes))
    own = med["block kernel's"]
    print(f"| block on the kernel's own copy (as one) | | {own:.2f} | | | {own / med['step after']:.3f} |")


if __name__ == "__main__":
    main()
