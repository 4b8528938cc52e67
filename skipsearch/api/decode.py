"""``skipsearch decode`` as a function: prompts decoded one at a time (``decode_prompts``) or in batches
(``decode_batches``) with a profile's draft or plainly, each prompt checked against the model's context first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from skipsearch import methods
from skipsearch.config import AUTOREGRESSIVE, GREEDY, ConfigError, DraftConfig, SamplingParams
from skipsearch.data import Prompt, check_chars, check_tokens, context_of, encode_prompt
from skipsearch.engine.batched import BatchRefused, BatchResult, batch_slots, check_fits, generate_batch
from skipsearch.engine.decoding import DecodeResult, Drafter, generate
from skipsearch.files.schedule import draft_length
from skipsearch.kernels import Kernel
from skipsearch.model.skippable import SkippableModel
from skipsearch.notices import long_step
from skipsearch.profile import Profile, load_profile

_log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Decoded:
    prompt: Prompt
    prompt_token_ids: tuple[int, ...]
    result: DecodeResult
    text: str


def drafter_factory(profile: Profile | None, sm: SkippableModel) -> Callable[[], Drafter | None]:
    """A function that builds a fresh drafter for ``profile`` (plain decoding without one).

    Drafters hold per-sequence state (the adaptive exit threshold, a lookup index), hence one per prompt.
    The first is built here, so that parameters that do not fit the model fail before any prompt.
    """
    if profile is None:
        return lambda: None
    candidate = profile.candidate
    methods.build_drafter(candidate, sm)
    return lambda: methods.build_drafter(candidate, sm)


def decode_prompts(
    sm: SkippableModel,
    prompts: Sequence[Prompt],
    *,
    config: DraftConfig = AUTOREGRESSIVE,
    drafters: Callable[[], Drafter | None] | None = None,
    sampling: SamplingParams = GREEDY,
    max_new_tokens: int = 128,
    seed: int = 0,
    on_text: Callable[[int, str], None] | None = None,
    kernel: Kernel | None = None,
) -> Iterator[Decoded]:
    """Decode each prompt and yield its result as soon as it is done, so that a caller can write
    it before the next starts: an interrupt or a failure later loses nothing that finished.

    Every prompt is encoded and checked (not empty, fits the model's context with
    ``max_new_tokens`` more) here, before the first is decoded: bad input fails at the call, in
    milliseconds. ``on_text(index, new_text)`` streams text as it is produced. ``drafters`` (from
    ``drafter_factory``) gives each prompt a fresh drafter; without it, ``config`` is the
    layer-skip draft config. ``kernel`` (a compiled one is built here, once, for the longest prompt) runs the
    full model's forwards; None keeps what ``sm`` runs.
    """
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    work = [(p, encode_checked(sm, p, max_new_tokens=max_new_tokens)) for p in prompts]
    # a compiled draft's graph compiles now, not in a prompt's time: while the kernel's block may still be building
    warm = (lambda: _warm(sm, drafters())) if drafters is not None else None
    if kernel is not None:
        sm.use_kernel(kernel, capacity=max(len(ids) for _, ids in work) + max_new_tokens, warm=warm)
    elif warm is not None and sm.kernel.compiled:
        warm()
    return _decode_each(sm, work, config=config, drafters=drafters, sampling=sampling,
                        max_new_tokens=max_new_tokens, seed=seed, on_text=on_text)


def _warm(sm: SkippableModel, drafter: Drafter | None) -> None:
    """Compile ``drafter``'s draft graph now (``Drafter.warm``), under a notice, so no decode's time counts it."""
    if drafter is not None:
        with long_step(_log, "the draft's graph (compiled, or loaded where the kernel keeps its graphs) ..."):
            drafter.warm(sm)


def _decode_each(sm: SkippableModel, work: list[tuple[Prompt, list[int]]], *, config: DraftConfig,
                 drafters: Callable[[], Drafter | None] | None, sampling: SamplingParams, max_new_tokens: int,
                 seed: int, on_text: Callable[[int, str], None] | None) -> Iterator[Decoded]:
    for i, (prompt, ids) in enumerate(work):
        stream = _TextStream(sm.tokenizer, lambda text, i=i: on_text(i, text)) if on_text else None
        drafter = drafters() if drafters is not None else None
        result = generate(
            sm, ids, config=None if drafter is not None else config, drafter=drafter, sampling=sampling,
            max_new_tokens=max_new_tokens, seed=seed, on_tokens=stream.push if stream else None,
        )
        text = stream.finish() if stream else sm.tokenizer.decode(list(result.token_ids), skip_special_tokens=True)
        yield Decoded(prompt, tuple(ids), result, text)


@dataclass(frozen=True)
class DecodedBatch:
    """One batch's prompts, their outputs (``result.token_ids``, row for row) and texts, and the batch's stats."""

    prompts: tuple[Prompt, ...]
    prompt_token_ids: tuple[tuple[int, ...], ...]
    result: BatchResult
    texts: tuple[str, ...]


def check_batch_profile(path: str) -> None:
    """``decode --batch-size`` with a profile whose method cannot decode a batch: one line, before the model
    loads."""
    methods.check_batchable(load_profile(path).candidate)


def decode_batches(sm: SkippableModel, prompts: Sequence[Prompt], *, profile: Profile | None, batch_size: int,
                   sampling: SamplingParams = GREEDY, max_new_tokens: int = 128,
                   kernel: Kernel | None = None) -> Iterator[DecodedBatch]:
    """Decode ``prompts`` in batches of ``batch_size`` (the last may be smaller), each yielded when it is done.

    Everything that can be refused is refused here, in one line, before the first forward: sampling (batched
    decoding is greedy), a profile whose method cannot decode a batch, a prompt that is empty or too long, and a
    batch that does not fit the memory available. The draft length of a batch of B is the profile's schedule at B
    (``Schedule.k_for``) where it has one, else the profile's K (0 without a profile). ``kernel`` (a compiled one
    is built here for the longest prompt, with its graphs for every batch size the prompts make, and the compiled
    draft of a batch of one that drafts, so no batch's time counts a compile) runs the full model's forwards; None
    keeps what ``sm`` runs."""
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not sampling.greedy:
        raise BatchRefused("batched decoding is greedy only: leave --temperature at 0, or decode with --batch-size 1")
    candidate = profile.candidate if profile is not None else None
    if candidate is not None:
        methods.batch_drafter(candidate, sm)  # a method that cannot batch is refused here
    work = [(p, encode_checked(sm, p, max_new_tokens=max_new_tokens)) for p in prompts]
    batches = [work[i : i + batch_size] for i in range(0, len(work), batch_size)]
    longest: dict[int, int] = {}  # batch size -> the longest prompt of its batches: what each check must hold
    for batch in batches:
        longest[len(batch)] = max(longest.get(len(batch), 0), *(len(ids) for _, ids in batch))
    for size, tokens in longest.items():
        check_fits(sm, batch_size=size, prompt_tokens=tokens, max_new_tokens=max_new_tokens, k=batch_k(profile, size))
    if kernel is not None:
        sm.use_kernel(kernel, capacity=max(longest.values()) + max_new_tokens)
    if sm.kernel.compiled:  # each batch size's graphs compile now, not inside its first batch's time
        for size, tokens in longest.items():
            if size > 1:
                k = batch_k(profile, size)
                # its graphs too (their estimate needs the kernel built): refused before they compile
                check_fits(sm, batch_size=size, prompt_tokens=tokens, max_new_tokens=max_new_tokens, k=k)
                sm.batch_cache(size, batch_slots(prompt_tokens=tokens, max_new_tokens=max_new_tokens, k=k))
        if 1 in longest and batch_k(profile, 1):  # a batch of one drafts as one sequence does, compiled: warmed too
            _warm(sm, methods.batch_drafter(candidate, sm).single())
    return _decode_batches(sm, batches, profile=profile, candidate=candidate, max_new_tokens=max_new_tokens)


def batch_k(profile: Profile | None, batch_size: int) -> int:
    """The draft length ``profile`` runs at ``batch_size``: its schedule's where it has one, else its own K."""
    candidate = profile.candidate if profile is not None else None
    if candidate is None or candidate.is_autoregressive:
        return 0
    return draft_length(profile.schedule, candidate.draft.max_draft_tokens, batch_size)


def _decode_batches(sm: SkippableModel, batches: list[list[tuple[Prompt, list[int]]]], *, profile: Profile | None,
                    candidate, max_new_tokens: int) -> Iterator[DecodedBatch]:
    for batch in batches:
        k = batch_k(profile, len(batch))
        drafter = methods.batch_drafter(candidate, sm) if candidate is not None else None  # fresh state per batch
        ids = [ids for _, ids in batch]
        result = generate_batch(sm, ids, drafter=drafter, k=k if drafter is not None else 0,
                                max_new_tokens=max_new_tokens, check_memory=False)
        texts = tuple(sm.tokenizer.decode(list(out), skip_special_tokens=True) for out in result.token_ids)
        yield DecodedBatch(tuple(p for p, _ in batch), tuple(tuple(i) for i in ids), result, texts)


def context_length(sm: SkippableModel) -> int | None:
    """The most positions the model was made for (its max_position_embeddings); None if unknown."""
    return context_of(sm.hf.config)


def encode_checked(sm: SkippableModel, prompt: Prompt, *, max_new_tokens: int) -> list[int]:
    """The prompt's token ids, or a one-line DataError naming the prompt if it cannot be decoded:
    empty, or too long for the model's context once ``max_new_tokens`` are added; a prompt far too long is
    refused by its length, untokenized (``data.check_chars``)."""
    limit = context_length(sm)
    check_chars(sm.tokenizer, prompt, context=limit, max_new_tokens=max_new_tokens)
    return check_tokens(prompt, encode_prompt(sm.tokenizer, prompt), context=limit, max_new_tokens=max_new_tokens)


class _TextStream:
    """Text of a token stream, written as it grows, never showing a character half-decoded.

    A byte-level tokenizer splits one character (an emoji, a CJK ideograph) over several tokens;
    decoded alone, the first of them is U+FFFD. Text ending in U+FFFD is therefore held back until
    more tokens arrive, and whatever is left is written at the end.
    """

    def __init__(self, tokenizer, write: Callable[[str], None]) -> None:
        self.tokenizer, self.write = tokenizer, write
        self.ids: list[int] = []
        self.shown = 0  # characters of the decoded text written so far

    def push(self, new: Sequence[int]) -> None:
        # Decode the whole continuation each time: a token may complete a character begun earlier.
        self.ids.extend(new)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        self._write_to(text, len(text.rstrip("\ufffd")))

    def finish(self) -> str:
        """Write what was held back; return the whole text."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        self._write_to(text, len(text))
        return text

    def _write_to(self, text: str, end: int) -> None:
        if end > self.shown:
            self.write(text[self.shown:end])
            self.shown = end
