"""After the search: time the shortlist, and choose what ships.

One phase, run as a unit (``ship``) that returns a frozen ``Shipped``:
1. time: each shortlisted candidate is claimed in the study (one claim per candidate, over every worker),
   timed by the objective, and recorded; a claim that cannot finish is failed with its one-line error;
2. choose: the best *timed* candidate ships if it beat plain decoding, on a machine no other skipsearch
   worker shared, and again when timed once more; otherwise plain decoding (``max_draft_tokens: 0``) ships,
   and the verdict says why, with the measured figures;
3. companions: what the strategy ships beside it (e.g. CLaSp's dynamic candidate), as the strategy's data;
   the caller writes their profiles.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import optuna

from skipsearch.config import AUTOREGRESSIVE, Candidate
from skipsearch.measure import Measurement
from skipsearch.methods import PLAIN
from skipsearch.methods.summary import candidate_summary
from skipsearch.search.strategies import Companion, Strategy
from skipsearch.search.study.record import (
    KIND_ATTR,
    MACHINE_ATTR,
    MEASUREMENT_ATTR,
    WORKER_ATTR,
    TrialRecord,
    best,
    candidate_attrs,
    records,
    shortlist,
    trial_candidate,
)
from skipsearch.search.study.storage import finish_trial, heartbeat, set_trial_attr, storage_conflict
from skipsearch.search.study.workers import contention, worker_id

if TYPE_CHECKING:
    from skipsearch.search.objective import ModelObjective

CLAIM_ATTR = "claim"  # trial user attr: the random token of the worker that claimed a timing
_STATES = optuna.trial.TrialState


@dataclass(frozen=True)
class Shipped:
    """What the phase after the search decided."""

    candidate: Candidate  # what ships: the best draft, or plain decoding (K = 0) keeping its settings
    measurement: Measurement | None  # the figures it ships with
    verdict: str  # one sentence: what ships and why
    timed: tuple[TrialRecord, ...]  # the study's timed records, best first
    best: TrialRecord | None  # the study's best record (timed preferred)
    companions: tuple[Companion, ...]  # the strategy's candidates to ship beside it, not timed
    interrupted: bool  # Ctrl-C stopped the search or the timing


def ship(study: optuna.Study, objective: ModelObjective, strategy: Strategy, *, shortlisted: int | None,
         interrupted: bool, machine: str, say: Callable[[str], None]) -> Shipped:
    """Time the study's best ``shortlisted`` distinct candidates (None: time none), then choose what ships.
    Ctrl-C while timing stops the timing: what was timed already counts (a shortlist timed together is one
    timing: none of it, when stopped inside it), and nothing is re-checked.

    Only timings made on ``machine`` (``hardware.machine_key``) count: a study resumed on another machine, a
    shared one or one checked out with the repository, has its shortlist timed again here, and ships this
    machine's figures."""
    # 1. time the shortlist
    if shortlisted is not None and not interrupted:
        try:
            _time_shortlist(study, objective, shortlist(study, shortlisted), machine, say)
        except KeyboardInterrupt:
            interrupted = True
    # 2. choose
    timed = sorted((r for r in records(study) if r.measurement is not None and r.measurement.kind == "timed"
                    and r.machine == machine), key=lambda r: -r.measurement.speedup)
    top_any = best(study, machine=machine)
    shipped, m, why = verdict(timed, top_any, objective, strategy, interrupted=interrupted, say=say)
    # 3. the strategy's companions, chosen from what was tried, best first
    tried = [r.candidate for r in timed] + ([top_any.candidate] if top_any else [])
    return Shipped(shipped, m, why, tuple(timed), top_any, tuple(strategy.companions(shipped, tried)), interrupted)


# -- 1. timing the shortlist: one claim per candidate, over every worker ---------------------------------------


def claim_timed(study: optuna.Study, candidate: Candidate, machine: str) -> int | None:
    """Claim the timing of ``candidate`` on ``machine`` for this worker: a RUNNING trial that other workers see.

    Returns the claim's trial number, or None when the candidate is timed (or being timed) on this machine
    already; a timing from another machine (or from a study that did not record one) does not count.
    Two workers claiming at the same moment both add a claim; the lower trial number keeps it and
    the other fails its own claim, so no candidate is ever timed twice.
    """
    def twins() -> list[optuna.trial.FrozenTrial]:
        live = study.get_trials(deepcopy=False, states=(_STATES.COMPLETE, _STATES.RUNNING))
        return [t for t in live if t.user_attrs.get(KIND_ATTR) == "timed" and t.user_attrs.get(MACHINE_ATTR) == machine
                and trial_candidate(t) == candidate]

    if twins():
        return None
    token = secrets.token_hex(8)
    study.add_trial(optuna.trial.create_trial(
        state=_STATES.RUNNING, params={}, distributions={},
        user_attrs={**candidate_attrs(candidate), KIND_ATTR: "timed", CLAIM_ATTR: token, WORKER_ATTR: worker_id(),
                    MACHINE_ATTR: machine},
    ))
    mine = next(t for t in twins() if t.user_attrs.get(CLAIM_ATTR) == token)
    if min(t.number for t in twins()) != mine.number:
        fail_claim(study, mine.number, "another worker claimed this candidate first")
        return None
    return mine.number


def record_timed(study: optuna.Study, claim: int, m: Measurement) -> str | None:
    """Finish a claimed timed trial with its measurement; None, or the storage conflict that prevented it
    (another worker failed the claim as lost: it is never written again)."""
    try:
        set_trial_attr(study, claim, MEASUREMENT_ATTR, m.to_dict())
    except Exception as e:
        if not storage_conflict(e):
            raise
        return finish_trial(study, claim, error=f"measurement not recorded: {' '.join(str(e).split())[:200]}")
    return finish_trial(study, claim, value=m.speedup)


def fail_claim(study: optuna.Study, claim: int, error: str) -> str | None:
    """Mark a claim this process added as failed, with its one-line error; None, or the storage conflict."""
    return finish_trial(study, claim, error=error)


def _time_shortlist(study: optuna.Study, objective: ModelObjective, candidates: Sequence[Candidate], machine: str,
                    say) -> None:
    """Time what this worker claims of ``candidates`` together, one baseline for all (``ModelObjective.time_all``);
    one by one where the objective times only one at a time, or when the run together fails (each candidate's own
    failure is then recorded against it alone)."""
    claims = [(c, claim) for c in candidates if (claim := claim_timed(study, c, machine)) is not None]
    if len(claims) < 2 or not hasattr(objective, "time_all"):
        for c, claim in claims:
            _time_claimed(study, objective, c, say, claim=claim)
        return
    for c, _ in claims:
        say(f"timing {candidate_summary(c)}")
    say(f"(the {len(claims)} timed together, interleaved with one autoregressive baseline)")
    try:
        with contextlib.ExitStack() as beating:
            for _, claim in claims:
                beating.enter_context(heartbeat(study, claim))
            busy = contention(study)
            ms = objective.time_all([c for c, _ in claims])
            busy = busy or contention(study)
    except KeyboardInterrupt:
        for _, claim in claims:
            fail_claim(study, claim, "interrupted")
        raise
    except Exception:  # noqa: BLE001 - which candidate failed is found by timing each alone
        for c, claim in claims:
            _time_claimed(study, objective, c, say, claim=claim)
        return
    if busy:
        say(f"warning: {busy}: these figures will not be shipped")
    for (_, claim), m in zip(claims, ms, strict=True):
        conflict = record_timed(study, claim, replace(m, notes=busy) if busy else m)
        if conflict:
            say(f"warning: {conflict}")


def _time_claimed(study: optuna.Study, objective: ModelObjective, candidate: Candidate, say, *, claim: int) -> None:
    """Time ``candidate`` alone on this worker's ``claim``, and record it (or its one-line failure)."""
    say(f"timing {candidate_summary(candidate)}")
    try:
        with heartbeat(study, claim):
            busy = contention(study)
            m = objective.evaluate(candidate, kind="timed")
            busy = busy or contention(study)
        if busy:
            say(f"warning: {busy}: this figure will not be shipped")
            m = replace(m, notes=busy)
        conflict = record_timed(study, claim, m)
        if conflict:
            say(f"warning: {conflict}")
    except KeyboardInterrupt:
        fail_claim(study, claim, "interrupted")
        raise
    except Exception as e:  # e.g. out of memory: recorded, and the next candidate is timed
        conflict = fail_claim(study, claim, " ".join(str(e).split())[:300] or type(e).__name__)
        if conflict:
            say(f"warning: {conflict}")


# -- 2. what ships ---------------------------------------------------------------------------------------------


def verdict(timed: Sequence[TrialRecord], top_any: TrialRecord | None, objective: ModelObjective,
            strategy: Strategy, *, interrupted: bool, say) -> tuple[Candidate, Measurement | None, str]:
    """The candidate to ship, the measurement it ships with, and one sentence saying why."""
    trusted = [r for r in timed if not r.measurement.notes]
    top = trusted[0] if trusted else None
    if top is not None and top.measurement.speedup > 1.0 and not interrupted:
        # A speedup is re-checked before it ships: timing noise, or a neighbour that came and went,
        # must not put a loss into a profile that teams will share.
        say(f"re-checking {candidate_summary(top.candidate)} before shipping it")
        again = objective.evaluate(top.candidate, kind="timed")
        if again.speedup > 1.0:
            m = top.measurement
            return top.candidate, m, (f"ships {candidate_summary(top.candidate)}: {m.speedup:.3f}x measured against "
                                      f"autoregressive decoding, {again.speedup:.3f}x when timed again")
        top_m = top.measurement
        why = (f"; best draft measured {top_m.speedup:.3f}x but {again.speedup:.3f}x when timed again, so it "
               f"does not reliably beat plain decoding")
        return plain_decoding(top.candidate), top_m, "ships max_draft_tokens 0" + why
    if not timed and top_any is not None and top_any.measurement.kind == "surrogate" and \
            top_any.measurement.speedup > 1.0:
        m = top_any.measurement
        return top_any.candidate, m, (f"ships {candidate_summary(top_any.candidate)}: {m.speedup:.3f}x predicted "
                                      f"(surrogate only; not timed)")
    best_r = top or (timed[0] if timed else top_any)
    m = best_r.measurement if best_r is not None else None
    costs = objective.measured_costs  # never measured on the way out of a Ctrl-C
    why = ""
    if m is not None:
        # the figures that belong to the method; a timing taken under load says so, and v(k) measured beside
        # flagged timings is left out (under contention it reads 14 where the machine's own is 1.6)
        why = f"; best draft measured {m.speedup:.3f}x" + (" under load" if m.notes else "")
        figures = method_figures(m)
        why += f" with {figures}" if figures else ""
        why += f", v(2) {costs.verify(2):.2f}" if costs is not None and not m.notes and trusted else ""
    if timed and not trusted:
        why += f" (every timing was flagged: {timed[0].measurement.notes})"
    # nothing measured: plain decoding as the plain method writes it (a method's own may need params, fractal's n, w)
    base = best_r.candidate if best_r is not None else Candidate(PLAIN, AUTOREGRESSIVE)
    return plain_decoding(base), m, "no draft candidate beat plain decoding on this hardware: ships " \
                                    "max_draft_tokens 0" + why


def method_figures(m: Measurement) -> str:
    """The acceptance figures that mean something for the measured draft: a model draft's α and c; a draft with
    no per-token α (a lookup, which no model runs; a draft no surrogate traces) its acceptance rate and τ. A
    figure that was not measured is left out, never printed as 0."""
    parts = []
    if m.alpha is not None:
        parts.append(f"alpha {m.alpha:.2f}")
        if m.cost_ratio is not None:
            parts.append(f"c {m.cost_ratio:.2f}")
    else:
        if m.acceptance_rate is not None:
            parts.append(f"acceptance {m.acceptance_rate:.2f}")
        if m.tau is not None:
            parts.append(f"tau {m.tau:.2f}")
    return ", ".join(parts)


def plain_decoding(candidate: Candidate) -> Candidate:
    """Plain decoding (K = 0), keeping the method, its parameters and the skip sets, so that the profile
    shows what was best, and can start another search (``--warm-start``) from it."""
    return replace(candidate, draft=replace(candidate.draft, max_draft_tokens=0))


__all__ = ["CLAIM_ATTR", "Shipped", "claim_timed", "fail_claim", "method_figures", "plain_decoding",
           "record_timed", "ship", "verdict"]
