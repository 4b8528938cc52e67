"""``skipsearch bench --batch-sizes``: decoding by batch size, per B the aggregate tokens/s of

- ``plain``: plain batched greedy (``batched.generate_batch`` with no drafter, k = 0), the baseline and the reference
  output;
- ``schedule``: the profile's schedule, k = ``schedule.k_for(B)`` (a profile without one: its own max_draft_tokens);
- ``k=<K>``: every fixed K the planner considered (``schedule.considered``, else ``--batch-ks``, else 1, 2, 3, 4);
- ``hf-batched-greedy``: HF ``model.generate`` on the same rows, left-padded with an attention mask, the peer.

Batches are the bench's prompts taken B at a time (the last batch, and a batch larger than the prompt set, cycle
through them again), so every prompt is decoded at every B. The timing is ``harness.run_rounds``, the one harness,
once per B: a round is every contender once on the same batch, after a warm-up, with the order rotated. Each row's
output is judged against plain's (``equivalence.check``: identical, equal up to numerical ties, different) after the
timed rounds; a contender that differs on any row is flagged and gets no speedup. With ``strict`` the run stops at the
first batch whose output differs (``harness.LosslessnessError``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from skipsearch import methods
from skipsearch.config import Candidate, ConfigError
from skipsearch.engine.batched import check_fits, generate_batch
from skipsearch.engine.equivalence import DIFFERENT, IDENTICAL, TIES, Verdict, check, lossless_check, worst
from skipsearch.engine.harness import Batch, Contender, ContenderOutput, Progress, Run, method_seconds, run_rounds
from skipsearch.files.schedule import draft_length
from skipsearch.model.skippable import SkippableModel

if TYPE_CHECKING:
    from skipsearch.engine.draft import BatchDrafter
    from skipsearch.files.schedule import Schedule

PLAIN = "plain"  # plain batched greedy: the baseline and the reference output
SCHEDULE = "schedule"  # the profile's schedule
HF_BATCHED = "hf-batched-greedy"  # the peer
DEFAULT_KS = (1, 2, 3, 4)  # the fixed K benched when neither the profile's schedule nor --batch-ks names them
# --batch-sizes: a batch of 1024 rows is far past what a single-process server batches (vLLM's default
# max_num_seqs is 256); a larger value is a typo, and would only size an absurd cache.
MAX_BATCH_SIZE = 1024


def parse_sizes(text: str, *, option: str, low: int, high: int) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``: comma-separated integers in [low, high], sorted, each once; anything else is a
    one-line ConfigError naming ``option``."""
    values = []
    for part in (p.strip() for p in text.split(",")):
        try:
            value = int(part)
        except ValueError:
            raise ConfigError(f"{option}: {part!r} is not an integer (give e.g. 1,2,4)") from None
        if not low <= value <= high:
            raise ConfigError(f"{option}: {value} is outside {low}..{high}")
        values.append(value)
    return tuple(sorted(set(values)))


# -- what was asked --------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchedPlan:
    """``bench --batch-sizes``: one profile, the batch sizes, and the fixed K to weigh against its schedule."""

    profile: str  # the profile's path, for people
    candidate: Candidate  # what its drafts decode with (Profile.candidate)
    batch_sizes: tuple[int, ...]
    schedule: Schedule | None = None  # the profile's; None: the schedule row runs its own max_draft_tokens
    ks: tuple[int, ...] | None = None  # --batch-ks; None: the schedule's considered K, else DEFAULT_KS
    strict: bool = False  # stop at the first batch whose output differs from plain's


def fixed_ks(plan: BatchedPlan) -> tuple[tuple[int, ...], str]:
    """The fixed K to bench (0 left out: that is ``plain``) and where they came from, for people."""
    if plan.ks is not None:
        return tuple(k for k in plan.ks if k > 0), "--batch-ks"
    if plan.schedule is not None:
        return tuple(sorted({k for k in plan.schedule.considered if k > 0})), "the K its schedule's planner considered"
    return DEFAULT_KS, "the default fixed K (the profile has no schedule)"


def schedule_k(plan: BatchedPlan, batch_size: int) -> tuple[int, str]:
    """The schedule row's k at ``batch_size``, and its setting."""
    k = draft_length(plan.schedule, plan.candidate.draft.max_draft_tokens, batch_size)
    if plan.schedule is not None:
        return k, f"k={k} at B={batch_size} (the profile's schedule)" + (": no speculation" if k == 0 else "")
    return k, f"k={k} (the profile's max_draft_tokens; it has no schedule)"


# -- what it measured ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchedRow:
    """One contender at one batch size, over that size's batches."""

    batch_size: int
    contender: str  # plain, schedule, k=<K>, hf-batched-greedy
    family: str  # "skipsearch" (the engine's generate_batch) or "hf" (the peer)
    setting: str
    k: int | None  # the draft length it ran (None: the HF peer)
    batches: int
    rows: int  # sequences decoded: batches x B
    identical: int  # rows whose output equals plain's, token for token, in every repeat
    new_tokens: int  # summed over rows (first repeat: greedy decoding is deterministic)
    seconds: float  # sum over batches of the median over repeats, each call timed whole
    tokens_per_s: float  # aggregate: all rows' new tokens over those seconds
    speedup: float | None  # plain's seconds / this contender's; None when its output differs from plain's
    acceptance_rate: float | None  # accepted / drafted draft tokens (None: nothing drafted, or not counted)
    verify_steps: int | None  # full-model forwards over its batches (None: not counted)
    peak_memory_mib: float | None  # the largest per-call peak (BenchSettings.memory_kind)
    first_mismatch: str | None  # "batch b row r (prompt <id>), token j[: why]": the first row outside tolerance
    ties: int = 0  # rows not identical but equal to plain's up to numerical ties (equivalence.py)
    tie_tokens: int = 0  # tokens decided by a tie, summed over those rows

    @property
    def flagged(self) -> bool:
        """Different from plain batched decoding on some row: no speedup figure."""
        return self.identical + self.ties < self.rows

    @property
    def verdict(self) -> str:
        return DIFFERENT if self.flagged else TIES if self.ties else IDENTICAL


@dataclass(frozen=True)
class BatchedBench:
    """The batched section of a bench report."""

    profile: str  # its path
    method: str
    schedule: str  # where the schedule row's k came from, for people
    ks: tuple[int, ...]  # the fixed K benched
    ks_source: str  # where they came from, for people
    batch_sizes: tuple[int, ...]
    n_prompts: int  # the bench prompts the batches were drawn from
    repeats: int
    strict: bool
    rows: tuple[BatchedRow, ...]  # per batch size (ascending): plain, schedule, each k=<K>, hf-batched-greedy

    def row(self, batch_size: int, contender: str) -> BatchedRow | None:
        return next((r for r in self.rows if r.batch_size == batch_size and r.contender == contender), None)


# -- the contenders ----------------------------------------------------------------------------------
def batches_of(n_prompts: int, batch_size: int) -> tuple[tuple[int, ...], ...]:
    """Prompt indices, ``batch_size`` at a time, cycling through the prompts to fill the last batch:
    ceil(n / B) batches, so that every prompt is decoded at least once."""
    count = -(-n_prompts // batch_size)
    return tuple(tuple((b * batch_size + r) % n_prompts for r in range(batch_size)) for b in range(count))


def with_k(candidate: Candidate, k: int) -> Candidate:
    """``candidate`` drafting ``k`` tokens per cycle."""
    return dataclasses.replace(candidate, draft=dataclasses.replace(candidate.draft, max_draft_tokens=k))


def engine_batch_method(sm: SkippableModel, name: str, drafters: Callable[[], BatchDrafter | None], *, k: int,
                        setting: str) -> Contender:
    """A batched contender decoded by ``batched.generate_batch``, with a fresh drafter per call (``drafters``), as
    ``harness.engine_method`` gives each decode its own."""

    def decode(batch: Sequence[Sequence[int]], max_new_tokens: int) -> ContenderOutput:
        res = generate_batch(sm, batch, drafter=drafters(), k=k, max_new_tokens=max_new_tokens)
        s = res.stats
        return ContenderOutput(res.token_ids, verify_steps=s.verify_steps, drafted=s.drafted_tokens,
                               accepted=s.accepted_tokens, draft_steps=s.draft_steps)

    return Contender(name, "skipsearch", setting, decode)


def hf_generate_batch(sm: SkippableModel, batch: Sequence[Sequence[int]], *, max_new_tokens: int) -> Batch:
    """HF greedy ``generate`` on the rows of ``batch`` at once, left-padded with an attention mask (HF derives each
    row's positions from the mask); each row's tokens up to and including its first EOS."""
    width = max(map(len, batch))
    eos = tuple(sm.eos_token_ids)
    # the padding's token id is masked out and never read; it only has to be inside the vocabulary
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in batch], device=sm.device)  # [B, T]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=sm.device)  # [B, T]
    with torch.inference_mode():
        # it stops at the EOS ids our engine stops at; a finished row is padded with one of them
        out = sm.hf.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=eos[0] if eos else 0, **({"eos_token_id": list(eos)} if eos else {}))
    rows = []
    for row in out[:, width:].tolist():  # out: [B, T + new]; a finished row runs on as padding: cut at its EOS
        end = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        rows.append(tuple(row[:end]))
    return tuple(rows)


def hf_batched_method(sm: SkippableModel) -> Contender:
    def decode(batch: Sequence[Sequence[int]], max_new_tokens: int) -> ContenderOutput:
        return ContenderOutput(hf_generate_batch(sm, batch, max_new_tokens=max_new_tokens))

    return Contender(HF_BATCHED, "hf", "model.generate(do_sample=False), left-padded, attention mask", decode)


@dataclass(frozen=True)
class _Size:
    """One batch size, ready to run: its contenders (each with its k) and its batches of prompt indices."""

    batch_size: int
    contenders: tuple[tuple[Contender, int | None], ...]
    batches: tuple[tuple[int, ...], ...]


def prepare(sm: SkippableModel, plan: BatchedPlan, prompt_ids: Sequence[Sequence[int]], *,
            max_new_tokens: int) -> tuple[_Size, ...]:
    """Every batch size's contenders, and every refusal before anything runs: a method that cannot decode a batch
    (``methods.batch_drafter``), a batch that does not fit memory (``batched.check_fits``)."""
    if not plan.batch_sizes:
        raise ConfigError("a batched bench needs at least one batch size")
    if not prompt_ids:
        raise ConfigError("a batched bench needs at least one prompt")
    ks, _ = fixed_ks(plan)
    # One draft source for every k: generate_batch takes the draft length per call. A profile of plain decoding
    # (K = 0) has none of its own, so its drafts come from the same candidate drafting the largest K benched.
    candidate = plan.candidate if plan.candidate.draft.max_draft_tokens else with_k(plan.candidate, max(ks, default=1))
    methods.batch_drafter(candidate, sm)  # a method that cannot batch is refused here, in one line

    def drafters() -> BatchDrafter | None:  # a fresh one per call, as harness.engine_method gives each decode
        return methods.batch_drafter(candidate, sm)

    sizes, graphs = [], 0
    for size in plan.batch_sizes:
        sched_k, sched_setting = schedule_k(plan, size)
        made: list[tuple[Contender, int | None]] = [
            (engine_batch_method(sm, PLAIN, lambda: None, k=0, setting="generate_batch, no drafter (k=0)"), 0),
            (engine_batch_method(sm, SCHEDULE, drafters if sched_k else lambda: None, k=sched_k,
                                 setting=sched_setting), sched_k),
            *((engine_batch_method(sm, f"k={k}", drafters, k=k, setting=f"{plan.profile}, fixed k={k}"), k)
              for k in ks),
            (hf_batched_method(sm), None),
        ]
        batches = batches_of(len(prompt_ids), size)
        longest = max(len(prompt_ids[i]) for b in batches for i in b)
        graphs += sm.graph_bytes(size)  # a compiled kernel keeps every batch size's graphs: they add up
        for k in dict.fromkeys(k for _, k in made if k is not None):
            check_fits(sm, batch_size=size, prompt_tokens=longest, max_new_tokens=max_new_tokens, k=k, graphs=graphs)
        sizes.append(_Size(size, tuple(made), batches))
    return tuple(sizes)


# -- the run -----------------------------------------------------------------------------------------
def bench_batched(
    sm: SkippableModel, plan: BatchedPlan, prompt_ids: Sequence[Sequence[int]], labels: Sequence[str], *,
    max_new_tokens: int, repeats: int = 1, prepared: Sequence[_Size] | None = None,
    on_stage: Callable[[str, int], None] | None = None, on_progress: Progress | None = None,
) -> BatchedBench:
    """Time every contender at every batch size of ``plan`` on batches of ``prompt_ids`` (``labels`` name them in
    the report). ``prepared`` is ``prepare``'s answer when the caller refused early (``bench`` does, before its
    main rounds)."""
    sizes = prepared if prepared is not None else prepare(sm, plan, prompt_ids, max_new_tokens=max_new_tokens)
    same = _batch_same(sm)
    rows: list[BatchedRow] = []
    for size in sizes:
        batches = [tuple(tuple(prompt_ids[i]) for i in b) for b in size.batches]
        contenders = [c for c, _ in size.contenders]
        if on_stage:
            on_stage(f"batched B={size.batch_size}", len(batches) * repeats * len(contenders))
        runs = run_rounds(contenders, batches, max_new_tokens=max_new_tokens, device=sm.device, repeats=repeats,
                          reference=PLAIN, strict=plan.strict, same=same, on_progress=on_progress)
        # after the timed rounds: judging costs no one's time
        row_labels = [[labels[i] for i in b] for b in size.batches]
        rows += summarize_size(size.batch_size, size.contenders, runs, batches, row_labels,
                               judge=lambda p, got, want: check(sm, p, got, want))
    ks, ks_source = fixed_ks(plan)
    return BatchedBench(
        profile=plan.profile, method=plan.candidate.method,
        schedule="the profile's schedule" if plan.schedule is not None else
        "the profile's max_draft_tokens (it has no schedule)",
        ks=ks, ks_source=ks_source, batch_sizes=tuple(s.batch_size for s in sizes), n_prompts=len(prompt_ids),
        repeats=repeats, strict=plan.strict, rows=tuple(rows))


Judge = Callable[[Sequence[int], Sequence[int], Sequence[int]], Verdict]  # (prompt, output, plain's) -> verdict


def summarize_size(
    batch_size: int, contenders: Sequence[tuple[Contender, int | None]], runs: Sequence[Run],
    batches: Sequence[Sequence[Sequence[int]]], row_labels: Sequence[Sequence[str]], *, judge: Judge,
) -> list[BatchedRow]:
    """One row per contender at one batch size: speed over all its batches, and every row's output judged against
    plain's (``judge``, for outputs that are not identical; every repeat; the row's verdict is the least equal)."""
    seconds = method_seconds(runs)
    base = seconds.get(PLAIN)
    want = {r.prompt: r.output.token_ids for r in runs if r.method == PLAIN and r.repeat == 0}
    out = []
    for c, k in contenders:
        mine = sorted((r for r in runs if r.method == c.name), key=lambda r: (r.prompt, r.repeat))
        verdicts: list[tuple[str, Verdict]] = []
        for b, prompts in enumerate(batches):
            outs = [r.output.token_ids for r in mine if r.prompt == b]
            for j, prompt in enumerate(prompts):
                ref = want[b][j] if b in want and j < len(want[b]) else None
                seen = list(dict.fromkeys(o[j] if j < len(o) else () for o in outs))
                verdicts.append((f"batch {b} row {j} (prompt {row_labels[b][j]})", worst([
                    Verdict(DIFFERENT, len(got), "", reason="no reference output") if ref is None else
                    Verdict(IDENTICAL, len(got), "") if got == ref else judge(prompt, got, ref) for got in seen])))
        kinds = [v.kind for _, v in verdicts]
        firsts = [r.output for r in mine if r.repeat == 0]
        tokens = sum(len(row) for o in firsts for row in o.token_ids)
        secs = seconds[c.name]
        mismatch = next((f"{where}, token {v.position}" + (f": {v.reason}" if v.reason else "")
                         for where, v in verdicts if not v.ok), None)
        drafted, accepted = _total([o.drafted for o in firsts]), _total([o.accepted for o in firsts])
        out.append(BatchedRow(
            batch_size=batch_size, contender=c.name, family=c.family, setting=c.setting, k=k, batches=len(batches),
            rows=len(verdicts), identical=kinds.count(IDENTICAL), new_tokens=tokens, seconds=secs,
            tokens_per_s=tokens / secs if secs > 0 else 0.0,
            speedup=base / secs if DIFFERENT not in kinds and base and secs > 0 else None,
            acceptance_rate=accepted / drafted if drafted and accepted is not None else None,
            verify_steps=_total([o.verify_steps for o in firsts]),
            peak_memory_mib=max(r.peak_bytes for r in mine) / 2**20 or None,
            first_mismatch=mismatch, ties=kinds.count(TIES),
            tie_tokens=sum(v.tie_tokens for _, v in verdicts if v.kind == TIES),
        ))
    return out


def _total(counts: Sequence[int | None]) -> int | None:
    return None if any(c is None for c in counts) else sum(counts)  # type: ignore[misc]


def _batch_same(sm: SkippableModel) -> Callable[[Sequence[Sequence[int]], Batch, Batch], bool] | None:
    """The strict check's comparison of two batches: every row identical, or (bf16/fp16) equal up to ties
    (``equivalence.lossless_check``); None in fp32, where only identical rows pass."""
    row_same = lossless_check(sm)
    if row_same is None:
        return None
    return lambda batch, got, want: len(got) == len(want) and all(
        g == w or row_same(p, g, w) for p, g, w in zip(batch, got, want, strict=True))


__all__ = ["DEFAULT_KS", "HF_BATCHED", "MAX_BATCH_SIZE", "PLAIN", "SCHEDULE", "BatchedBench", "BatchedPlan",
           "BatchedRow", "batches_of", "bench_batched", "engine_batch_method", "fixed_ks", "hf_batched_method",
           "hf_generate_batch", "parse_sizes", "prepare", "schedule_k", "summarize_size", "with_k"]


def measured_schedule(bench: BatchedBench | Sequence[BatchedBench], planned: Schedule | None, *,
                      margin: float | None = None) -> Schedule:
    """The schedule ``bench --write-measured`` keeps: at each benched batch size the draft length measured fastest
    there among plain decoding (K = 0), the schedule's K and every fixed K, K = 0 unless one beat plain batched
    decoding by ``margin`` (the planner's, 3%: timing noise). Given several runs of the same bench (``bench`` a
    sequence), each K counts at its *worst* run, and only where every run that benched that batch size has a figure
    for it: a K ships only if it beat plain decoding in every run. A range runs from one benched size to just before
    the next (the first from batch size 1, the last ends at the largest benched); neighbours with the same K merge,
    at their lowest measured speedup. A range keeps the planned prediction where it runs the planned K. Rows whose
    output differs from plain's measure nothing. The figures come from the runs the choice was made on: another run
    is what checks them."""
    from skipsearch.files.schedule import MARGIN, BatchRange, Schedule

    runs = (bench,) if isinstance(bench, BatchedBench) else tuple(bench)
    if not runs:
        raise ValueError("a measured schedule needs at least one bench run")
    margin = MARGIN if margin is None else margin
    sizes = tuple(sorted({b for run in runs for b in run.batch_sizes}))
    chosen: list[tuple[int, float]] = []  # per benched size: (K, its worst measured speedup over plain)
    for b in sizes:
        timed = [run for run in runs if b in run.batch_sizes]
        worst: dict[int, float] = {}
        for k in {r.k for run in timed for r in run.rows if r.batch_size == b and r.k is not None}:
            figures = [[r.speedup for r in run.rows if r.batch_size == b and r.k == k and r.speedup is not None]
                       for run in timed]
            if all(figures):  # a figure in every run (a row of the schedule and one of a fixed K may both run k)
                worst[k] = min(max(f) for f in figures)
        best = max(worst.items(), key=lambda ks: (ks[1], -ks[0]), default=None)
        chosen.append(best if best is not None and best[1] > 1.0 + margin else (0, 1.0))
    ranges: list[BatchRange] = []
    for i, (b, (k, speedup)) in enumerate(zip(sizes, chosen, strict=True)):
        start, end = (1 if i == 0 else b), (sizes[i + 1] - 1 if i + 1 < len(sizes) else b)
        if ranges and ranges[-1].k == k:
            last = ranges[-1]
            ranges[-1] = dataclasses.replace(last, end=end, measured=round(min(last.measured, speedup), 4))
            continue
        predicted = next((r.predicted for r in planned.ranges if r.start <= b <= r.end and r.k == k), None) \
            if planned is not None else None
        ranges.append(BatchRange(start, end, k, predicted, round(speedup, 4)))
    ks = sorted({k for run in runs for k in run.ks})
    fastest = "the fastest" if len(runs) == 1 else f"over {len(runs)} runs, the fastest at its worst run"
    said = (f"measured by bench at B = {', '.join(map(str, sizes))}: {fastest} of plain decoding, the schedule and "
            f"K = {', '.join(map(str, ks))} at each (K = 0 unless one beat plain batched decoding by {margin:.0%}"
            + (")" if len(runs) == 1 else " in every run)"))
    basis = f"{said}; planned first from {planned.basis}" if planned is not None and planned.basis else said
    considered = tuple(sorted({0, *ks, *(planned.considered if planned is not None else ())}))
    return Schedule(tuple(ranges), considered, basis)
