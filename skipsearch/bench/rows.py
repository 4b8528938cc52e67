"""A bench run summarised: one row per method (speed against HF greedy, τ, acceptance, time shares), and each
output's verdict against HF greedy's (``equivalence.check``: identical, equal up to numerical ties, different)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from skipsearch.bench.peers import BASELINE
from skipsearch.engine.equivalence import DIFFERENT, IDENTICAL, TIES, Verdict, check, worst
from skipsearch.engine.harness import (
    OURS_AR,
    Contender,
    Run,
    first_difference,
    method_seconds,
)
from skipsearch.model.skippable import SkippableModel


# -- summaries -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchRow:
    method: str
    family: str
    setting: str
    prompts: int
    identical: int  # prompts whose output equals HF greedy's, token for token (every repeat)
    new_tokens: int
    seconds: float  # sum over prompts of the median over repeats: the method's wall time
    tokens_per_s: float
    speedup: float | None  # HF greedy seconds / this method's seconds; None when its output differs
    vs_ours_ar: float | None  # our autoregressive path's seconds / this method's seconds (same rule)
    tau: float | None  # tokens emitted per full-model forward after the first (as ``decode`` reports)
    acceptance_rate: float | None  # accepted / drafted draft tokens
    peak_memory_mib: float | None  # the largest per-call peak (see BenchSettings.memory_kind)
    added_memory_mib: float | None  # the largest per-call peak above what was in use before the call
    draft_ms: float | None  # mean draft forward, skipsearch methods only
    verify_ms: float | None  # mean verify forward (pending + drafts), skipsearch methods only
    first_mismatch: str | None  # "prompt <id>, token <j>[: why]": the first position outside tolerance
    ties: int = 0  # prompts not identical but equal to HF greedy up to numerical ties (equivalence.py)
    tie_tokens: int = 0  # tokens decided by a tie, summed over those prompts

    @property
    def flagged(self) -> bool:
        """Different from HF greedy on some prompt: no speedup figure."""
        return self.identical + self.ties < self.prompts

    @property
    def verdict(self) -> str:
        """The row's verdict over its prompts: the worst of theirs."""
        return DIFFERENT if self.flagged else TIES if self.ties else IDENTICAL


Verdicts = dict[tuple[str, int], Verdict]  # (method, prompt index) -> its output against HF greedy's


def exact_verdicts(runs: Sequence[Run], *, reference: str = BASELINE) -> Verdicts:
    """Verdicts without a model: identical, or different at the first differing token. For runs whose
    model is gone; ``model_verdicts`` tells ties apart."""
    return _verdicts(runs, reference, lambda i, got, want: Verdict(
        DIFFERENT, len(got), "", (), first_difference(got, want), first_difference(got, want)))


def model_verdicts(sm: SkippableModel, runs: Sequence[Run], prompt_ids: Sequence[Sequence[int]], *,
                   reference: str = BASELINE) -> Verdicts:
    """Every method's output on every prompt against the reference's, by ``equivalence.check``: one
    teacher-forced forward per output that is not identical, run after (never inside) the timed rounds."""
    return _verdicts(runs, reference, lambda i, got, want: check(sm, prompt_ids[i], got, want))


def _verdicts(runs: Sequence[Run], reference: str, differs) -> Verdicts:
    ref = {r.prompt: r.output.token_ids for r in runs if r.method == reference and r.repeat == 0}
    outputs: dict[tuple[str, int], list[tuple[int, ...]]] = {}
    for r in runs:
        seen = outputs.setdefault((r.method, r.prompt), [])
        if r.output.token_ids not in seen:
            seen.append(r.output.token_ids)
    out = {}
    for (name, i), outs in outputs.items():
        want = ref.get(i)
        if want is None:  # the reference did not run on this prompt: nothing to be equal to
            out[name, i] = Verdict(DIFFERENT, len(outs[0]), "", reason="no reference output")
            continue
        # every repeat's output is judged; the prompt's verdict is the least equal of them
        out[name, i] = worst([Verdict(IDENTICAL, len(got), "") if got == want else differs(i, got, want)
                              for got in outs])
    return out


def summarize(
    methods: Sequence[Contender], runs: Sequence[Run], prompt_labels: Sequence[str], *,
    subset: Sequence[int] | None = None, flagged: frozenset[str] = frozenset(), verdicts: Verdicts | None = None,
) -> tuple[BenchRow, ...]:
    """One row per method over ``subset`` of the prompts (all by default).

    ``flagged`` names methods that differ somewhere in the run: they get no speedup even on a
    subset where they happen to match. ``verdicts`` (``model_verdicts``) judge each output against
    HF greedy's; without them only identical output counts (``exact_verdicts``).
    """
    prompts = list(range(len(prompt_labels))) if subset is None else list(subset)
    if verdicts is None:
        verdicts = exact_verdicts(runs)
    seconds = method_seconds(runs, prompts=prompts)
    base_s, ar_s = seconds.get(BASELINE), seconds.get(OURS_AR)
    rows = []
    for m in methods:
        mine = [r for r in runs if r.method == m.name and r.prompt in prompts]
        if not mine:
            continue
        ran = sorted({r.prompt for r in mine})
        mine_v = [(i, verdicts[m.name, i]) for i in ran]
        kinds = [v.kind for _, v in mine_v]
        mismatch = next((f"prompt {prompt_labels[i]}, token {v.position}" + (f": {v.reason}" if v.reason else "")
                         for i, v in mine_v if not v.ok), None)
        secs = method_seconds(mine, prompts=ran)[m.name]
        # counts from the first repeat: decoding is deterministic
        outs = [r.output for r in sorted(mine, key=lambda r: r.prompt) if r.repeat == 0]
        tokens = sum(len(o.token_ids) for o in outs)
        clean = DIFFERENT not in kinds and m.name not in flagged
        rows.append(BenchRow(
            method=m.name, family=m.family, setting=m.setting, prompts=len(ran), identical=kinds.count(IDENTICAL),
            new_tokens=tokens, seconds=secs, tokens_per_s=tokens / secs if secs > 0 else 0.0,
            speedup=base_s / secs if clean and base_s and secs > 0 else None,
            vs_ours_ar=ar_s / secs if clean and ar_s and secs > 0 else None,
            tau=_ratio([len(o.token_ids) - 1 for o in outs], [o.verify_steps for o in outs]),
            acceptance_rate=_ratio([o.accepted for o in outs], [o.drafted for o in outs]),
            peak_memory_mib=max(r.peak_bytes for r in mine) / 2**20 or None,
            added_memory_mib=max(r.added_bytes for r in mine) / 2**20,
            draft_ms=_ms([o.draft_seconds for o in outs], [o.draft_steps for o in outs]),
            verify_ms=_ms([o.verify_seconds for o in outs], [o.verify_steps for o in outs]),
            first_mismatch=mismatch, ties=kinds.count(TIES),
            tie_tokens=sum(v.tie_tokens for _, v in mine_v if v.kind == TIES),
        ))
    return tuple(rows)


def _ratio(num: Sequence[int | None], den: Sequence[int | None]) -> float | None:
    if any(v is None for v in (*num, *den)) or not sum(den):
        return None
    return sum(num) / sum(den)


def _ms(seconds: Sequence[float | None], steps: Sequence[int | None]) -> float | None:
    r = _ratio(seconds, steps)  # type: ignore[arg-type]
    return None if r is None else 1000 * r
