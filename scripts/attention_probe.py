"""The ``panel`` kernel's attention on SDPA against ``skipsearch::gqa_attention``, in one process and one model,
interleaved by the one harness: the kernel's one-token step, its 8-token verify block and a whole-model int8 / int4
draft.

Before: ``packed_gqa_attention`` ran ATen's flash attention for CPU (SDPA) over every slot of the static cache, most
of them masked. After: it runs ``skipsearch::gqa_attention`` (``kernels/lowbit/csrc/attention.cpp``), which reads the
cache only up to the last position the mask keeps. The before-step and before-block are second compiled copies of
the kernel's own on the old attention, sharing every weight (the block's packed ones too); a before-draft runs the
same stand-ins on the old attention. So both ways read the same weights from the same memory. The probe checks
that both give the same argmax (step, block, draft tokens) and logits within a stated tolerance, then times them
round robin.

Usage: python scripts/attention_probe.py --threads 2 --schemes int8 int4 --rounds 25
"""

from __future__ import annotations

import argparse
import contextlib
import copy
from unittest import mock

import torch

import skipsearch.kernels.panel as panel
from skipsearch.engine.harness import time_interleaved
from skipsearch.methods.precision.copy import quantized_copy

SDPA_NAME = "probe_packed_gqa_sdpa"  # the before-attention's name with transformers


def packed_gqa_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                    is_causal=None, **kwargs):
    """``packed_gqa_attention`` as it was before the op: the group's queries stacked, the mask repeated, SDPA."""
    B, H, T, D = query.shape
    groups, mask = module.num_key_value_groups, attention_mask
    q = query.reshape(B, H // groups, groups * T, D)
    if T > 1:
        mask = mask[:, :, None].expand(B, 1, groups, T, mask.shape[-1]).reshape(B, 1, groups * T, mask.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(B, H, T, D).transpose(1, 2).contiguous(), None


def main() -> None:
    from _common import check_both_ways, compiled_probe, print_before_after, whole_draft

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=6, help="draft tokens per timed draft")
    args, sm = compiled_probe(ap)
    runner = sm._runner  # the probe swaps the runner's copies and draft context; nothing else reaches into it
    with mock.patch.object(panel, "ATTENTION", SDPA_NAME), \
            mock.patch.object(panel, "packed_gqa_attention", packed_gqa_sdpa):
        sdpa_step = torch.compile(panel.shared_copy(sm.hf, panels=False), dynamic=False)  # the same weights
        rows = runner._rows_module._orig_mod  # the block's copy: its packed weights shared, not packed again
        sdpa_rows = copy.deepcopy(rows, memo={id(t): t for t in (*rows.parameters(), *rows.buffers())})
        sdpa_rows.set_attn_implementation(SDPA_NAME)
        sdpa_rows = torch.compile(sdpa_rows, dynamic=False)
    ways = {"before": (sdpa_step, sdpa_rows, lambda: _stacked(mock.patch.object(panel, "ATTENTION", SDPA_NAME),
                                                              panel.packed_attention(sm))),
            "after": (runner._step_module, runner._rows_module, runner._draft_context)}

    @contextlib.contextmanager
    def way(name: str):
        kept = runner._step_module, runner._rows_module, runner._draft_context
        runner._step_module, runner._rows_module, runner._draft_context = ways[name]
        try:
            yield
        finally:
            runner._step_module, runner._rows_module, runner._draft_context = kept

    n = args.context
    cache = sm.decode_cache(n + args.k + 8)
    sm.forward(torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(0)), start=0, cache=cache)
    block = torch.tensor([42, 7, 9, 11, 3, 5, 8, 100])
    copies = {s: quantized_copy(sm, s) for s in args.schemes}

    def draft(name: str, scheme: str) -> list[int]:
        return whole_draft(sm, copies[scheme], cache, n, args.k, way(name))

    def full(name: str, ids: torch.Tensor) -> torch.Tensor:
        with way(name):
            out = sm.forward(ids, start=n, cache=cache)
        sm.crop(cache, n)
        return out

    calls = {f"step {w}": (lambda w=w: full(w, torch.tensor([42]))) for w in ways}
    calls |= {f"block {w}": (lambda w=w: full(w, block)) for w in ways}
    for scheme in args.schemes:
        calls |= {f"{scheme} {w}": (lambda s=scheme, w=w: draft(w, s)) for w in ways}
    check_both_ways(calls, ("step", "block", *args.schemes))  # compiles what is new; both attentions must agree
    med = {k: t.median * 1e3 for k, t in time_interleaved(calls, rounds=args.rounds, device=sm.device).items()}
    print(f"\n{args.model} on {args.kernel}, {args.threads} thread(s), context {n}, cache of {2 * n} positions, "
          f"{args.rounds} rounds, drafts of {args.k} tokens (ms per token)")
    print_before_after(med, ("step", "block", *args.schemes), drafts=tuple(args.schemes), k=args.k,
                       columns=("SDPA: ms", "gqa_attention: ms", "c or v(8) before", "after"),
                       ratio_of=("block", *args.schemes))


@contextlib.contextmanager
def _stacked(*contexts):
    with contextlib.ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c)
        yield


if __name__ == "__main__":
    main()
