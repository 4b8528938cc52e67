"""``hybrid``: prompt lookup first; in a cycle where it finds no match, another draft source drafts.

Prompt lookup costs almost nothing but drafts only where the text repeats; a layer-skip (or fractal)
draft costs most of a step but drafts everywhere. The hybrid runs the lookup of ``method: ngram``
every cycle and calls the fallback only on a miss, so each cycle's draft comes from exactly one
source. Which one depends on the tokens so far alone, so each cycle is an ordinary speculative step
with that source's q (one-hot for a lookup, the fallback's own q otherwise): greedy output is the full
model's, and sampling stays exact.

``method_params``:
- ``min_n``, ``max_n``: the lookup's suffix lengths, as for ``ngram``;
- ``fallback``: a registered method that drafts alone (``Method.drafts_alone``: ``layer-skip``, ``fractal``,
  ``precision``) or ``none`` (lookup alone: what a search ships when no fallback pays);
- ``fallback_k``: the most tokens the fallback drafts in a cycle (default: K, the draft's
  ``max_draft_tokens``, which bounds the lookup's drafts and every draft);
- the fallback's own ``method_params`` beside them (layer-skip: a trimmed head's ``vocab_subset``,
  ``vocab_ids``, ``vocab_sha256``; fractal: ``n``, ``w``, ...), validated by that method.
A traced fallback's skip sets and exit rule are the profile's ``draft`` (layer-skip, precision: ``Method.traces``).

The drafter's report says what each source contributed: ``lookups``, ``lookup_hits``, ``ngram_drafted``,
``ngram_accepted``, ``ngram_seconds`` and ``fallback_cycles``, ``fallback_drafted``,
``fallback_accepted``, ``fallback_seconds``. The surrogate replays the lookup exactly and, on a miss, a traced
fallback over the same traces its own surrogate reads (``Method.traces``; any other fallback, e.g. fractal, can
only be timed). The ``hybrid`` strategy searches it.

Its record: the lookup record (as ``ngram``'s) and, for a traced fallback, that draft's own record of its traces
lined up with the lookup's sequences; re-planning replays both, cycle by cycle, under another device's costs.
Nothing here names a fallback: it asks the registry which methods draft alone and what they trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig
from skipsearch.engine.draft import BatchDrafter, Drafter
from skipsearch.files.errors import ProfileError
from skipsearch.methods import ngram
from skipsearch.methods.base import (
    REGISTRY,
    Keeping,
    Kept,
    Method,
    ParamsError,
    Record,
    Replanned,
    Replanning,
    Setting,
    Speculation,
    Traced,
    Tracing,
    batch_drafter,
    candidate_for,
    get,
    int_param,
    setting_of,
)
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.ngram import (
    LOOKUP_KEY,
    LookupRecord,
    NgramBatchDrafter,
    NgramDrafter,
    NgramIndex,
    NgramParams,
    check_n_range,
    cycle_measurement,
    leading_matches,
    lookup_from_dict,
    replay_cycles,
)
from skipsearch.methods.ngram import METHOD as NGRAM

NONE = "none"  # no fallback: the lookup alone
_OWN = ("min_n", "max_n", "fallback", "fallback_k")


def fallbacks() -> tuple[str, ...]:
    """What ``method_params.fallback`` may name: every registered method that drafts alone
    (``Method.drafts_alone``), in registry order, then none."""
    return (*(m.name for m in REGISTRY.values() if m.drafts_alone), NONE)


def _tracing(fallback: Any) -> Tracing | None:
    """The fallback's trace hooks (``Method.traces``): its skip sets are the profile's draft.skip_*, and the
    surrogate, the record and re-planning replay it. None: none, or a fallback that can only be timed."""
    method = REGISTRY.get(fallback) if isinstance(fallback, str) else None
    return method.traces if method is not None else None


@dataclass(frozen=True)
class HybridParams:
    method: ClassVar[str] = "hybrid"
    min_n: int = 1  # shortest suffix looked up
    max_n: int = 3  # longest suffix looked up (tried first)
    fallback: str = LAYER_SKIP.name  # the source of a cycle whose lookup finds nothing; "none": no draft then
    fallback_k: int | None = None  # the most tokens the fallback drafts a cycle; None: the draft's K
    fallback_params: tuple[tuple[str, Any], ...] = ()  # the fallback method's own method_params

    def __post_init__(self) -> None:
        check_n_range(self.method, self.min_n, self.max_n)
        allowed = fallbacks()
        if self.fallback not in allowed:
            shown = self.fallback if isinstance(self.fallback, str) else type(self.fallback).__name__
            raise ParamsError(f"hybrid: method_params.fallback must be one of {', '.join(allowed)}, got "
                              f"{shown[:40]!r}")
        if self.fallback_k is not None:
            int_param(self.method, {"fallback_k": self.fallback_k}, "fallback_k", low=1)
        if self.fallback == NONE and (self.fallback_k is not None or self.fallback_params):
            raise ParamsError("hybrid: with fallback none, method_params takes no fallback_k and no fallback keys")
        object.__setattr__(self, "fallback_params", tuple(sorted(dict(self.fallback_params).items())))

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> HybridParams:
        fallback = raw.get("fallback", cls.fallback)
        theirs = (tuple(f.name for f in fields(get(fallback).params)) if fallback != NONE and fallback in fallbacks()
                  else ())
        for key in raw:
            if key not in _OWN and key not in theirs:
                shown = key[:40] if isinstance(key, str) else type(key).__name__
                raise ParamsError(f"hybrid: unknown key method_params.{shown} (known with fallback "
                                  f"{fallback if isinstance(fallback, str) else '?'}: {', '.join((*_OWN, *theirs))})")
        params = cls(min_n=raw.get("min_n", cls.min_n), max_n=raw.get("max_n", cls.max_n), fallback=fallback,
                     fallback_k=raw.get("fallback_k"), fallback_params=tuple((k, raw[k]) for k in theirs if k in raw))
        if _tracing(params.fallback) is None and (draft.skip_attn or draft.skip_mlp):
            raise ParamsError(f"hybrid: draft.skip_attn and draft.skip_mlp must be empty with fallback "
                              f"{params.fallback} (they are the layer-skip fallback's)")
        k = draft.max_draft_tokens
        if k and params.fallback_k is not None and params.fallback_k > k:
            raise ParamsError(f"hybrid: method_params.fallback_k ({params.fallback_k}) must be <= the draft's "
                              f"max_draft_tokens ({k})")
        fb = params.fallback_candidate(draft)
        if fb is not None:
            try:
                get(fb.method).parse(fb.params, draft=fb.draft, num_layers=num_layers)
            except ConfigError as e:
                raise ParamsError(f"hybrid: fallback {e}") from None
        return params

    def fallback_candidate(self, draft: DraftConfig) -> Candidate | None:
        """The fallback as a candidate of its own method: the draft config with K = fallback_k."""
        if self.fallback == NONE:
            return None
        return Candidate(self.fallback, replace(draft, max_draft_tokens=self.fallback_k or draft.max_draft_tokens),
                         self.fallback_params)

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        own = [("min_n", self.min_n), ("max_n", self.max_n), ("fallback", self.fallback)]
        if self.fallback_k is not None:
            own.append(("fallback_k", self.fallback_k))
        return (*own, *self.fallback_params)


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
    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
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


class LookupThenFallback:
    """One calibration sequence's ``propose`` for ``ngram.replay_cycles``, by HybridDrafter's rule: the lookup
    first; on a miss, the traced fallback (``source``, its draft config ``fallback``) walked over its
    teacher-forced trace with its exit rule and adaptive γ (the decoder's own update). The surrogate
    (``_predict``) and re-planning (``replay_recorded``, from a profile's records) share it.

    ``lookup(seq, t, limit)`` is (drafted, accepted) on a hit, None on a miss; ``trace`` and ``fallback`` None:
    no fallback (a miss drafts nothing); ``length``: the continuation's. ``fallback_drafted`` adds up the
    fallback's draft tokens, which the caller charges c each."""

    def __init__(self, lookup, source: str | None, fallback: DraftConfig | None, trace, length: int) -> None:
        from skipsearch.engine.decoding import LayerSkipDrafter

        self.lookup, self.source, self.trace, self.length = lookup, source, trace, length
        on = fallback is not None and trace is not None
        self.gamma = LayerSkipDrafter(fallback) if on else None  # its γ update is the decoder's own
        self.max_k = fallback.max_draft_tokens if on else 0
        self.fallback_drafted = 0

    def __call__(self, seq, t: int, limit: int) -> tuple[str, int, int]:
        found = self.lookup(seq, t, limit)
        if found is not None or self.gamma is None:
            drafted, accepted = found or (0, 0)
            return NGRAM.name, drafted, accepted
        from skipsearch.engine.surrogate import draft_block

        # entry i of the trace is the draft's guess at cont[i]; past the continuation's end it is unknown
        drafted, accepted = draft_block(self.trace, t, min(limit, self.max_k, self.length - t), self.gamma.gamma)
        self.gamma.observe(drafted, accepted)
        self.fallback_drafted += drafted
        return self.source, drafted, accepted


def _predict(objective, candidate: Candidate):
    """The lookup replayed exactly (as ``ngram``'s surrogate); a miss replays the fallback over the traces its own
    method measures (``Method.traces``: a layer-skip draft through its trimmed head, if any; a precision draft)
    with its exit rule and adaptive γ, charged c per draft token."""
    from skipsearch.engine import timing

    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=objective.sm.num_layers)
    fb = params.fallback_candidate(candidate.draft)
    tracing = _tracing(fb.method) if fb is not None else None
    if fb is not None and tracing is None:
        raise ConfigError(f"hybrid: a {fb.method} fallback has no surrogate: time it (--objective timed)")
    t_start = timing.now()
    k, cal, costs = candidate.draft.max_draft_tokens, objective.cal, objective.costs
    traced = tracing.measure(objective, fb) if tracing is not None else Traced((None,) * len(cal.prompts), 0.0)
    lookup_seconds = 0.0
    fallback_drafted = 0
    cycles = []
    for prompt, cont, tr in zip(cal.prompts, cal.continuations, traced.traces, strict=True):
        index = NgramIndex(params.min_n, params.max_n)

        def lookup(seq, t, limit, index=index, cont=cont):
            nonlocal lookup_seconds
            t0 = timing.now()
            tokens = index.lookup(seq, min(limit, k))
            lookup_seconds += timing.now() - t0
            return (len(tokens), leading_matches(tokens, cont, t)) if tokens else None

        propose = LookupThenFallback(lookup, fb.method if fb is not None else None,
                                     fb.draft if fb is not None else None, tr, len(cont))
        cycles += replay_cycles(prompt, cont, max_new_tokens=cal.max_new_tokens, propose=propose)
        fallback_drafted += propose.fallback_drafted
    fallback_steps = fallback_drafted * traced.c
    matches = [m for tr in traced.traces if tr is not None for m in tr.matches]
    lookup_steps = lookup_seconds / costs.step_seconds
    fields = {"alpha": sum(matches) / len(matches), "cost_ratio": traced.c} if fb is not None and matches else {}
    return cycle_measurement(cycles, verify=costs.verify, draft_steps=fallback_steps, extra_steps=lookup_steps,
                             seconds=timing.now() - t_start, **fields)


# -- the record, and re-planning K from it under another device's costs ---------------------------------------
def _fallback(candidate: Candidate, num_layers: int) -> Candidate | None:
    """The hybrid's fallback as a candidate of its own method, where its params name one (a profile's always do);
    None for none, and for params that do not parse (the profile's own checks say why)."""
    if candidate.plain_params().get("fallback", NONE) == NONE:
        return None
    try:
        params = HybridParams.parse(candidate.plain_params(), draft=candidate.draft, num_layers=num_layers)
    except ConfigError:
        return None
    return params.fallback_candidate(candidate.draft)


def keep(k: Keeping) -> Kept:
    """The lookup record (tokens only) and a traced fallback's own record of its traces, one per lookup sequence
    ("" where a continuation is empty; ``Tracing.keep``: a layer-skip fallback's as an acceptance record, a
    precision one's as its record and its scheme's costs). A fallback no record prices (fractal, a trimmed
    layer-skip head) keeps nothing."""
    fb = _fallback(k.candidate, k.objective.sm.num_layers)
    tracing = _tracing(fb.method) if fb is not None else None
    theirs = tracing.keep(k, fb) if tracing is not None else None
    if k.candidate.plain_params().get("fallback", NONE) != NONE and theirs is None:
        return Kept()
    theirs = theirs or Kept()
    return Kept((*ngram.keep_lookup(k).entries, *theirs.entries), theirs.schemes)


# the fallback's record is read by its own method's formats (the registry reads every key any method keeps)
RECORD = Record(formats=((LOOKUP_KEY, lookup_from_dict),), build=keep)


def replay_recorded(rec: LookupRecord, k: int, costs, *, fallback: DraftConfig | None = None,
                    traces=(), c: float = 0.0, source: str = "fallback"):
    """Prompt lookup with K = ``k`` replayed cycle by cycle from the record by the engine's rules
    (ngram.replay_cycles), and, on a miss, the ``fallback`` draft (e.g. a precision draft) walked over ``traces``
    (one per recorded sequence) by LookupThenFallback, charged ``c`` per draft token: exact in acceptance; each
    cycle pays v(drafted + 1)."""
    if not 1 <= k <= rec.max_k:
        raise ConfigError(f"K {k} is outside what the lookup record covers (1..{rec.max_k})")
    seqs = rec.positions()
    rows = zip(seqs, traces, strict=True) if fallback is not None else ((seq, None) for seq in seqs)
    cycles, drafted = [], 0
    for seq, tr in rows:
        n = len(seq) + 1
        propose = LookupThenFallback(ngram.recorded_lookup(seq, k, n), source if fallback is not None else None,
                                     fallback, tr if tr is not None and tr.matches else None, n)
        cycles += replay_cycles((), range(n), max_new_tokens=rec.max_new_tokens, propose=propose)
        drafted += propose.fallback_drafted
    if fallback is None:
        return cycle_measurement(cycles, verify=costs.verify)
    matches = [m for tr in traces for m in tr.matches]
    fields = {"alpha": sum(matches) / len(matches)} if matches else {}
    return cycle_measurement(cycles, verify=costs.verify, draft_steps=drafted * c, cost_ratio=c, **fields)


def replan(job: Replanning) -> Replanned:
    """Without a fallback, prompt lookup's re-plan (``ngram.replan``). With a traced fallback, K re-chosen for the
    cost file by replaying the lookup record and, on a miss, the fallback over its kept traces
    (LookupThenFallback, as the surrogate), the fallback charged the c the cost file gives it (``Tracing.read``: a
    precision draft's from its scheme costs, a layer-skip draft's from the per-sublayer costs). ``fallback_k`` is
    re-chosen with K (1..K, replayed the same way): a draft that got cheaper may pay for longer drafts."""
    profile = job.profile
    params = dict(profile.method_params)
    fallback = params.get("fallback", NONE)
    if fallback == NONE:
        return ngram.replan(job)
    tracing = _tracing(fallback)
    if tracing is None:
        raise ConfigError(f"{job.source}: re-planning a hybrid profile with a {fallback} fallback is not "
                          f"supported (its draft passes have no record); plan it again on the device")
    lookup = ngram.kept_lookup(job)
    cand = HybridParams.parse(params, draft=profile.draft, num_layers=profile.model.num_layers).fallback_candidate(
        profile.draft)
    costs = job.target.cost_model()
    searched = profile.draft.max_draft_tokens
    ks = sorted({k for k in (*ngram.LOOKUP_K_VALUES, searched) if 1 <= k <= lookup.max_k})

    def weighed(variant: Candidate):
        # the fallback as one variant its record keeps (e.g. a precision draft in one scheme): each K, best first
        theirs = tracing.read(job, variant)
        traces = theirs.traces
        if len(traces) != len(lookup.sequences) or any(
                tr.matches and len(tr.matches) != len(seq) + 1
                for tr, seq in zip(traces, lookup.positions(), strict=True)):
            raise ProfileError(f"{job.source}: measured.{theirs.key} and measured.{LOOKUP_KEY} were not recorded "
                               f"over the same calibration sequences; run optimize again")

        def predicted(k: int, fk: int):
            fallback = replace(variant.draft, max_draft_tokens=fk)
            return replay_recorded(lookup, k, costs, fallback=fallback, traces=traces, c=theirs.c,
                                   source=variant.method)

        # the fallback's own K re-chosen with the lookup's (its record replays any fk <= k); the first of equals is
        # the longest, so an unchanged profile keeps fallback_k = K where shorter drafts gain nothing
        best = {k: max(((predicted(k, fk), fk) for fk in range(k, 0, -1)), key=lambda mf: mf[0].speedup) for k in ks}
        scored = sorted(ks, key=lambda k: (-best[k][0].speedup, k))
        options = tuple((replace(profile.draft, max_draft_tokens=k), best[k][0]) for k in scored)
        return variant, theirs, options, {k: fk for k, (_, fk) in best.items()}

    # the fallback in each variant the cost file prices (its own first); the best predicted ships, the first of equals
    weighings = [weighed(v) for v in tracing.variants(job, cand)]
    chosen, theirs, options, fallback_ks = max(weighings, key=lambda w: w[2][0][1].speedup if w[2] else 0.0)
    draft, m = options[0] if options else (None, None)
    k = draft.max_draft_tokens if draft is not None and m.speedup > 1.0 else 0
    new_params = dict(profile.method_params)
    new_params.update((n, v) for n, v in chosen.params if n in new_params)  # e.g. another scheme than searched
    if k and (fallback_ks[k] != k or "fallback_k" in new_params):
        new_params["fallback_k"] = fallback_ks[k]  # re-chosen with K (fallback_k absent means K)
    changed = tuple((n, new_params[n]) for n, _ in profile.method_params)
    changed += tuple((n, v) for n, v in new_params.items() if n not in dict(profile.method_params))
    shown = ", ".join(f"{c.max_draft_tokens} (fallback {fallback_ks[c.max_draft_tokens]})" for c, _ in options)
    label = f" ({theirs.label})" if theirs.label else ""
    if len(weighings) > 1:
        label = (f" in {theirs.label or 'its best variant'}, the best predicted of the variants its record keeps "
                 f"that the cost file prices ("
                 + ", ".join(f"{t.label or v.method} {o[0][1].speedup:.3f}x" for v, t, o, _ in weighings if o) + ")")
    return Replanned(replace(profile.draft, max_draft_tokens=k), m, draft, options, theirs.note,
                     basis=f"its lookup record and its {cand.method} fallback's traces{label}, K of {shown}",
                     method_params=changed if changed != tuple(profile.method_params) else None)


def _replan_schemes(candidate: Candidate, device: str) -> tuple[str, ...]:
    # a traced fallback's schemes, as its own method names them (a fractal fallback's passes keep no record)
    fallback = candidate.plain_params().get("fallback")
    method = REGISTRY.get(fallback) if isinstance(fallback, str) else None
    if method is None or method.traces is None or method.replan_schemes is None:
        return ()
    own = tuple((k, v) for k, v in candidate.params if k not in _OWN)
    return method.replan_schemes(Candidate(fallback, candidate.draft, own), device)


# -- as serving engines' settings -------------------------------------------------------------------------------
def _setting(candidate: Candidate) -> Setting:
    """The lookup, and on its miss the fallback's draft model where the fallback is one (a precision draft);
    ``fallback`` names any fallback."""
    params = candidate.plain_params()
    fallback = params.get("fallback", HybridParams.fallback)
    lookup = ngram.lookup_of(candidate)
    if fallback == NONE:
        return Setting(lookup=lookup)
    k = params.get("fallback_k") or candidate.draft.max_draft_tokens
    theirs = Candidate(fallback, replace(candidate.draft, max_draft_tokens=k),
                       tuple((key, v) for key, v in params.items() if key not in _OWN))
    return Setting(lookup=lookup, draft_model=setting_of(theirs).draft_model, fallback=fallback)


def _candidate(setting: Setting) -> Candidate | None:
    """The hybrid candidate of a lookup with a draft model on its miss (the draft model's candidate as fallback)."""
    lk, dm = setting.lookup, setting.draft_model
    if lk is None or dm is None:
        return None
    fb = candidate_for(Setting(draft_model=dm))
    params = HybridParams(min_n=lk.min_n, max_n=lk.max_n, fallback=fb.method, fallback_k=dm.k,
                          fallback_params=fb.params)
    return Candidate(HybridParams.method, replace(fb.draft, max_draft_tokens=lk.k), params.to_pairs())


def _example(num_layers: int) -> Candidate:
    draft = DraftConfig(skip_attn=(num_layers // 2,), max_draft_tokens=3, exit=NO_EXIT)
    return Candidate(HybridParams.method, draft, HybridParams(min_n=1, max_n=2, fallback_k=2).to_pairs())


METHOD = Method(
    name=HybridParams.method,
    summary="prompt lookup first; on a miss, a layer-skip (optionally trimmed-head) or fractal draft",
    params=HybridParams,
    drafter=_drafter,
    example=_example,
    strategy=HybridParams.method,
    predict=_predict,
    record=RECORD,
    replan=replan,
    replan_schemes=_replan_schemes,
    speculation=Speculation(setting=_setting, candidate=_candidate),
    batch_drafter=lambda candidate, sm: _drafter(candidate, sm, batch=True),
)
