"""Ranking a serving engine's own settings over timed passes (``optimize --engine``), whichever the engine.

Each pass times every setting once, on one server of its own, against the engine's plain decoding in the same
pass. A setting's speedup in a pass is its throughput over plain's there (prefill included); over the passes it is
the worse pass's. A setting ships only if it ran every pass to the end, stayed identical to the reference on every
prompt of each, and beat plain by ``margin`` in every pass (``choose``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PLAIN = "plain"  # the kind (and name) of an engine's plain decoding
MARGIN = 1.03  # a setting ships only if it beat plain by this in every pass


@dataclass(frozen=True)
class Timed:
    """One setting in one pass, as any engine reports it."""

    name: str
    kind: str
    flags: tuple[str, ...]  # how the engine is told to run it
    draft: str | None  # the self-draft it loads, where it loads one
    throughput: float | None  # tokens/s; None: no timing
    identical: int  # prompts equal to the reference
    prompts: int
    error: str | None = None
    draft_layers: tuple[int, ...] | None = None  # a shallow self-draft's kept layers (None: every layer)


@dataclass(frozen=True)
class Ranked:
    """One setting over every pass."""

    name: str
    kind: str
    flags: tuple[str, ...]
    draft: str | None
    speedups: tuple[float, ...]  # per pass: its tokens/s over plain's in that pass (prefill included)
    tokens_per_s: tuple[float, ...]  # per pass
    identical: int  # prompts identical in every pass
    prompts: int
    error: str | None = None  # the first pass's one-line error, if any
    draft_layers: tuple[int, ...] | None = None  # a shallow self-draft's kept layers (None: every layer)

    @property
    def clean(self) -> bool:
        """Ran every pass to the end and equal to the reference on every prompt of each."""
        return self.error is None and self.prompts > 0 and self.identical == self.prompts and bool(self.speedups)

    @property
    def worst(self) -> float | None:
        return min(self.speedups) if self.speedups else None


def rank(passes: Sequence[Sequence[Timed]]) -> tuple[Ranked, ...]:
    """Every setting of the first pass, over every pass, plain first; the fastest clean setting next."""
    by_pass = [{t.name: t for t in p} for p in passes]
    plain_rate = [(lambda r: r.throughput if r is not None and r.error is None else None)(p.get(PLAIN))
                  for p in by_pass]
    out = []
    for first in passes[0] if passes else ():
        name = first.name
        runs = [p.get(name) for p in by_pass]
        error = next((r.error for r in runs if r is not None and r.error), None)
        if any(r is None for r in runs) and error is None:
            error = f"{name}: did not run in every pass"
        rates = tuple(r.throughput for r in runs if r is not None and r.throughput)
        speedups = tuple(rate / base for rate, base in zip(rates, plain_rate, strict=False) if base)
        if len(speedups) != len(passes) and error is None:
            error = f"{name}: no timing in every pass (plain or this setting did not run)"
        identical = min((r.identical for r in runs if r is not None), default=0)
        out.append(Ranked(name, first.kind, first.flags, first.draft, speedups, rates, identical, first.prompts,
                          error, first.draft_layers))
    return ordered(out)


def ordered(rows: Sequence[Ranked]) -> tuple[Ranked, ...]:
    """Plain first, then the clean settings fastest first (by their worse pass), then the rest."""
    plain_first = [r for r in rows if r.kind == PLAIN]
    rest = sorted((r for r in rows if r.kind != PLAIN), key=lambda r: (not r.clean, -(r.worst or 0.0)))
    return (*plain_first, *rest)


def choose(ranked: Sequence[Ranked], margin: float = MARGIN) -> tuple[Ranked | None, Ranked | None]:
    """(the setting to ship or None for plain, the fastest clean speculative setting whether it ships or not)."""
    clean = [r for r in ranked if r.kind != PLAIN and r.clean]
    best = max(clean, key=lambda r: r.worst, default=None)
    return (best if best is not None and best.worst >= margin else None), best


def ratio(ranked: Sequence[Ranked], name: str) -> float:
    """``name``'s worse pass's throughput over plain's; 0.0 where it differed from the reference, failed, or did
    not run."""
    r = next((r for r in ranked if r.name == name), None)
    return round(r.worst, 4) if r is not None and r.clean and r.worst is not None else 0.0


__all__ = ["MARGIN", "PLAIN", "Ranked", "Timed", "choose", "ordered", "rank", "ratio"]
