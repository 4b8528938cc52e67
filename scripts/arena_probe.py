"""A copy's packed weights in one huge-page block (``kernels/lowbit/arena.py``) against each buffer in its own
allocation, as before, in one process and one model, interleaved by the one harness: the kernel's 8-token verify
block and whole-model int8 / int4 drafts.

Ways: the kernel's own block copy (built with the model, before anything compiles, packed as the kernel now packs
it); fresh block copies built after the kernel compiled, each buffer on its own (``apart``) or packed (``arena``);
int8 / int4 draft copies, each buffer on its own or packed. The one-token step (inductor's own product over the
model's weights, which this does not move) is timed as the ratios' denominator. Every way must give the same logits
and draft tokens.

Usage: python scripts/arena_probe.py --threads 2 --rounds 25
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from unittest import mock

import torch

import skipsearch.kernels.panel as panel
from skipsearch.engine.harness import time_interleaved
from skipsearch.kernels.lowbit import arena
from skipsearch.kernels.lowbit.modules import LowbitLinear
from skipsearch.methods.precision import copy as precision_copy


def _storages(*modules) -> int:
    """How many storages hold the stand-ins' buffers under ``modules`` (1: one block)."""
    return len({t.untyped_storage().data_ptr() for top in modules for m in top.modules()
                if isinstance(m, LowbitLinear) for t in m._buffers.values() if t is not None})


@contextlib.contextmanager
def _apart():
    """Copies built inside are not packed: each buffer stays its own allocation, as before."""
    with mock.patch.object(arena, "pack", lambda modules: 0), \
            mock.patch.object(precision_copy, "pack", lambda modules: 0):  # shared_copy imports it when called
        yield


def main() -> None:
    from _common import BLOCK, compiled_probe, copies_both_ways, filled_cache, forward_on, print_agreement, whole_draft

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=6, help="draft tokens per timed draft")
    args, sm = compiled_probe(ap)
    runner = sm._runner
    with _apart():
        rows_apart = torch.compile(panel.shared_copy(sm.hf, panels=True), dynamic=False)
    rows = {"block kernel's": runner._rows_module, "block apart": rows_apart,
            "block arena": torch.compile(panel.shared_copy(sm.hf, panels=True), dynamic=False)}
    copies = copies_both_ways(sm, args.schemes, _apart, ("apart", "arena"))
    for name, module in [*rows.items(), *((k, c) for k, c in copies.items())]:
        parts = [module] if name.startswith("block") else [*module.attn, *module.mlp, module.head]
        assert (_storages(*parts) == 1) == (not name.endswith("apart")), f"{name}: {_storages(*parts)} storages"

    n = args.context
    cache = filled_cache(sm, n, args.k + 8)

    def full(name: str | None, ids) -> torch.Tensor:
        return forward_on(sm, cache, n, torch.tensor(ids), rows[name] if name else None)

    calls = {"step": lambda: full(None, [42])}
    calls |= {w: (lambda w=w: full(w, BLOCK)) for w in rows}
    calls |= {name: (lambda c=name: whole_draft(sm, copies[c], cache, n, args.k)) for name in copies}
    calls["step"]()  # compiles what is new; every way must agree
    for w in ("block kernel's", "block arena"):
        print_agreement(f"{w} against block apart", calls["block apart"](), calls[w]())
    for scheme in args.schemes:
        print_agreement(scheme, calls[f"{scheme} apart"](), calls[f"{scheme} arena"]())
    med = {k: t.median * 1e3 for k, t in time_interleaved(calls, rounds=args.rounds, device=sm.device).items()}
    step = med.pop("step")
    huge = next((line.split()[1] for line in Path("/proc/self/smaps_rollup").read_text().splitlines()
                 if line.startswith("AnonHugePages:")), "?") if Path("/proc/self/smaps_rollup").exists() else "?"
    print(f"\n{args.model} on {args.kernel}, {args.threads} thread(s), context {n}, {args.rounds} rounds, drafts of "
          f"{args.k} tokens; one-token step {step:.2f} ms; the process's memory on huge pages: {huge} kB")
    print("| call | ms (a draft: per token) | c or v(8) |\n|---|---:|---:|")
    for name, ms in med.items():
        per = 1 if name.startswith("block") else args.k
        print(f"| {name} | {ms / per:.2f} | {ms / per / step:.3f} |")


if __name__ == "__main__":
    main()
