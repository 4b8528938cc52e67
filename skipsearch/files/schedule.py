"""A draft length per batch size: the ``schedule`` of a draft profile, its YAML, its checks, and its planner.

A profile planned for one sequence can make a loaded server slower: a verify of k tokens for B sequences is a
forward of B x (k + 1) rows, and once that product leaves the memory-bound regime the drafted tokens cost real
compute. So a profile may carry a ``Schedule``: sorted, non-overlapping ranges of batch sizes, each with the draft
length K it runs (K = 0: no speculation), what it was predicted at and, once timed, what it measured.

The planner (``plan_schedule``) reads a cost file's batched grid (``files.costs.BatchedCosts``: v(k, B) and c(B))
and, per fixed K, the expected tokens per cycle tau(K) and what drafting costs per cycle that the method's own
single-sequence re-plan predicts (skipsearch.search.replan hands them over: no new acceptance model here). At each
measured B, draft length K is predicted to run at

    tau(K) / ((d(K) x c(B) + v(K, B)) / v(0, B))

times plain batched decoding: d(K) x c(B) is one cycle's drafting at B (K x c for a draft that always drafts K
tokens; fewer, or none, where an exit rule stops it early or a lookup drafts for free), v(K, B) the verify of
K + 1 positions per row (a batch verifies every row's K slots, accepted or not), v(0, B) one step of plain batched
decoding. The best K wins where it beats plain decoding by more than ``MARGIN``; elsewhere K = 0. Neighbouring
batch sizes with the same K merge into one range: a range covers its grid point up to just before the next; the
last ends at the largest B measured. Outside every range a schedule runs K = 0.

Every problem of a written schedule is one ``ProfileError`` line. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skipsearch.files.bounds import MAX_BATCH_SIZE, MAX_DRAFT_TOKENS
from skipsearch.files.costs import BatchedCosts
from skipsearch.files.errors import ProfileError
from skipsearch.files.yamlio import mapping, short

KEY = "schedule"  # the profile's top-level key
MARGIN = 0.03  # a K must be predicted to beat plain batched decoding by more than 3% (timing noise) to be chosen
MAX_K = MAX_DRAFT_TOKENS  # the longest draft the engine runs


@dataclass(frozen=True)
class BatchRange:
    start: int
    end: int
    k: int  # batch sizes start..end inclusive run draft length k (0: no speculation)
    predicted: float | None = None  # predicted speedup over plain batched decoding in this range
    measured: float | None = None  # measured speedup (bench), None until measured


@dataclass(frozen=True)
class Schedule:
    ranges: tuple[BatchRange, ...]  # sorted, non-overlapping
    considered: tuple[int, ...]  # the fixed K the planner weighed (0 included)
    basis: str = ""  # for people: the cost file / measurements it was planned from

    def k_for(self, batch_size: int) -> int:
        """The draft length the range holding ``batch_size`` runs; 0 outside every range."""
        return next((r.k for r in self.ranges if r.start <= batch_size <= r.end), 0)

    def describe(self) -> str:
        """One line for people: ``B 1-3: K 4 (1.62x); B 4-16: K 0``."""
        def one(r: BatchRange) -> str:
            size = f"B {r.start}" if r.start == r.end else f"B {r.start}-{r.end}"
            figures = [f"{r.predicted:.2f}x predicted" if r.predicted is not None else None,
                       f"{r.measured:.2f}x measured" if r.measured is not None else None]
            shown = ", ".join(f for f in figures if f)
            return f"{size}: K {r.k}" + (f" ({shown})" if shown else "")
        return "; ".join(one(r) for r in self.ranges) + "; K 0 outside"


def draft_length(schedule: Schedule | None, own_k: int, batch_size: int) -> int:
    """The one rule for what a profile runs at ``batch_size``: its schedule's K where it has a schedule, else its
    own K (``own_k``: its max_draft_tokens; 0 for plain decoding) at every size."""
    return schedule.k_for(batch_size) if schedule is not None else own_k


# -- YAML -------------------------------------------------------------------------------------------------------
def _err(source: str, problem: str) -> ProfileError:
    return ProfileError(f"{source}: {problem}")


def _integer(value: Any, path: str, source: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(source, f"{path} must be an integer, got {short(value)}")
    if not low <= value <= high:
        raise _err(source, f"{path} must be in {low}..{high}, got {value}")
    return value


def _speedup(value: Any, path: str, source: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _err(source, f"{path} must be a positive number (a speedup), got {short(value)}")
    return float(value)


def check_ranges(ranges: Sequence[BatchRange], *, path: str = KEY, source: str = "<profile>") -> None:
    """Sorted by start, non-overlapping, start <= end, k >= 0: the rules vLLM's schedule keeps too."""
    for i, r in enumerate(ranges):
        where = f"{path}.ranges[{i}]"
        if r.start > r.end:
            raise _err(source, f"{where}: start {r.start} is after end {r.end}")
        if i and r.start <= ranges[i - 1].end:
            before = ranges[i - 1]
            word = "overlaps" if r.start >= before.start else "comes before"
            raise _err(source, f"{where}: batch sizes {r.start}..{r.end} {word} the range before it "
                               f"({before.start}..{before.end}): ranges must be sorted and must not overlap")


def schedule_from_dict(raw: Any, *, path: str = KEY, source: str = "<profile>") -> Schedule:
    """Validate a profile's ``schedule`` mapping: every problem is one ProfileError line."""
    raw = mapping(raw, path, source, error=ProfileError)
    for key in raw:
        if key not in ("ranges", "considered", "basis"):
            raise _err(source, f"{path}: unknown key {short(key, 40)} (known: ranges, considered, basis)")
    listed = raw.get("ranges")
    if not isinstance(listed, list) or not listed:
        raise _err(source, f"{path}.ranges must list at least one range (start, end, k)")
    ranges = []
    for i, entry in enumerate(listed):
        where = f"{path}.ranges[{i}]"
        entry = mapping(entry, where, source, error=ProfileError)
        for key in entry:
            if key not in ("start", "end", "k", "predicted", "measured"):
                raise _err(source, f"{where}: unknown key {short(key, 40)} (known: start, end, k, predicted, "
                                   f"measured)")
        for key in ("start", "end", "k"):
            if entry.get(key) is None:
                raise _err(source, f"{where}: missing required key {key}")
        start = _integer(entry["start"], f"{where}.start", source, 1, MAX_BATCH_SIZE)
        end = _integer(entry["end"], f"{where}.end", source, 1, MAX_BATCH_SIZE)
        k = _integer(entry["k"], f"{where}.k", source, 0, MAX_K)
        ranges.append(BatchRange(start, end, k, _speedup(entry.get("predicted"), f"{where}.predicted", source),
                                 _speedup(entry.get("measured"), f"{where}.measured", source)))
    check_ranges(ranges, path=path, source=source)
    considered = raw.get("considered", [])
    if not isinstance(considered, list):
        raise _err(source, f"{path}.considered must list the draft lengths the planner weighed, got "
                           f"{short(considered)}")
    ks = tuple(_integer(k, f"{path}.considered[{i}]", source, 0, MAX_K) for i, k in enumerate(considered))
    basis = raw.get("basis", "")
    if not isinstance(basis, str):
        raise _err(source, f"{path}.basis must be text, got {short(basis)}")
    return Schedule(tuple(ranges), ks, basis)


def schedule_to_dict(s: Schedule) -> dict:
    def row(r: BatchRange) -> dict:
        out: dict[str, Any] = {"start": r.start, "end": r.end, "k": r.k}
        for key in ("predicted", "measured"):
            if getattr(r, key) is not None:
                out[key] = round(float(getattr(r, key)), 4)
        return out

    out: dict[str, Any] = {"ranges": [row(r) for r in s.ranges], "considered": list(s.considered)}
    if s.basis:
        out["basis"] = s.basis
    return out


# -- the planner ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftPoint:
    """What the method's single-sequence re-plan predicts for one fixed draft length K."""

    k: int
    tau: float  # expected tokens per cycle (accepted drafts + the verifier's own)
    draft_cost: float  # one cycle's drafting at batch 1, in full steps (K x c for a draft that always drafts K)
    scheme: str | None = None  # the weight format the draft runs in, whose c(B) the grid may price


def batch_draft_steps(steps: float, k: int, batch_size: int) -> float:
    """Draft forwards a batch runs per cycle when each row runs ``steps`` of its K on average: a batched draft step
    runs while any row still drafts, so the batch drafts as long as its longest-drafting row. Only the mean is
    known (a profile's trace is one sequence's), and among spreads of that mean over [0, K] the two-point one (a
    row drafts all K or none: a lookup hit, a hybrid's fallback) has the longest maximum, K x (1 - (1 - steps/K)^B):
    the planner prices that bound, so a draft that may not pay is not predicted to."""
    if k < 1 or steps <= 0:
        return 0.0
    share = min(steps / k, 1.0)
    return k * (1.0 - (1.0 - share) ** batch_size)


def cycle_speedup(point: DraftPoint, grid: BatchedCosts, batch_size: int) -> float:
    """tau(K) / (drafting(B) + v(K, B) / v(0, B)): a cycle's tokens over its cost in plain batched steps.

    A draft in a scheme the grid prices costs c(B) per batched draft step (the grid's own figure at B), for as many
    steps as its longest-drafting row runs (``batch_draft_steps``; the steps per row are the point's drafting cost
    over c(1)). Any other draft (a skip set of the model, a lookup) grows as the full model's step, so its share of
    a step stays as at batch 1."""
    step = grid.step(batch_size)
    drafting = point.draft_cost
    c_1 = grid.draft(point.scheme, 1) if point.scheme is not None else None
    c_b = grid.draft(point.scheme, batch_size) if point.scheme is not None else None
    if c_1 and c_b:
        per_row = drafting / (c_1 / grid.step(1))  # draft forwards one sequence runs per cycle
        drafting = batch_draft_steps(per_row, point.k, batch_size) * c_b / step
    return point.tau / (drafting + grid.verify(point.k, batch_size) / step)


def draft_growth(points: Sequence[DraftPoint], grid: BatchedCosts) -> str:
    """For a schedule's basis: how ``cycle_speedup`` grows the drafts of ``points`` with B on ``grid``, from the
    grid's c(B) of their scheme, or (no scheme, or none priced) as the full step grows."""
    schemes = sorted({p.scheme for p in points if p.scheme is not None and p.k >= 1})
    if not schemes:
        return "the draft grows with B as the full step does"
    said = []
    longest = "for as many steps as the batch's longest-drafting row (bound K(1 - (1 - d/K)^B))"
    for scheme in schemes:
        priced = [b for b in grid.batch_sizes if grid.draft(scheme, b)]
        if 1 in priced and len(priced) == len(grid.batch_sizes):
            said.append(f"the {scheme} draft costs the grid's c(B) of {scheme} per step, {longest}")
        elif 1 in priced and len(priced) > 1:
            said.append(f"the {scheme} draft costs the grid's c(B) of {scheme} per step at B = "
                        f"{', '.join(map(str, priced))}, {longest}; elsewhere it grows as the full step (no c(B))")
        else:
            said.append(f"the grid has no c(B) of {scheme}: its draft grows with B as the full step does")
    return "; ".join(said)


def plan_schedule(points: Sequence[DraftPoint], grid: BatchedCosts, *, margin: float = MARGIN,
                  basis: str = "") -> Schedule:
    """The best K per batch size of ``grid`` (K = 0 where none beats plain batched decoding by ``margin``), with
    neighbouring batch sizes of the same K merged into ranges. ``grid`` must hold batch size 1 (the unit a draft's
    growth is taken from). The schedule's basis is ``basis`` and how the drafts grew with B (``draft_growth``)."""
    if 1 not in grid.batch_sizes:
        raise ValueError("the batched grid must include batch size 1")
    by_k: dict[int, DraftPoint] = {}
    for p in points:
        if p.k >= 1 and (p.k not in by_k or p.tau > by_k[p.k].tau):
            by_k[p.k] = p
    sizes = grid.batch_sizes
    chosen: list[tuple[int, float]] = []  # per grid point: (K, predicted speedup over plain)
    for b in sizes:
        scored = sorted(((cycle_speedup(p, grid, b), k) for k, p in by_k.items()), key=lambda sk: (-sk[0], sk[1]))
        best = scored[0] if scored else None
        chosen.append((best[1], best[0]) if best and best[0] > 1.0 + margin else (0, 1.0))
    ranges: list[BatchRange] = []
    for i, (b, (k, speedup)) in enumerate(zip(sizes, chosen, strict=True)):
        end = sizes[i + 1] - 1 if i + 1 < len(sizes) else b
        if ranges and ranges[-1].k == k:
            last = ranges[-1]
            low = min(last.predicted, speedup) if last.predicted is not None else None
            ranges[-1] = BatchRange(last.start, end, k, low)  # a merged range is predicted at its worst point
        else:
            ranges.append(BatchRange(b, end, k, round(speedup, 4)))
    growth = draft_growth(list(by_k.values()), grid)
    return Schedule(tuple(ranges), tuple(sorted({0, *by_k})), f"{basis}; {growth}" if basis else growth)


def predicted_table(points: Sequence[DraftPoint], grid: BatchedCosts) -> dict[int, dict[int, float]]:
    """B -> K -> predicted speedup over plain batched decoding, for people and ``--json``."""
    return {b: {p.k: round(cycle_speedup(p, grid, b), 4) for p in points} for b in grid.batch_sizes}


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``--batch-sizes 1,2,4,8``: ascending distinct integers in 1..MAX_BATCH_SIZE; a ValueError line otherwise."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise ValueError(f"--batch-sizes must list batch sizes separated by commas, e.g. 1,2,4,8, got {text!r}")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--batch-sizes must list integers, e.g. 1,2,4,8, got {text!r}") from None
    if any(not 1 <= b <= MAX_BATCH_SIZE for b in sizes):
        raise ValueError(f"--batch-sizes must be in 1..{MAX_BATCH_SIZE}, got {text!r}")
    if sizes != sorted(set(sizes)):
        raise ValueError(f"--batch-sizes must be ascending and distinct, got {text!r}")
    return tuple(sizes)


def merge_measured(schedule: Schedule, measured: Mapping[int, float]) -> Schedule:
    """``schedule`` with each range's ``measured`` speedup from ``measured`` (batch size -> speedup over plain
    batched decoding), the lowest over the batch sizes timed inside it; ranges with none timed keep theirs."""
    from dataclasses import replace

    out = []
    for r in schedule.ranges:
        inside = [v for b, v in measured.items() if r.start <= b <= r.end]
        out.append(replace(r, measured=round(min(inside), 4)) if inside else r)
    return replace(schedule, ranges=tuple(out))


__all__ = ["KEY", "MARGIN", "BatchRange", "DraftPoint", "Schedule", "batch_draft_steps", "check_ranges",
           "cycle_speedup", "draft_growth", "draft_length", "merge_measured", "parse_batch_sizes", "plan_schedule",
           "predicted_table", "schedule_from_dict", "schedule_to_dict"]
