"""What a profile drafts with, in the terms serving engines have: a prompt lookup, a reduced-precision copy of
the model, both (lookup first, the copy on a miss), or something no engine runs (skip sets, fractal layers,
three levels, a re-selected skip set). And the nearest profiles an engine may run instead, made from a profile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from skipsearch.config import NO_EXIT, DraftConfig
from skipsearch.files.costs import COSTS_KEY
from skipsearch.files.records import LOOKUP_KEY
from skipsearch.profile import Measured, Profile

NGRAM, HYBRID, PRECISION = "ngram", "hybrid", "precision"


@dataclass(frozen=True)
class Lookup:
    min_n: int
    max_n: int
    k: int  # the most tokens one lookup drafts


@dataclass(frozen=True)
class Copy:
    """A draft by the model's own weights in a reduced-precision scheme (a precision draft)."""

    scheme: str
    k: int
    skips: bool  # some sublayers skipped (no engine can)
    trimmed_head: bool  # the draft head covers part of the vocabulary (no engine can)
    quant_head: bool  # the LM head is in the scheme too
    full_attn: tuple[int, ...]
    full_mlp: tuple[int, ...]
    threshold: float  # the draft-exit confidence threshold (0: always K tokens)
    adaptive: bool  # the threshold moves after each verify (no engine can)


def lookup(profile: Profile) -> Lookup | None:
    """The prompt lookup of an ngram or hybrid profile; None for other methods."""
    if profile.method not in (NGRAM, HYBRID):
        return None
    p = dict(profile.method_params)
    return Lookup(int(p.get("min_n", 1)), int(p.get("max_n", 3)), profile.draft.max_draft_tokens)


def fallback(profile: Profile) -> str | None:
    """A hybrid's fallback draft ("precision", "layer-skip", "fractal"); None for none or another method."""
    if profile.method != HYBRID:
        return None
    name = dict(profile.method_params).get("fallback", "layer-skip")
    return None if name == "none" else name


def copy_of(profile: Profile) -> Copy | None:
    """The precision draft of a precision profile or of a hybrid's precision fallback; None otherwise."""
    if profile.method == PRECISION:
        k = profile.draft.max_draft_tokens
    elif fallback(profile) == PRECISION:
        k = int(dict(profile.method_params).get("fallback_k") or profile.draft.max_draft_tokens)
    else:
        return None
    p, d = dict(profile.method_params), profile.draft
    return Copy(scheme=str(p.get("scheme", "fp16")), k=k, skips=bool(d.skip_attn or d.skip_mlp),
                trimmed_head=p.get("vocab_subset") is not None, quant_head=bool(p.get("quant_head", True)),
                full_attn=tuple(p.get("full_attn") or ()), full_mlp=tuple(p.get("full_mlp") or ()),
                threshold=d.exit.threshold, adaptive=d.exit.adaptive)


def lookup_only(profile: Profile, *, n: int | None = None) -> Profile:
    """An ngram profile with ``profile``'s lookup (its suffix lengths, or ``n`` alone) and K, keeping the lookup
    record and cost profile it was searched with, so that re-planning can price it (the record covers the profile's
    own suffix lengths only)."""
    lk = lookup(profile)
    assert lk is not None, "lookup_only needs an ngram or hybrid profile"
    lo, hi = (n, n) if n is not None else (lk.min_n, lk.max_n)
    kept = tuple((k, v) for k, v in (profile.measured.extra if profile.measured else ())
                 if k in (COSTS_KEY, LOOKUP_KEY) and (n is None or (lo, hi) == (lk.min_n, lk.max_n)))
    measured = Measured(baseline="predicted", source="export", extra=kept,
                        notes=f"the lookup of {profile.method} profile alone, made by skipsearch export")
    return replace(profile, method=NGRAM, draft=DraftConfig(max_draft_tokens=lk.k, exit=NO_EXIT),
                   method_params=(("min_n", lo), ("max_n", hi)), measured=measured)


def copy_only(profile: Profile, *, scheme: str | None = None) -> Profile:
    """A precision profile with ``profile``'s reduced-precision copy as an engine can run it: every sublayer in
    the scheme (or ``scheme``), none skipped, the full vocabulary; K and a fixed exit threshold kept."""
    cp = copy_of(profile)
    assert cp is not None, "copy_only needs a precision profile or a hybrid with a precision fallback"
    params = [("scheme", scheme or cp.scheme), ("quant_head", cp.quant_head)]
    params += [("full_attn", list(cp.full_attn))] if cp.full_attn else []
    params += [("full_mlp", list(cp.full_mlp))] if cp.full_mlp else []
    exit_rule = replace(profile.draft.exit, adaptive=False) if cp.threshold else NO_EXIT
    measured = Measured(baseline="predicted", source="export",
                        notes=f"the reduced-precision copy of {profile.method} profile alone, by skipsearch export")
    return replace(profile, method=PRECISION, draft=DraftConfig(max_draft_tokens=cp.k, exit=exit_rule),
                   method_params=tuple(params), measured=measured)


def summary(profile: Profile) -> str:
    """The profile's draft in a few words, for messages."""
    if profile.draft.max_draft_tokens == 0:
        return f"{profile.method} profile that ships plain decoding (K=0)"
    parts = [f"{profile.method}, K={profile.draft.max_draft_tokens}"]
    lk, cp = lookup(profile), copy_of(profile)
    if lk:
        parts.append(f"lookup n={lk.min_n}..{lk.max_n}")
    if cp:
        parts.append(f"{cp.scheme} copy" + (f" (K={cp.k})" if profile.method != PRECISION else ""))
    return ", ".join(parts)


__all__ = ["Copy", "Lookup", "copy_of", "copy_only", "fallback", "lookup", "lookup_only", "summary"]
