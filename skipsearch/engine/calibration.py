"""The calibration set: ``n_prompts`` prompts of a data set's calib split and the full model's greedy
continuations of them, the one entry point every search, re-plan, cost measurement and report calibrates
through, so that a study, a cost file and a re-planned profile all mean the same workload.

The prompts come from the calib half (``data.load_prompts``), never the held-out half that ``bench``
scores on; ``seed`` picks which of them, as it does in ``load_prompts``. A report that measures what a draft
accepts on prompts it was not tuned on calibrates on the held-out half (``split``).
"""

from __future__ import annotations

from collections.abc import Callable

from skipsearch.data import Prompt, context_of, encode_all_within, encode_prompt, load_prompts
from skipsearch.engine.surrogate import Calibration, calibrate
from skipsearch.model.skippable import SkippableModel

SPLIT = "calib"


def calibration_prompts(dataset: str, *, n_prompts: int, seed: int = 0, split: str = SPLIT) -> tuple[Prompt, ...]:
    """The prompts ``calibrate_on`` encodes. Read without a model: callers read them first, so that a bad
    prompt file fails in milliseconds, before the model loads."""
    return load_prompts(dataset, split=split, n=n_prompts, seed=seed)


def calibrate_on(sm: SkippableModel, *, dataset: str = "mtbench", n_prompts: int = 8, max_new_tokens: int = 64,
                 seed: int = 0, split: str = SPLIT, say: Callable[[str], None] | None = None,
                 kernel: str | None = None) -> Calibration:
    """The calibration of ``sm`` on ``n_prompts`` prompts of ``dataset``'s ``split``, each continued greedily
    for ``max_new_tokens`` tokens; ``say`` hears one line before the model runs. With ``kernel`` (a search's), that
    kernel is built first, for the longest prompt and ``max_new_tokens`` more, and the continuations are decoded
    on it, as every later decode of the search is: on ``panel-c8`` 13 ms a token here against 36 eagerly (Zen 5)."""
    prompts = calibration_prompts(dataset, n_prompts=n_prompts, seed=seed, split=split)
    # a prompt that cannot fit the model's context is refused in one line, before the model runs (one far too long
    # by its length alone, before any is tokenized)
    ids = encode_all_within(sm.tokenizer, prompts, context=context_of(sm.hf.config), max_new_tokens=max_new_tokens,
                            encode=encode_prompt)
    if kernel is not None:
        sm.use_kernel(kernel, capacity=max(map(len, ids)) + max_new_tokens)
    if say is not None:
        say(f"calibrating on {len(prompts)} prompts from {dataset} ({split} split) x {max_new_tokens} tokens")
    return calibrate(sm, ids, max_new_tokens=max_new_tokens)


def calibration_workload(dataset: str, n_prompts: int, max_new_tokens: int) -> str:
    """The calibration set in words, as profiles and re-plans record what was traced."""
    return f"{dataset} ({SPLIT} split), {n_prompts} prompts x {max_new_tokens} tokens"


__all__ = ["SPLIT", "calibrate_on", "calibration_prompts", "calibration_workload"]
