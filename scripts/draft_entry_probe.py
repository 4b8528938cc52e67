"""What entering and leaving a whole-model draft costs, before and after this round's change, in one process,
interleaved by the one harness (no token is drafted: only the swaps around a draft are timed).

A precision draft or a hybrid's int8 fallback enters, for each draft: its stand-ins swapped in for every attention
and MLP (``SkippableModel.substituted``), its head (``draft_head``), and on the ``panel`` kernel every attention
switched to the packed one (``panel.packed_attention``); and leaves them after. Before: the swaps went through
``nn.Module``'s ``setattr`` / ``getattr``, and each attention config was switched through transformers' setter,
which runs the config's validating ``__setattr__``. After: the layers' ``_modules`` are written directly, and a config
without sub-configs has its name stored directly (``panel._set_attention``). Both leave the model as they found it;
the probe checks it.

Usage: python scripts/draft_entry_probe.py --scheme int8 --rounds 200
"""

from __future__ import annotations

import argparse
import contextlib

from skipsearch.engine.harness import time_interleaved
from skipsearch.kernels import panel
from skipsearch.methods.precision.copy import quantized_copy


def main() -> None:
    from _common import script_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scheme", default="int8")
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    sm = script_model(args.model, threads=args.threads, device="cpu", dtype="float32")
    stand_in, every = quantized_copy(sm, args.scheme), range(sm.num_layers)

    @contextlib.contextmanager
    def before_substituted(tables):
        swapped = []
        for attr, table in (("self_attn", tables["attn"]), ("mlp", tables["mlp"])):
            for i, module in table.items():
                layer = sm.layers[i]
                swapped.append((layer, attr, getattr(layer, attr)))
                setattr(layer, attr, module)
        try:
            yield
        finally:
            for layer, attr, original in reversed(swapped):
                setattr(layer, attr, original)

    @contextlib.contextmanager
    def before_packed():
        attentions = (getattr(layer, "self_attn", None) for layer in sm.layers)
        configs = {id(c): c for c in (sm.hf.config, *(getattr(a, "config", None) for a in attentions))
                   if c is not None and c._attn_implementation == "sdpa"}
        for config in configs.values():
            config._attn_implementation = panel.ATTENTION
        try:
            yield
        finally:
            for config in configs.values():
                config._attn_implementation = "sdpa"

    def before() -> None:
        with before_substituted(stand_in.stand_ins(every, every)), sm.draft_head(stand_in.head), before_packed():
            pass

    def after() -> None:
        with sm.substituted(**stand_in.stand_ins(every, every)), sm.draft_head(stand_in.head), \
                panel.packed_attention(sm):
            pass

    def state() -> tuple:
        return (tuple(id(m) for layer in sm.layers for m in (layer.self_attn, layer.mlp)),
                tuple(layer.self_attn.config._attn_implementation for layer in sm.layers))

    start = state()
    for way in (before, after):
        way()
        print(f"{way.__name__}: the model left as it was: {state() == start}")
    med = {k: t.median * 1e3 for k, t in time_interleaved({"before": before, "after": after},
                                                           rounds=args.rounds).items()}
    print(f"\n{args.model}, {args.scheme} stand-ins for all {sm.num_layers} layers, {args.threads} thread(s), "
          f"{args.rounds} rounds: entering and leaving a draft, before {med['before']:.3f} ms, after "
          f"{med['after']:.3f} ms")


if __name__ == "__main__":
    main()
