"""What a profile drafts with, in the terms serving engines have, and the nearest profiles an engine may run
instead, made from a profile.

The terms are the method registry's (``methods.Setting``, each method's ``speculation``): a prompt lookup, a
reduced-precision copy of the model as a draft model, both (lookup first, the copy on a miss), or nothing a
serving engine runs (skip sets, fractal layers, three levels, a re-selected skip set). A nearest profile is the
candidate the registry makes of a setting (``methods.candidate_for``): no exporter names a method.
"""

from __future__ import annotations

from dataclasses import replace

from skipsearch import methods
from skipsearch.files.costs import COSTS_KEY
from skipsearch.methods import DraftModel, Lookup, Setting
from skipsearch.methods.ngram import LOOKUP_KEY
from skipsearch.profile import Measured, Profile


def setting(profile: Profile) -> Setting:
    """The profile's draft as an engine-neutral speculative setting."""
    return methods.setting_of(profile.candidate)


def lookup_alone(profile: Profile) -> bool:
    """Whether the profile drafts by prompt lookup and nothing else."""
    s = setting(profile)
    return s.lookup is not None and s.draft_model is None and s.fallback is None


def nearest(profile: Profile, near: Setting, measured: Measured) -> Profile:
    """``profile`` drafting with the setting ``near`` instead (the candidate the registry makes of it)."""
    cand = methods.candidate_for(near)
    return replace(profile, method=cand.method, draft=cand.draft, method_params=tuple(cand.plain_params().items()),
                   measured=measured)


def lookup_only(profile: Profile, *, n: int | None = None) -> Profile:
    """A profile of ``profile``'s lookup alone (its suffix lengths, or ``n`` alone) and K, keeping the lookup
    record and cost profile it was searched with, so that re-planning can price it (the record covers the profile's
    own suffix lengths only)."""
    lk = setting(profile).lookup
    assert lk is not None, "lookup_only needs a profile that looks up n-grams"
    lo, hi = (n, n) if n is not None else (lk.min_n, lk.max_n)
    kept = tuple((k, v) for k, v in (profile.measured.extra if profile.measured else ())
                 if k in (COSTS_KEY, LOOKUP_KEY) and (n is None or (lo, hi) == (lk.min_n, lk.max_n)))
    measured = Measured(baseline="predicted", source="export", extra=kept,
                        notes=f"the lookup of {profile.method} profile alone, made by skipsearch export")
    return nearest(profile, Setting(lookup=Lookup(lo, hi, lk.k)), measured)


def _copy_measured(profile: Profile) -> Measured:
    return Measured(baseline="predicted", source="export",
                    notes=f"the reduced-precision copy of {profile.method} profile alone, by skipsearch export")


def runnable_copy(profile: Profile, *, scheme: str | None = None, exit: bool = True) -> DraftModel:
    """``profile``'s draft model as an engine can run it: every sublayer in the scheme (or ``scheme``), none
    skipped, the full vocabulary; K and a fixed exit threshold kept (dropped without ``exit``)."""
    dm = setting(profile).draft_model
    assert dm is not None, "runnable_copy needs a profile that drafts with a reduced-precision copy"
    return dm.runnable(scheme, exit=exit)


def copy_only(profile: Profile, *, scheme: str | None = None, exit: bool = True) -> Profile:
    """A profile of ``profile``'s reduced-precision copy alone, as an engine can run it (``runnable_copy``)."""
    return nearest(profile, Setting(draft_model=runnable_copy(profile, scheme=scheme, exit=exit)),
                   _copy_measured(profile))


def lookup_then_copy(profile: Profile, *, n: int, scheme: str | None = None) -> Profile:
    """A profile of ``profile``'s lookup of ``n`` alone and, on a miss, its copy as an engine can run it."""
    lk = setting(profile).lookup
    assert lk is not None, "lookup_then_copy needs a profile that looks up n-grams"
    near = Setting(lookup=Lookup(n, n, lk.k), draft_model=runnable_copy(profile, scheme=scheme))
    return nearest(profile, near, _copy_measured(profile))


__all__ = ["copy_only", "lookup_alone", "lookup_only", "lookup_then_copy", "nearest", "runnable_copy", "setting"]
