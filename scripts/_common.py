"""What the report scripts share: the model and its prompts set up one way, and one int-list option parser.

A script run as ``python scripts/NAME.py`` finds this module beside it; a calibration (prompts and the full
model's greedy continuations) comes from ``skipsearch.engine.calibration.calibrate_on``, as in every command.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from skipsearch.config import ConfigError, int_list
from skipsearch.data import encode_prompt, load_prompts
from skipsearch.model.loader import load_model
from skipsearch.model.skippable import SkippableModel


def ints_or_exit(text: str, option: str) -> tuple[int, ...]:
    """``"3,5,7"`` -> (3, 5, 7); anything else ends the script with the option's one-line error, as argparse would."""
    try:
        return int_list(text, option)
    except ConfigError as e:
        raise SystemExit(str(e)) from None


def script_model(model: str, *, threads: int | None = None, device: str = "auto",
                 dtype: str = "auto") -> SkippableModel:
    """The model a report measures: torch's intra-op threads set first (None or 0: torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    return load_model(model, device=device, dtype=dtype)


def named_prompt_ids(sm: SkippableModel, dataset: str, *, split: str, n: int,
                     seed: int = 0) -> list[tuple[str, list[int]]]:
    """(``source:id``, token ids) of ``n`` prompts of ``dataset``'s ``split`` (held-out for a report's figures)."""
    return [(f"{p.source}:{p.id}", encode_prompt(sm.tokenizer, p))
            for p in load_prompts(dataset, split=split, n=n, seed=seed)]


def prompt_ids(sm: SkippableModel, dataset: str, *, split: str, n: int, seed: int = 0) -> list[list[int]]:
    """Token ids of ``n`` prompts of ``dataset``'s ``split``."""
    return [ids for _, ids in named_prompt_ids(sm, dataset, split=split, n=n, seed=seed)]


def compiled_probe(ap: argparse.ArgumentParser) -> tuple[argparse.Namespace, SkippableModel]:
    """The options the compiled-draft probes share (model, threads, kernel, schemes, context, rounds) added to
    ``ap`` and parsed, and the model on that kernel in fp32 on the CPU, its cache room for twice the context."""
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernel", default="panel-c8")
    ap.add_argument("--schemes", nargs="+", default=["int8", "int4"])
    ap.add_argument("--context", type=int, default=150, help="tokens in the cache before the timed calls")
    ap.add_argument("--rounds", type=int, default=25)
    args = ap.parse_args()
    sm = script_model(args.model, threads=args.threads, device="cpu", dtype="float32")
    sm.use_kernel(args.kernel, capacity=2 * args.context)
    return args, sm


def print_before_after(med: dict[str, float], names: tuple[str, ...], *, drafts: tuple[str, ...], k: int,
                       columns: tuple[str, str, str, str], ratio_of: tuple[str, ...]) -> None:
    """A probe's markdown table of median ms timed two ways (``med["<name> before"]``, ``med["<name> after"]``):
    the calls in ``drafts`` are ``k``-token drafts, shown per token; those in ``ratio_of`` also as a ratio to the
    step timed the same way (c for a draft, v(k) for a block). ``columns``: the two ways' and two ratios' headers."""
    print(f"| call | {columns[0]} | {columns[1]} | saved ms | {columns[2]} | {columns[3]} |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        per = k if name in drafts else 1
        b, a = med[f"{name} before"] / per, med[f"{name} after"] / per
        ratio = f"{b / med['step before']:.3f} | {a / med['step after']:.3f}" if name in ratio_of else " | "
        print(f"| {name} | {b:.2f} | {a:.2f} | {b - a:.2f} | {ratio} |")


def whole_draft(sm: SkippableModel, stand_in, cache, start: int, k: int,
                context: contextlib.AbstractContextManager | None = None) -> list[int]:
    """The compiled draft of ``k`` tokens from token 42 at ``start`` with ``stand_in`` (a precision copy) in every
    layer and the head, inside ``context`` if given; ``cache`` cropped back to ``start`` after."""
    every, tokens, token = range(sm.num_layers), [], 42
    with context or contextlib.nullcontext(), sm.substituted(**stand_in.stand_ins(every, every)), \
            sm.draft_head(stand_in.head), sm.compiled_draft():
        for j in range(k):
            token = int(sm.forward(torch.tensor([token]), start=start + j, cache=cache, last_only=True)[-1].argmax())
            tokens.append(token)
    sm.crop(cache, start)
    return tokens


def print_agreement(name: str, before, after) -> None:
    """One line: whether a probe's two ways gave the same draft tokens (lists), or the same argmax and how close
    their logits are (tensors)."""
    if isinstance(before, list):
        print(f"{name}: the same draft tokens both ways: {before == after} ({before})")
    else:
        same = bool(torch.equal(before.argmax(-1), after.argmax(-1)))
        print(f"{name}: the same argmax both ways: {same}; logits within {float((before - after).abs().max()):.2e}")


def check_both_ways(calls: dict, names) -> None:
    """Each name's ``"<name> before"`` and ``"<name> after"`` call run once (compiling what is new), and whether
    they agree printed (``print_agreement``)."""
    for name in names:
        print_agreement(name, calls[f"{name} before"](), calls[f"{name} after"]())


BLOCK = (42, 7, 9, 11, 3, 5, 8, 100)  # the probes' 8-token verify block


def filled_cache(sm: SkippableModel, n: int, room: int):
    """A decode cache of ``sm`` with room for ``n + room`` tokens, its first ``n`` random tokens (seed 0)."""
    cache = sm.decode_cache(n + room)
    sm.forward(torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(0)), start=0, cache=cache)
    return cache


def forward_on(sm: SkippableModel, cache, start: int, ids: torch.Tensor, rows=None) -> torch.Tensor:
    """``sm``'s forward of ``ids`` at ``start`` (``cache`` cropped back to ``start`` after), with ``rows`` (a
    compiled block copy) in the kernel's block copy's place for the call if given."""
    runner = sm._runner  # the probes swap the runner's block copy; nothing else reaches into it
    kept = runner._rows_module
    runner._rows_module = kept if rows is None else rows
    try:
        out = sm.forward(ids, start=start, cache=cache)
    finally:
        runner._rows_module = kept
    sm.crop(cache, start)
    return out


def copies_both_ways(sm: SkippableModel, schemes, apart, names: tuple[str, str]) -> dict:
    """Each scheme's precision draft copy built twice, anew (``quantized_copy`` keeps one per model and scheme):
    inside ``apart()`` (a new context each time, that changes how it is built), then as the library builds it;
    keyed ``"<scheme> <names[0]>"`` and ``"<scheme> <names[1]>"``."""
    from skipsearch.methods.precision import copy as precision_copy

    copies = {}
    for scheme in schemes:
        precision_copy._COPIES.get(sm, {}).pop(scheme, None)
        with apart():
            copies[f"{scheme} {names[0]}"] = precision_copy.quantized_copy(sm, scheme)
        precision_copy._COPIES[sm].pop(scheme)
        copies[f"{scheme} {names[1]}"] = precision_copy.quantized_copy(sm, scheme)
    return copies
