"""``ngram``: prompt lookup. The draft is the continuation of the latest earlier match of the last n tokens.

No model runs to draft: the drafter keeps an index of every n-gram in the prompt and in the text
generated so far (``min_n <= n <= max_n``), looks up the sequence's last n tokens, longest n first,
and proposes up to K tokens that followed their most recent earlier occurrence. Where that
continuation runs into the suffix itself (the text repeats with a period shorter than K), the copy
goes on over the tokens it has just proposed, as an LZ77 copy does, so a loop drafts K tokens and
not one period. With no match it drafts nothing, and that cycle is a plain decoding step.

Losslessness: greedy keeps a draft token only if it is the full model's argmax. Sampling treats the
draft as a one-hot proposal q = δ_d: the engine's rejection rule accepts d with probability
min(1, p(d)/1) = p(d), and on rejection draws from norm(max(0, p − δ_d)), which is p with d removed
and renormalised. So the output distribution is the full model's.

``method_params``: ``min_n``, ``max_n``; K is the draft config's ``max_draft_tokens``. The surrogate
(``_predict``) is exact in acceptance: the draft depends on tokens only, so replaying the full model's
greedy continuation cycle by cycle (``replay_cycles``) drafts and accepts what decoding does.

Its record (``LookupRecord``, ``measured.lookup``): what the lookup proposes at each output position of the
calibration and how much of it matches, one fact per position whatever K is. Re-planning replays every K from it under
another device's v(k) (``replan``), exactly in acceptance and with no model.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from skipsearch.config import AUTOREGRESSIVE, NO_EXIT, Candidate, ConfigError, DraftConfig
from skipsearch.engine.draft import BatchDrafter, Draft, Drafter
from skipsearch.files.errors import ProfileError
from skipsearch.files.records import MATCH_ENCODING, NO_HIT, known_keys, match_sequences, optional_strings, read_record
from skipsearch.methods.base import (
    Keeping,
    Kept,
    Lookup,
    Method,
    ParamsError,
    Record,
    Replanned,
    Replanning,
    Setting,
    Speculation,
    check_keys,
    int_param,
)

MAX_N = 16  # longer keys almost never repeat verbatim; the bound keeps the index small


def check_n_range(method: str, min_n: Any, max_n: Any) -> None:
    """The lookup's suffix lengths, as every method that looks up n-grams takes them."""
    raw = {"min_n": min_n, "max_n": max_n}
    int_param(method, raw, "min_n", low=1, high=MAX_N)
    int_param(method, raw, "max_n", low=1, high=MAX_N)
    if min_n > max_n:
        raise ParamsError(f"{method}: method_params.min_n ({min_n}) must be <= max_n ({max_n})")


@dataclass(frozen=True)
class NgramParams:
    method: ClassVar[str] = "ngram"
    min_n: int = 1  # shortest suffix looked up
    max_n: int = 3  # longest suffix looked up (tried first: a longer match predicts better)

    def __post_init__(self) -> None:
        check_n_range(self.method, self.min_n, self.max_n)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> NgramParams:
        check_keys(cls.method, raw, cls)
        if draft.skip_attn or draft.skip_mlp:
            raise ParamsError("ngram: draft.skip_attn and draft.skip_mlp must be empty (no layer runs to draft)")
        return cls(min_n=raw.get("min_n", cls.min_n), max_n=raw.get("max_n", cls.max_n))

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        return (("min_n", self.min_n), ("max_n", self.max_n))


class NgramIndex:
    """The latest end position of every n-gram (min_n <= n <= max_n) of a growing token sequence.

    The sequence only grows (the engine appends what it emits), so the index is extended with the
    n-grams that end at new positions and never rebuilt: each token costs max_n - min_n + 1 inserts.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> index of its last token, latest occurrence
        self._indexed = 0  # n-grams ending before this position are in the index

    def extend(self, seq: Sequence[int], upto: int) -> None:
        """Index the n-grams that end at positions < ``upto``."""
        for end in range(self._indexed, upto):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self._last[tuple(seq[end - n + 1 : end + 1])] = end
        self._indexed = max(self._indexed, upto)

    def lookup(self, seq: Sequence[int], k: int) -> tuple[int, ...]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of ``seq``'s longest indexed suffix."""
        end = len(seq) - 1
        self.extend(seq, end)  # every n-gram but the suffix itself, which must match an *earlier* one
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            hit = self._last.get(tuple(seq[end - n + 1 :]))
            if hit is not None:
                # seq[hit + 1 ..] followed the match; past seq's end the copy reads what it has just
                # drafted, so token j is seq[hit + 1 + j mod (end - hit)]
                period = end - hit
                return tuple(seq[hit + 1 + j % period] for j in range(k))
        return ()


class NgramDrafter(Drafter):
    """The engine's Drafter for prompt lookup; the engine hands it the sequence (``wants_tokens``)."""

    wants_tokens = True  # decoding.generate passes history=: the prompt, the output so far, the pending token

    def __init__(self, params: NgramParams, max_draft_tokens: int) -> None:
        self.params = params
        self.k = max_draft_tokens
        self.index = NgramIndex(params.min_n, params.max_n)
        self.lookups = self.hits = self.drafted = self.accepted = 0
        self.seconds = 0.0

    def draft(self, sm, cache, *, pending, start, limit, sampling, generator, history: Sequence[int]) -> Draft:
        from skipsearch.engine import timing
        from skipsearch.engine.decoding import one_hot_probs

        t0 = timing.now(sm.device)
        tokens = self.index.lookup(history, min(limit, self.k))
        self.lookups += 1
        self.hits += bool(tokens)
        probs = None if sampling.greedy or not tokens else one_hot_probs(tokens, sm)  # q = δ_d: [k, V]
        self.seconds += timing.now(sm.device) - t0
        return Draft(tokens, probs, forwards=0)  # looked up: no model ran

    def observe(self, drafted: int, accepted: int) -> None:
        # nothing adapts (the index already holds every verified token); counted for the report
        self.drafted += drafted
        self.accepted += accepted

    def report(self) -> tuple[tuple[str, float], ...]:
        return (("lookups", float(self.lookups)), ("lookup_hits", float(self.hits)),
                ("ngram_drafted", float(self.drafted)), ("ngram_accepted", float(self.accepted)),
                ("ngram_seconds", self.seconds))


class NgramBatchDrafter(BatchDrafter):
    """The batched engine's BatchDrafter for prompt lookup: one index per row, no model runs."""

    wants_tokens = True  # batched.generate_batch passes history=: per row, the sequence so far

    def __init__(self, params: NgramParams, max_draft_tokens: int) -> None:
        self.params = params
        self.k = max_draft_tokens
        self.indexes: list[NgramIndex] = []

    def begin(self, rows: int) -> None:
        self.indexes = [NgramIndex(self.params.min_n, self.params.max_n) for _ in range(rows)]

    def draft(self, sm, step, *, pending, limits, history: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
        return tuple(index.lookup(seq, min(limit, self.k)) if limit else ()
                     for index, seq, limit in zip(self.indexes, history, limits, strict=True))

    def single(self) -> NgramDrafter:
        return NgramDrafter(self.params, self.k)


# -- the surrogate ---------------------------------------------------------------------------------
# propose(seq, t, limit) -> (source, drafted, matched): what a drafter proposes at output position t
# (``seq`` is the prompt and continuation[:t]), at most ``limit`` tokens; matched = its leading tokens
# equal to continuation[t:], at most len(continuation) - t.
Propose = Callable[[list[int], int, int], tuple[str, int, int]]


def leading_matches(tokens: Sequence[int], continuation: Sequence[int], t: int) -> int:
    """How many of ``tokens`` equal continuation[t], continuation[t + 1], ... from the first on."""
    a = 0
    while a < len(tokens) and t + a < len(continuation) and tokens[a] == continuation[t + a]:
        a += 1
    return a


def replay_cycles(prompt: Sequence[int], continuation: Sequence[int], *, max_new_tokens: int,
                  propose: Propose) -> list[tuple[str, int, int, int]]:
    """The cycles ``decoding.generate`` runs over the full model's greedy ``continuation`` of ``prompt``
    (its output, EOS included), as (source, drafted, accepted, emitted), by the engine's own rules: the
    first token comes from the prefill; a cycle drafts at most max_new_tokens - len(out) - 1 tokens and
    none when that is 0; it emits the accepted drafts and one token of the full model, and stops at EOS
    (an accepted EOS ends the output there, with no token after it)."""
    cycles: list[tuple[str, int, int, int]] = []
    seq, t = [*prompt, *continuation[:1]], 1
    while t < len(continuation):
        limit = max_new_tokens - t - 1
        source, drafted, accepted = propose(seq, t, limit) if limit > 0 else ("none", 0, 0)
        emitted = accepted if t + accepted == len(continuation) else accepted + 1
        seq.extend(continuation[t : t + emitted])
        t += emitted
        cycles.append((source, drafted, accepted, emitted))
    return cycles


def _predict(objective, candidate: Candidate):
    """Acceptance, τ and the number of verify steps exactly as decoding gives them; cost, in full steps,
    the measured v(k+1) per verify plus the lookups' own time (timed here) over one step's seconds."""
    from skipsearch.engine import timing

    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=objective.sm.num_layers)
    costs, k = objective.costs, candidate.draft.max_draft_tokens
    t_start = timing.now()
    lookup_seconds = 0.0
    cycles = []
    for prompt, cont in zip(objective.cal.prompts, objective.cal.continuations, strict=True):
        index = NgramIndex(params.min_n, params.max_n)

        def propose(seq, t, limit, index=index, cont=cont):
            nonlocal lookup_seconds
            t0 = timing.now()
            tokens = index.lookup(seq, min(limit, k))
            lookup_seconds += timing.now() - t0
            return METHOD.name, len(tokens), leading_matches(tokens, cont, t)

        cycles += replay_cycles(prompt, cont, max_new_tokens=objective.cal.max_new_tokens, propose=propose)
    return cycle_measurement(cycles, verify=costs.verify,
                             extra_steps=lookup_seconds / costs.step_seconds, seconds=timing.now() - t_start)


def cycle_measurement(cycles: Sequence[tuple[str, int, int, int]], *, verify: Callable[[int], float],
                      extra_steps: float = 0.0, draft_steps: float = 0.0, seconds: float = 0.0, **fields):
    """A surrogate Measurement from replayed cycles: every cycle pays v(drafted + 1); ``draft_steps`` and
    ``extra_steps`` (both in full steps) are what drafting and looking up cost on top. ``fields`` go to
    the Measurement (alpha, cost_ratio)."""
    from skipsearch.measure import Measurement

    emitted = sum(c[3] for c in cycles)
    drafted, accepted = sum(c[1] for c in cycles), sum(c[2] for c in cycles)
    cost = sum(verify(c[1] + 1) for c in cycles) + draft_steps + extra_steps
    speedup = emitted / cost if cost else 1.0
    fields.setdefault("cost_ratio", extra_steps / max(drafted, 1))
    return Measurement(kind="surrogate", speedup=speedup, predicted_speedup=speedup,
                       tau=emitted / len(cycles) if cycles else 1.0,
                       acceptance_rate=accepted / drafted if drafted else None, seconds=seconds, **fields)


# -- the lookup record: prompt lookup's acceptance, exact from the tokens alone ---------------------------------
# A lookup draft depends on the tokens so far only, and greedy output is the full model's whatever K is, so what
# the lookup proposes at each output position, and how much of it matches, is one fact per position: a cycle at
# position t with K drafts min(K, limit) tokens on a hit and accepts min(matched_t, those). The record keeps, per
# calibration sequence, one byte per position t = 1 .. len - 1 (files.records.MATCH_ENCODING): NO_HIT, or
# matched_t capped at max_k.
LOOKUP_KEY = "lookup"  # measured.<key> of an ngram or hybrid profile
LOOKUP_ENCODING = MATCH_ENCODING


@dataclass(frozen=True)
class LookupRecord:
    min_n: int
    max_n: int
    max_k: int
    max_new_tokens: int  # the calibration's: a cycle drafts at most max_new_tokens - t - 1 tokens
    sequences: tuple[str, ...]  # encoded, one per calibration sequence
    workload: str | None = None

    def positions(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(base64.b64decode(s)) for s in self.sequences)

    def hit_rate(self) -> float:
        seqs = [b for seq in self.positions() for b in seq]
        return sum(b != NO_HIT for b in seqs) / len(seqs) if seqs else 0.0


def lookup_to_dict(rec: LookupRecord) -> dict:
    out: dict[str, Any] = {"encoding": LOOKUP_ENCODING, "min_n": rec.min_n, "max_n": rec.max_n, "max_k": rec.max_k,
                           "max_new_tokens": rec.max_new_tokens}
    if rec.workload:
        out["workload"] = rec.workload
    out["hit_rate"] = round(rec.hit_rate(), 4)
    out["sequences"] = list(rec.sequences)
    return out


def lookup_from_dict(raw: Any, *, source: str = "<profile>") -> LookupRecord:
    """Validate ``measured.lookup``; every problem is one ProfileError line."""
    path, raw = read_record(raw, LOOKUP_KEY, LOOKUP_ENCODING, source)
    known_keys(raw, ("encoding", "min_n", "max_n", "max_k", "max_new_tokens", "workload", "hit_rate", "sequences"),
               path, source)
    ints = {}
    for key, low in (("min_n", 1), ("max_n", 1), ("max_k", 1), ("max_new_tokens", 1)):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (key == "max_k" and value >= NO_HIT):
            raise ProfileError(f"{source}: {path}.{key} must be an integer >= {low}"
                               + (f" and < {NO_HIT}" if key == "max_k" else ""))
        ints[key] = value
    seqs = match_sequences(raw, path, source, most=ints["max_k"], what="max_k")
    (workload,) = optional_strings(raw, ("workload",), path, source)
    return LookupRecord(ints["min_n"], ints["max_n"], ints["max_k"], ints["max_new_tokens"], seqs, workload)


# -- re-planning K from the lookup record under another device's costs ------------------------------------------
LOOKUP_MAX_K = 16  # the largest K a lookup record can re-plan
LOOKUP_K_VALUES = (1, 2, 3, 4, 6, 8, 10, 12, 16)  # the K re-planning tries (NgramStrategy's grid and more)


def record_lookup(cal, *, min_n: int, max_n: int, max_k: int = LOOKUP_MAX_K,
                  workload: str | None = None) -> LookupRecord:
    """The lookup record of prompt lookup with suffixes ``min_n .. max_n`` over the calibration's (a
    ``surrogate.Calibration``) greedy continuations (no model runs: the lookup reads tokens)."""
    out = []
    for prompt, cont in zip(cal.prompts, cal.continuations, strict=True):
        index, seq, data = NgramIndex(min_n, max_n), [*prompt, *cont[:1]], bytearray()
        for t in range(1, len(cont)):
            tokens = index.lookup(seq, max_k)
            data.append(min(leading_matches(tokens, cont, t), max_k) if tokens else NO_HIT)
            seq.append(cont[t])
        out.append(base64.b64encode(bytes(data)).decode("ascii"))
    return LookupRecord(min_n, max_n, max_k, cal.max_new_tokens, tuple(out), workload)


def recorded_lookup(seq: Sequence[int], k: int, n: int):
    """The lookup of one recorded sequence (positions t = 1 .. n - 1) at K = ``k``, as decoding reads it:
    ``(seq, t, limit) -> (drafted, accepted)`` on a hit, None on a miss."""
    def lookup(_seq, t, limit):
        b = seq[t - 1]
        if b == NO_HIT:
            return None
        drafted = min(k, limit)
        return drafted, min(b, drafted, n - t)
    return lookup


def replay_lookup(rec: LookupRecord, k: int, costs) -> Any:
    """What prompt lookup with K = ``k`` achieves under ``costs`` (a surrogate.CostModel), replayed cycle by cycle
    from the record by the engine's rules (``replay_cycles``): exact in acceptance; each cycle pays v(drafted + 1)."""
    if not 1 <= k <= rec.max_k:
        raise ConfigError(f"K {k} is outside what the lookup record covers (1..{rec.max_k})")
    cycles = []
    for seq in rec.positions():
        n = len(seq) + 1
        lookup = recorded_lookup(seq, k, n)

        def propose(seq_, t, limit, lookup=lookup):
            drafted, accepted = lookup(seq_, t, limit) or (0, 0)
            return METHOD.name, drafted, accepted
        cycles += replay_cycles((), range(n), max_new_tokens=rec.max_new_tokens, propose=propose)
    return cycle_measurement(cycles, verify=costs.verify)


def replan_lookup(rec: LookupRecord, costs, *, k_values: Sequence[int] = LOOKUP_K_VALUES,
                  also: Sequence[int] = ()) -> Replanned:
    """The K the replay predicts fastest under ``costs`` (ties: the smaller K); plain decoding when none pays."""
    ks = sorted({k for k in (*k_values, *also) if 1 <= k <= rec.max_k})
    scored = sorted(((replay_lookup(rec, k, costs), k) for k in ks), key=lambda mk: (-mk[0].speedup, mk[1]))
    options = tuple((DraftConfig(max_draft_tokens=k, exit=NO_EXIT), m) for m, k in scored)
    draft, m = options[0] if options else (None, None)
    ships = draft if m is not None and m.speedup > 1.0 else AUTOREGRESSIVE
    return Replanned(ships, m, draft, options)


def kept_lookup(job: Replanning) -> LookupRecord:
    """The profile's lookup record, checked against its n range; one line when it keeps none or another's."""
    extra, params = job.extra, dict(job.profile.method_params)
    if LOOKUP_KEY not in extra:
        raise ProfileError(f"{job.source}: keeps no lookup record (measured.{LOOKUP_KEY}): it was written before "
                           f"lookup profiles kept one; run optimize again")
    rec = lookup_from_dict(extra[LOOKUP_KEY], source=job.source)
    if (rec.min_n, rec.max_n) != (params.get("min_n", rec.min_n), params.get("max_n", rec.max_n)):
        raise ProfileError(f"{job.source}: measured.{LOOKUP_KEY} was recorded for n {rec.min_n}..{rec.max_n}, "
                           f"not the profile's {params.get('min_n')}..{params.get('max_n')}; run optimize again")
    return rec


def keep_lookup(k: Keeping) -> Kept:
    """The lookup record of the profile's n range over the calibration: tokens only, no model runs."""
    params = k.candidate.plain_params()
    rec = record_lookup(k.objective.cal, min_n=params.get("min_n", 1), max_n=params.get("max_n", 3),
                        workload=k.workload)
    return Kept(((LOOKUP_KEY, lookup_to_dict(rec)),))


def replan(job: Replanning) -> Replanned:
    """K re-chosen for the cost file's v(k) by replaying the lookup record (the profile's own K is weighed too)."""
    rec = kept_lookup(job)
    job.check_costs(None)  # a lookup pays v(k) alone: the depth and the fingerprint are checked, not the layout
    searched = job.profile.draft.max_draft_tokens
    plan = replan_lookup(rec, job.target.cost_model(), also=(searched,) if searched else ())
    ks = ", ".join(str(c.max_draft_tokens) for c, _ in plan.options)
    return replace(plan, draft=replace(job.profile.draft, max_draft_tokens=plan.draft.max_draft_tokens),
                   basis=f"its lookup record, K of {ks}")


# -- as serving engines' settings -------------------------------------------------------------------------------
def lookup_of(candidate: Candidate) -> Lookup:
    """The prompt lookup of a candidate that looks up n-grams (``min_n``, ``max_n`` in its params; K its draft's)."""
    params = candidate.plain_params()
    return Lookup(int(params.get("min_n", NgramParams.min_n)), int(params.get("max_n", NgramParams.max_n)),
                  candidate.draft.max_draft_tokens)


def _lookup_candidate(setting: Setting) -> Candidate | None:
    """The ngram candidate of a lookup alone."""
    lk = setting.lookup
    if lk is None or setting.draft_model is not None or setting.fallback is not None:
        return None
    return Candidate(NgramParams.method, DraftConfig(max_draft_tokens=lk.k, exit=NO_EXIT),
                     NgramParams(lk.min_n, lk.max_n).to_pairs())


SPECULATION = Speculation(setting=lambda candidate: Setting(lookup=lookup_of(candidate)), candidate=_lookup_candidate)


def _drafter(candidate: Candidate, sm) -> NgramDrafter:
    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    return NgramDrafter(params, candidate.draft.max_draft_tokens)


def _batch_drafter(candidate: Candidate, sm) -> NgramBatchDrafter:
    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    return NgramBatchDrafter(params, candidate.draft.max_draft_tokens)


def _example(num_layers: int) -> Candidate:
    return Candidate(NgramParams.method, DraftConfig(max_draft_tokens=3, exit=NO_EXIT),
                     NgramParams(min_n=1, max_n=2).to_pairs())


METHOD = Method(
    name=NgramParams.method,
    summary="prompt lookup: the continuation of the latest earlier match of the last n tokens (no model runs)",
    params=NgramParams,
    drafter=_drafter,
    example=_example,
    strategy="ngram",
    predict=_predict,
    record=Record(formats=((LOOKUP_KEY, lookup_from_dict),), build=keep_lookup),
    replan=replan,
    speculation=SPECULATION,
    batch_drafter=_batch_drafter,
)
