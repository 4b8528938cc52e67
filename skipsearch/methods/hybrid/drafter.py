"""The hybrid's drafters: the lookup every cycle, the fallback's own drafter on a miss; one row, or a batch."""

from __future__ import annotations

from collections.abc import Sequence

from skipsearch.config import Candidate, ConfigError
from skipsearch.engine.draft import BatchDrafter, Drafter
from skipsearch.methods.base import (
    ParamsError,
    batch_drafter,
    get,
)
from skipsearch.methods.hybrid.params import HybridParams, parse
from skipsearch.methods.ngram import (
    NgramBatchDrafter,
    NgramDrafter,
    NgramParams,
)


class HybridDrafter(Drafter):
    """The engine's Drafter: the lookup every cycle, the fallback drafter on a miss."""

    wants_tokens = True  # the lookup reads the sequence

    def __init__(self, params: HybridParams, max_draft_tokens: int, fallback, fallback_k: int) -> None:
        self.lookup = NgramDrafter(NgramParams(params.min_n, params.max_n), max_draft_tokens)
        self.fallback, self.fallback_k = fallback, fallback_k
        self._last = None  # the source of the last draft, which the next observe() is about
        self.cycles = self.drafted = self.accepted = 0  # the fallback's
        self.seconds = 0.0

    @property
    def threshold(self) -> float | None:
        return self.fallback.threshold if self.fallback is not None else None

    def draft(self, sm, cache, *, pending, start, limit, sampling, generator, history: Sequence[int]):
        from skipsearch.engine import timing

        # 1a. look the suffix up; a hit is this cycle's draft
        found = self.lookup.draft(sm, cache, pending=pending, start=start, limit=limit, sampling=sampling,
                                  generator=generator, history=history)
        self._last = self.lookup
        if found.tokens or self.fallback is None:
            return found
        # 1b. a miss: the fallback drafts (it may leave draft KV in the cache; the engine crops it)
        t0 = timing.now(sm.device)
        extra = {"history": history} if self.fallback.wants_tokens else {}
        out = self.fallback.draft(sm, cache, pending=pending, start=start, limit=min(limit, self.fallback_k),
                                  sampling=sampling, generator=generator, **extra)
        self.seconds += timing.now(sm.device) - t0
        self.cycles += 1
        self._last = self.fallback
        return out

    def warm(self, sm) -> None:
        if self.fallback is not None:
            self.fallback.warm(sm)

    def observe(self, drafted: int, accepted: int) -> None:
        if self._last is self.fallback:
            self.drafted += drafted
            self.accepted += accepted
        if self._last is not None:
            self._last.observe(drafted, accepted)  # the layer-skip fallback's adaptive exit learns from its own

    def report(self) -> tuple[tuple[str, float], ...]:
        own = (("fallback_cycles", float(self.cycles)), ("fallback_drafted", float(self.drafted)),
               ("fallback_accepted", float(self.accepted)), ("fallback_seconds", self.seconds))
        theirs = tuple(self.fallback.report()) if self.fallback is not None else ()
        return (*self.lookup.report(), *own, *theirs)




class HybridBatchDrafter(BatchDrafter):
    """The batched engine's BatchDrafter: every row's lookup, then the fallback's batch drafter for the rows whose
    lookup missed (the others get a limit of 0, so it runs the draft model only if some row missed)."""

    wants_tokens = True  # the lookup reads the sequences

    def __init__(self, params: HybridParams, max_draft_tokens: int, fallback: BatchDrafter | None, fallback_k: int,
                 *, single) -> None:
        self.lookup = NgramBatchDrafter(NgramParams(params.min_n, params.max_n), max_draft_tokens)
        self.fallback, self.fallback_k = fallback, fallback_k
        self._single = single  # () -> the one-sequence HybridDrafter
        self._missed: list[bool] = []  # per row: the last draft was the fallback's

    def begin(self, rows: int) -> None:
        self.lookup.begin(rows)
        if self.fallback is not None:
            self.fallback.begin(rows)

    def draft(self, sm, step, *, pending, limits, history: Sequence[Sequence[int]]):
        # 1a. every row looks its suffix up; a hit is that row's draft
        found = self.lookup.draft(sm, step, pending=pending, limits=limits, history=history)
        misses = [0 if hit or self.fallback is None else min(limit, self.fallback_k)
                  for hit, limit in zip(found, limits, strict=True)]
        self._missed = [bool(m) for m in misses]
        if not any(misses):
            return found
        # 1b. the rows that missed: the fallback drafts for them (its draft KV is cropped by the engine)
        extra = {"history": history} if self.fallback.wants_tokens else {}
        theirs = self.fallback.draft(sm, step, pending=pending, limits=misses, **extra)
        return tuple(t if m else f for f, t, m in zip(found, theirs, self._missed, strict=True))

    def observe(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        if self.fallback is not None and any(self._missed):  # its adaptive exit learns from its own rows only
            self.fallback.observe([d if m else 0 for d, m in zip(drafted, self._missed, strict=True)],
                                  [a if m else 0 for a, m in zip(accepted, self._missed, strict=True)])

    def single(self) -> Drafter:
        return self._single()


def _drafter(candidate: Candidate, sm, *, batch: bool = False) -> HybridDrafter | HybridBatchDrafter:
    """A ``HybridDrafter``, or with ``batch`` the batched engine's ``HybridBatchDrafter``, over the fallback's own
    drafter from the registry (with ``batch``, a fallback that cannot batch is one line)."""
    params = parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    fb = params.fallback_candidate(candidate.draft)
    fallback = None
    if fb is not None:
        try:
            fallback = batch_drafter(fb, sm) if batch else get(fb.method).drafter(fb, sm)
        except ConfigError as e:
            if not (batch or isinstance(e, ParamsError)):
                raise
            raise ParamsError(f"hybrid: fallback {e}") from None
    fallback_k = fb.draft.max_draft_tokens if fb is not None else 0
    if batch:
        return HybridBatchDrafter(params, candidate.draft.max_draft_tokens, fallback, fallback_k,
                                  single=lambda: _drafter(candidate, sm))
    return HybridDrafter(params, candidate.draft.max_draft_tokens, fallback, fallback_k)
