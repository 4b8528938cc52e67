"""The one timing harness: every speed figure skipsearch reports comes out of ``run_rounds``.

``bench``, the objective's timed stage (``objective.time_drafter``), the hierarchical planner's validation
(``methods.hierarchical.planner.validate``) and the report scripts all time through it, so they share one set of
rules:

1. A *contender* (``Contender``) is a name plus ``decode(prompt_ids, max_new_tokens) -> ContenderOutput``,
   Spec-Bench's per-method contract; the word "method" stays with the registry (``skipsearch.methods``),
   whose drafts are only some of the contenders. ``engine_method`` wraps our engine
   (``decoding.generate`` with a fresh drafter per call); the HF ``generate`` modes live in ``bench``,
   which is the only place that needs them. A *batched* contender (``bench.batched``) decodes a batch: its
   "prompt" is a tuple of prompt ids, one per row, and its ``token_ids`` a tuple of the rows' tokens
   (``Batch``); every rule below holds for it as written, a round being every contender once on the same batch.
2. Warm-up: every method decodes the first prompt once, briefly, before anything is timed. First
   calls pay for allocation, lazy imports, packed kernels and HF's generation set-up; that cost
   must land on no one's figure.
3. Rounds: a round is every method once on the same prompt ids, and each prompt gets ``repeats``
   rounds. The order rotates by one place every round, so each method runs first, second, ...
   equally often (exactly so when the number of rounds is a multiple of the number of methods)
   and slow machine drift, thermal or a neighbour's load, spreads evenly over all of them.
4. The baseline is a method like any other: measured in the same process and the same rounds as
   the candidates, never once up front or taken from an earlier run.
5. Each call is timed whole with the one timer (``timing.now``, which synchronises the device):
   prefill, drafting, verification and the loop's own overhead, which is what a user waits for.
   The memory probe is reset just before the clock starts and read just after it stops.
6. Outputs are checked against a named reference method, prompt by prompt and repeat by repeat
   (``check_outputs``). With ``strict=True`` the run stops after the first round in which some
   method's tokens differ from the reference's, with ``LosslessnessError``: greedy speculative
   decoding is lossless, so a difference is a bug, and a speed figure for wrong output means nothing.
7. A method's time is the median over repeats per prompt, summed over prompts (``method_seconds``);
   a speedup is the baseline's time over the method's.

Both wait, before anything else, for any compiled graph a child of this process is still building beside it
(``kernels/precompiled.settle_aside``): a build on the other core would slow whatever ran first.

``time_interleaved`` applies rules 2, 3 and 5 to micro-timings (one forward, one sublayer), which
the cost model samples round robin and summarises by medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from skipsearch.config import ConfigError
from skipsearch.engine import timing
from skipsearch.engine.decoding import Drafter, generate
from skipsearch.kernels.precompiled import settle_aside
from skipsearch.memory import memory_probe
from skipsearch.model.skippable import SkippableModel

OURS_AR = "skipsearch-ar"  # our own engine with no drafter: separates loop overhead from speculation


class LosslessnessError(RuntimeError):
    """A method's greedy output differed from the reference's: a decoder bug, never expected."""


# -- the contender contract -------------------------------------------------------------------------
Batch = tuple[tuple[int, ...], ...]  # a batched contender's output: each row's generated tokens, in row order


@dataclass(frozen=True)
class ContenderOutput:
    """What one decode produced. Counts are None where a contender cannot report them (summed over the rows of a
    batch)."""

    token_ids: tuple[int, ...] | Batch  # generated tokens only (a batched contender's: per row)
    verify_steps: int | None = None  # full-model forwards after the one that gave the first token
    drafted: int | None = None  # draft tokens proposed to the full model
    accepted: int | None = None  # draft tokens it kept
    draft_steps: int | None = None  # draft forwards
    draft_seconds: float | None = None  # engine-internal split (skipsearch methods only)
    verify_seconds: float | None = None
    drafter_stats: tuple[tuple[str, float], ...] = ()  # the drafter's own report (DecodeStats.drafter_stats)


# (prompt ids, max_new_tokens) -> output; a batched contender gets a batch's prompt ids, one sequence per row
Decode = Callable[[Sequence[int] | Sequence[Sequence[int]], int], ContenderOutput]
DrafterFactory = Callable[[Sequence[int]], Drafter | None]  # prompt ids -> a fresh drafter; None: plain decoding


@dataclass(frozen=True)
class Contender:
    """One timed decoder in a run: an HF ``generate`` mode, our engine with or without a drafter."""

    name: str  # the row label, unique in a run
    family: str  # "hf" (a peer), "skipsearch", or "hf-profile" (a skipsearch profile inside HF generate)
    setting: str  # what was run, for people: a profile path, "prompt_lookup_num_tokens=4", ...
    decode: Decode = field(compare=False, repr=False)


def engine_method(sm: SkippableModel, name: str, drafters: DrafterFactory, *, setting: str = "") -> Contender:
    """A method decoded by ``decoding.generate``, the one engine.

    ``drafters`` is called with each prompt's ids and gives that decode its drafter (a fresh one:
    drafters keep per-sequence state; a drafter without a KV cache also needs the prompt).
    """

    def decode(prompt_ids: Sequence[int], max_new_tokens: int) -> ContenderOutput:
        res = generate(sm, prompt_ids, drafter=drafters(prompt_ids), max_new_tokens=max_new_tokens)
        s = res.stats
        return ContenderOutput(
            res.token_ids, verify_steps=s.verify_steps, drafted=s.drafted_tokens, accepted=s.accepted_tokens,
            draft_steps=s.draft_steps, draft_seconds=s.draft_seconds, verify_seconds=s.verify_seconds,
            drafter_stats=s.drafter_stats,
        )

    return Contender(name, "skipsearch", setting, decode)


def ours_autoregressive(sm: SkippableModel, *, name: str = OURS_AR) -> Contender:
    """Our engine with no drafter: the baseline and reference of every search-side comparison."""
    return engine_method(sm, name, lambda _ids: None, setting="decoding.generate, no drafter")


# -- the rounds ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One timed decode of one prompt by one method."""

    method: str
    prompt: int  # index into the run's prompts
    repeat: int  # (prompt, repeat) names the round
    slot: int  # position in its round: the rotation puts every method in every slot
    seconds: float
    peak_bytes: int
    added_bytes: int  # peak minus what was in use just before the call
    output: ContenderOutput


Progress = Callable[[int, int, str], None]  # (done, total, what) after each timed call


def run_rounds(
    methods: Sequence[Contender],
    prompt_ids: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    device: torch.device,
    repeats: int = 1,
    warmup_tokens: int = 16,
    reference: str | None = None,
    strict: bool = False,
    same: Callable[[Sequence[int], Sequence[int], Sequence[int]], bool] | None = None,
    on_warmed: Callable[[], None] | None = None,
    on_progress: Progress | None = None,
) -> tuple[Run, ...]:
    """Time every method on every prompt, interleaved, by the rules of the module docstring.

    ``reference`` names the method whose tokens the others must equal; with ``strict`` a
    difference raises ``LosslessnessError`` after its round, otherwise ``check_outputs`` reports it.
    ``same(prompt_ids, output, reference_output)`` is how the strict check compares (token equality by
    default; in bf16/fp16, ``equivalence.lossless_check`` also accepts numerical ties).
    ``on_warmed`` runs once between the warm-up and the first timed call, e.g. to zero counters
    that must count timed decodes only.
    """
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ConfigError(f"method names must be unique, got {', '.join(names)}")
    if repeats < 1 or max_new_tokens < 1:
        raise ConfigError("repeats and max_new_tokens must be >= 1")
    if not methods or not prompt_ids:
        raise ConfigError("a timed run needs at least one method and one prompt")
    if (reference is not None or strict) and reference not in names:
        raise ConfigError(f"the reference method must be one of {', '.join(names)}, got {reference}")
    settle_aside()
    probe = memory_probe(device)
    # 1. warm up, untimed, every method on the first prompt
    for m in methods:
        m.decode(prompt_ids[0], min(max_new_tokens, warmup_tokens))
    if on_warmed:
        on_warmed()
    runs: list[Run] = []
    total = len(prompt_ids) * repeats * len(methods)
    for i, ids in enumerate(prompt_ids):
        for r in range(repeats):
            # 2. rotate the order every round, so each method runs first, second, ... equally often
            shift = (i * repeats + r) % len(methods)
            outputs: dict[str, ContenderOutput] = {}
            for slot, m in enumerate([*methods[shift:], *methods[:shift]]):
                # 3. time the whole call with the one timer; memory is reset outside the timed span
                probe.reset()
                before = probe.current()
                start = timing.now(device)
                out = m.decode(ids, max_new_tokens)
                seconds = timing.now(device) - start
                peak = probe.peak()
                runs.append(Run(m.name, i, r, slot, seconds, peak, max(peak - before, 0), out))
                outputs[m.name] = out
                if on_progress:
                    on_progress(len(runs), total, m.name)
            # 4. the output check, once the round is complete
            if strict:
                want = outputs[reference].token_ids
                for m in methods:
                    got = outputs[m.name].token_ids
                    if got != want and not (same is not None and same(ids, got, want)):
                        raise LosslessnessError(f"greedy output of {m.name} differs from {reference} "
                                                f"(prompt {i}, {where_differs(got, want)})")
    return tuple(runs)


# -- what the runs say -----------------------------------------------------------------------------
@dataclass(frozen=True)
class OutputCheck:
    """One method's outputs against the reference's, over the prompts it ran on."""

    method: str
    prompts: int
    identical: int  # prompts where every repeat equals the reference's first, token for token
    mismatches: tuple[tuple[int, int], ...]  # (prompt index, first differing token), prompt order

    @property
    def flagged(self) -> bool:
        return self.identical < self.prompts

    @property
    def first_mismatch(self) -> tuple[int, int] | None:
        return self.mismatches[0] if self.mismatches else None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length when one extends the other)."""
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return j
    return min(len(a), len(b))


def where_differs(got: tuple[int, ...] | Batch, want: tuple[int, ...] | Batch) -> str:
    """Where two outputs part, for people: "token j", or "row r, token j" for a batch (a tuple of rows)."""
    if (got and isinstance(got[0], tuple)) or (want and isinstance(want[0], tuple)):
        r = first_difference(got, want)
        if r >= min(len(got), len(want)):
            return f"{len(got)} rows where the reference has {len(want)}"
        return f"row {r}, token {first_difference(got[r], want[r])}"
    return f"token {first_difference(got, want)}"


def _by_prompt(runs: Sequence[Run]) -> dict[str, dict[int, list[Run]]]:
    by: dict[str, dict[int, list[Run]]] = {}
    for run in runs:
        by.setdefault(run.method, {}).setdefault(run.prompt, []).append(run)
    return by


def check_outputs(
    runs: Sequence[Run], *, reference: str, prompts: Sequence[int] | None = None
) -> dict[str, OutputCheck]:
    """Per method (in order of first run), how many of ``prompts`` (all by default) match ``reference``.

    A prompt the reference did not run on counts as not identical, with no mismatch position.
    """
    by = _by_prompt(runs)
    ref = {i: rs[0].output.token_ids for i, rs in by.get(reference, {}).items()}
    out = {}
    for name, per in by.items():
        mine = [(i, per[i]) for i in (sorted(per) if prompts is None else prompts) if i in per]
        identical, mismatches = 0, []
        for i, rs in mine:
            want = ref.get(i)
            bad = next((r for r in rs if r.output.token_ids != want), None) if want is not None else rs[0]
            if bad is None:
                identical += 1
            elif want is not None:
                mismatches.append((i, first_difference(bad.output.token_ids, want)))
        out[name] = OutputCheck(name, len(mine), identical, tuple(mismatches))
    return out


def method_seconds(runs: Sequence[Run], *, prompts: Sequence[int] | None = None) -> dict[str, float]:
    """Per method, the median over repeats of each prompt's seconds, summed over ``prompts`` (all by
    default). A method that did not run on every one of them is left out."""
    by = _by_prompt(runs)
    every = sorted({r.prompt for r in runs}) if prompts is None else list(prompts)
    return {name: sum(statistics.median(r.seconds for r in per[i]) for i in every)
            for name, per in by.items() if all(i in per for i in every)}


def first_outputs(runs: Sequence[Run], method: str) -> tuple[ContenderOutput, ...]:
    """``method``'s output on each prompt, in prompt order, from its first repeat (greedy decoding is
    deterministic, so counts from one repeat stand for all)."""
    return tuple(r.output for r in sorted(runs, key=lambda r: r.prompt) if r.method == method and r.repeat == 0)


# -- micro-timings ---------------------------------------------------------------------------------
def time_interleaved(
    calls: Mapping[str, Callable[[], object]], *, rounds: int, device: torch.device | str | None = None,
    warmup: int = 2,
) -> dict[str, timing.Timing]:
    """Time each call ``rounds`` times, round robin with the order rotated every round, after
    ``warmup`` untimed calls of each; summarise with ``Timing.median``, which the cost model uses."""
    if rounds < 1 or not calls:
        raise ConfigError("time_interleaved needs at least one call and one round")
    settle_aside()
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in [*names[shift:], *names[:shift]]:
            start = timing.now(device)
            calls[name]()
            samples[name].append(timing.now(device) - start)
    return {name: timing.Timing(tuple(s)) for name, s in samples.items()}
