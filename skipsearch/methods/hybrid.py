"""``hybrid``: prompt lookup first; in a cycle where it finds no match, another draft source drafts.

Prompt lookup costs almost nothing but drafts only where the text repeats; a layer-skip (or fractal)
draft costs most of a step but drafts everywhere. The hybrid runs the lookup of ``method: ngram``
every cycle and calls the fallback only on a miss, so each cycle's draft comes from exactly one
source. Which one depends on the tokens so far alone, so each cycle is an ordinary speculative step
with that source's q (one-hot for a lookup, the fallback's own q otherwise): greedy output is the full
model's, and sampling stays exact.

``method_params``:
- ``min_n``, ``max_n``: the lookup's suffix lengths, as for ``ngram``;
- ``fallback``: ``layer-skip``, ``fractal``, ``precision`` or ``none`` (lookup alone: what a search ships
  when no fallback pays);
- ``fallback_k``: the most tokens the fallback drafts in a cycle (default: K, the draft's
  ``max_draft_tokens``, which bounds the lookup's drafts and every draft);
- the fallback's own ``method_params`` beside them (layer-skip: a trimmed head's ``vocab_subset``,
  ``vocab_ids``, ``vocab_sha256``; fractal: ``n``, ``w``, ...), validated by that method.
The layer-skip or precision fallback's skip sets and exit rule are the profile's ``draft``.

The drafter's report says what each source contributed: ``lookups``, ``lookup_hits``, ``ngram_drafted``,
``ngram_accepted``, ``ngram_seconds`` and ``fallback_cycles``, ``fallback_drafted``,
``fallback_accepted``, ``fallback_seconds``. The surrogate replays the lookup exactly and, on a miss, the
layer-skip or precision fallback over the same traces their own surrogates read (a fractal fallback can only
be timed). The ``hybrid`` strategy searches it.

Its record: the lookup record (as ``ngram``'s) and, for a layer-skip or precision fallback, that draft's traces
lined up with the lookup's sequences; re-planning replays both, cycle by cycle, under another device's costs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig
from skipsearch.draft import Drafter
from skipsearch.files.errors import ProfileError
from skipsearch.files.records import (
    ACCEPTANCE_KEY,
    LOOKUP_KEY,
    PRECISION_KEY,
    LookupRecord,
    acceptance_from_dict,
    acceptance_to_dict,
    lookup_from_dict,
    precision_from_dict,
    record_acceptance,
)
from skipsearch.methods import ngram
from skipsearch.methods.base import Keeping, Kept, Method, ParamsError, Record, Replanned, Replanning, get, int_param
from skipsearch.methods.fractal import METHOD as FRACTAL
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.ngram import METHOD as NGRAM
from skipsearch.methods.ngram import (
    NgramDrafter,
    NgramIndex,
    NgramParams,
    check_n_range,
    cycle_measurement,
    leading_matches,
    replay_cycles,
)
from skipsearch.methods.precision import METHOD as PRECISION
from skipsearch.methods.precision.replan import keep_draft, kept_precision, precision_ratio

NONE = "none"  # no fallback: the lookup alone
FALLBACKS = (LAYER_SKIP.name, FRACTAL.name, PRECISION.name, NONE)
_SKIPPING = (LAYER_SKIP.name, PRECISION.name)  # fallbacks whose skip sets are the profile's draft.skip_*
_OWN = ("min_n", "max_n", "fallback", "fallback_k")


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
        if self.fallback not in FALLBACKS:
            shown = self.fallback if isinstance(self.fallback, str) else type(self.fallback).__name__
            raise ParamsError(f"hybrid: method_params.fallback must be one of {', '.join(FALLBACKS)}, got "
                              f"{shown[:40]!r}")
        if self.fallback_k is not None:
            int_param(self.method, {"fallback_k": self.fallback_k}, "fallback_k", low=1)
        if self.fallback == NONE and (self.fallback_k is not None or self.fallback_params):
            raise ParamsError("hybrid: with fallback none, method_params takes no fallback_k and no fallback keys")
        object.__setattr__(self, "fallback_params", tuple(sorted(dict(self.fallback_params).items())))

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> HybridParams:
        fallback = raw.get("fallback", cls.fallback)
        theirs = () if fallback not in FALLBACKS[:3] else tuple(f.name for f in fields(get(fallback).params))
        for key in raw:
            if key not in _OWN and key not in theirs:
                shown = key[:40] if isinstance(key, str) else type(key).__name__
                raise ParamsError(f"hybrid: unknown key method_params.{shown} (known with fallback "
                                  f"{fallback if isinstance(fallback, str) else '?'}: {', '.join((*_OWN, *theirs))})")
        params = cls(min_n=raw.get("min_n", cls.min_n), max_n=raw.get("max_n", cls.max_n), fallback=fallback,
                     fallback_k=raw.get("fallback_k"), fallback_params=tuple((k, raw[k]) for k in theirs if k in raw))
        if params.fallback not in _SKIPPING and (draft.skip_attn or draft.skip_mlp):
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
        from skipsearch import timing

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


def _drafter(candidate: Candidate, sm) -> HybridDrafter:
    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    fb = params.fallback_candidate(candidate.draft)
    fallback = None
    if fb is not None:
        try:
            fallback = get(fb.method).drafter(fb, sm)
        except ParamsError as e:
            raise ParamsError(f"hybrid: fallback {e}") from None
    return HybridDrafter(params, candidate.draft.max_draft_tokens, fallback,
                         fb.draft.max_draft_tokens if fb is not None else 0)


class LookupThenFallback:
    """One calibration sequence's ``propose`` for ``ngram.replay_cycles``, by HybridDrafter's rule: the lookup
    first; on a miss, the layer-skip or precision fallback (``source``, its draft config ``fallback``) walked over
    its teacher-forced trace with its exit rule and adaptive γ (the decoder's own update). The surrogate
    (``_predict``) and re-planning (``replay_recorded``, from a profile's records) share it.

    ``lookup(seq, t, limit)`` is (drafted, accepted) on a hit, None on a miss; ``trace`` and ``fallback`` None:
    no fallback (a miss drafts nothing); ``length``: the continuation's. ``fallback_drafted`` adds up the
    fallback's draft tokens, which the caller charges c each."""

    def __init__(self, lookup, source: str | None, fallback: DraftConfig | None, trace, length: int) -> None:
        from skipsearch.decoding import LayerSkipDrafter

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
        from skipsearch.surrogate import draft_block

        # entry i of the trace is the draft's guess at cont[i]; past the continuation's end it is unknown
        drafted, accepted = draft_block(self.trace, t, min(limit, self.max_k, self.length - t), self.gamma.gamma)
        self.gamma.observe(drafted, accepted)
        self.fallback_drafted += drafted
        return self.source, drafted, accepted


def _predict(objective, candidate: Candidate):
    """The lookup replayed exactly (as ``ngram``'s surrogate); a miss replays the layer-skip fallback over its
    traces (through its trimmed head, if any) with its exit rule and adaptive γ, charged c per draft token."""
    from skipsearch import timing
    from skipsearch.methods.layer_skip.surrogate import draft_costs, draft_traces

    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=objective.sm.num_layers)
    fb = params.fallback_candidate(candidate.draft)
    if fb is not None and fb.method not in _SKIPPING:
        raise ConfigError(f"hybrid: a {fb.method} fallback has no surrogate: time it (--objective timed)")
    t_start = timing.now()
    k, cal = candidate.draft.max_draft_tokens, objective.cal
    costs = objective.costs
    traces: list = [None] * len(cal.prompts)
    c = 0.0
    if fb is not None and fb.method == PRECISION.name:
        from skipsearch.methods.precision import traces_and_ratio

        traces, c = traces_and_ratio(objective, fb)
    elif fb is not None:
        fb_params = LAYER_SKIP.parse(fb.params, draft=fb.draft, num_layers=objective.sm.num_layers)
        costs = draft_costs(objective, fb_params)
        traces = draft_traces(objective, fb.draft, fb_params)
        c = costs.draft_ratio(fb.draft)
    lookup_seconds = 0.0
    fallback_drafted = 0
    cycles = []
    for prompt, cont, tr in zip(cal.prompts, cal.continuations, traces, strict=True):
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
    fallback_steps = fallback_drafted * c
    matches = [m for tr in traces if tr is not None for m in tr.matches]
    lookup_steps = lookup_seconds / costs.step_seconds
    fields = {"alpha": sum(matches) / len(matches), "cost_ratio": c} if fb is not None and matches else {}
    return cycle_measurement(cycles, verify=costs.verify, draft_steps=fallback_steps, extra_steps=lookup_steps,
                             seconds=timing.now() - t_start, **fields)


# -- the record, and re-planning K from it under another device's costs ---------------------------------------
def _fallback(candidate: Candidate, method: str, num_layers: int) -> Candidate | None:
    """The hybrid's fallback as a candidate of its own method, when that method is ``method``; else None (also for
    params that do not parse: the profile's own checks say why)."""
    params = candidate.plain_params()
    if params.get("fallback") != method:
        return None
    try:
        return HybridParams.parse(params, draft=candidate.draft, num_layers=num_layers).fallback_candidate(
            candidate.draft)
    except ConfigError:
        return None


def precision_fallback(candidate: Candidate, num_layers: int) -> Candidate | None:
    """A hybrid's precision fallback as a precision candidate; None otherwise."""
    fb = _fallback(candidate, PRECISION.name, num_layers)
    return fb if fb is not None and "scheme" in fb.plain_params() else None


def layer_skip_fallback(candidate: Candidate, num_layers: int) -> Candidate | None:
    """A hybrid's layer-skip fallback (with the full head) as a layer-skip candidate; None otherwise (no hybrid,
    another fallback, or a trimmed head, whose cost a cost file does not price)."""
    fb = _fallback(candidate, LAYER_SKIP.name, num_layers)
    return fb if fb is not None and not fb.plain_params().get("vocab_subset") else None


def keep(k: Keeping) -> Kept:
    """The lookup record (tokens only), and the fallback's traces, one per lookup sequence ("" where a
    continuation is empty): a layer-skip fallback's as an acceptance record, a precision one's as its record (and
    its scheme's costs). A fallback no record prices (fractal, a trimmed layer-skip head) keeps nothing."""
    from skipsearch.surrogate import aligned, trace_skip_sets

    layers = k.objective.sm.num_layers
    precision, skipping = precision_fallback(k.candidate, layers), layer_skip_fallback(k.candidate, layers)
    lookup = (k.candidate.plain_params().get("fallback", NONE) == NONE or precision is not None
              or skipping is not None)
    entries, schemes = list(ngram.keep_lookup(k).entries if lookup else ()), ()
    if skipping is not None:
        key = (skipping.draft.skip_attn, skipping.draft.skip_mlp)
        sm, cal = k.objective.sm, k.objective.cal
        traced = {key: aligned(trace_skip_sets(sm, cal, [DraftConfig(*key)])[key], cal)}
        rec = record_acceptance(traced, workload=k.workload, architecture=k.architecture)
        entries.append((ACCEPTANCE_KEY, acceptance_to_dict(rec)))
    if precision is not None:
        kept = keep_draft(k, precision)
        entries += kept.entries
        schemes = kept.schemes
    return Kept(tuple(entries), schemes)


RECORD = Record(formats=((LOOKUP_KEY, lookup_from_dict), (ACCEPTANCE_KEY, acceptance_from_dict),
                         (PRECISION_KEY, precision_from_dict)), build=keep)


def replay_recorded(rec: LookupRecord, k: int, costs, *, fallback: DraftConfig | None = None,
                    traces=(), c: float = 0.0, source: str = PRECISION.name):
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


def _fallback_parts(job: Replanning) -> tuple[Candidate, tuple, float, str | None, str, str]:
    """The fallback draft, its kept traces, its c under the cost file and a note, its method, and the measured key
    its traces are kept under; one line when the profile keeps none of them."""
    profile, target = job.profile, job.target
    if dict(profile.method_params).get("fallback") == PRECISION.name:
        cand = precision_fallback(profile.candidate, profile.model.num_layers)
        rec, pp = kept_precision(job, cand)
        c, note = precision_ratio(target.costs, profile.model.num_layers, cand.draft, pp, source=job.costs_source,
                                  vocab_size=rec.vocab_size)
        return cand, rec.decoded(), c, note, PRECISION.name, PRECISION_KEY
    cand = layer_skip_fallback(profile.candidate, profile.model.num_layers)
    extra = job.extra
    acc = acceptance_from_dict(extra[ACCEPTANCE_KEY], source=job.source) if ACCEPTANCE_KEY in extra else None
    kept = [t for t in (acc.skip_sets if acc else ()) if cand is not None
            and (t.skip_attn, t.skip_mlp) == (cand.draft.skip_attn, cand.draft.skip_mlp)]
    if cand is None or not kept:
        raise ProfileError(f"{job.source}: keeps no traces of its layer-skip fallback (measured.{ACCEPTANCE_KEY}"
                           f"{'' if cand else '; a trimmed head is not priced by a cost file'}); run optimize again")
    job.check_costs(acc.architecture or job.weights_architecture)
    c = target.cost_model().draft_ratio(cand.draft)
    return cand, kept[0].decoded(), c, None, LAYER_SKIP.name, ACCEPTANCE_KEY


def replan(job: Replanning) -> Replanned:
    """Without a fallback, prompt lookup's re-plan (``ngram.replan``). With a precision or layer-skip fallback, K
    re-chosen for the cost file by replaying the lookup record and, on a miss, the fallback over its kept traces
    (LookupThenFallback, as the surrogate), the fallback charged the c the cost file gives it (a precision draft's
    from its scheme costs, a layer-skip draft's from the per-sublayer costs). A ``fallback_k`` above the new K is
    lowered to it."""
    profile = job.profile
    params = dict(profile.method_params)
    fallback = params.get("fallback", NONE)
    if fallback == NONE:
        return ngram.replan(job)
    if fallback not in (PRECISION.name, LAYER_SKIP.name):
        raise ConfigError(f"{job.source}: re-planning a hybrid profile with a {fallback} fallback is not "
                          f"supported (its draft passes have no record); plan it again on the device")
    lookup = ngram.kept_lookup(job)
    cand, traces, c, note, fb_source, key = _fallback_parts(job)
    if len(traces) != len(lookup.sequences) or any(
            tr.matches and len(tr.matches) != len(seq) + 1 for tr, seq in zip(traces, lookup.positions(), strict=True)):
        raise ProfileError(f"{job.source}: measured.{key} and measured.{LOOKUP_KEY} were not recorded over the "
                           f"same calibration sequences; run optimize again")
    costs, fallback_k = job.target.cost_model(), params.get("fallback_k")
    searched = profile.draft.max_draft_tokens
    ks = sorted({k for k in (*ngram.LOOKUP_K_VALUES, searched) if 1 <= k <= lookup.max_k})

    def predicted(k: int):
        fallback = replace(cand.draft, max_draft_tokens=min(fallback_k or k, k))
        return replay_recorded(lookup, k, costs, fallback=fallback, traces=traces, c=c, source=fb_source)

    scored = sorted(((predicted(k), k) for k in ks), key=lambda mk: (-mk[0].speedup, mk[1]))
    options = tuple((replace(profile.draft, max_draft_tokens=k), m) for m, k in scored)
    draft, m = options[0] if options else (None, None)
    k = draft.max_draft_tokens if draft is not None and m.speedup > 1.0 else 0
    lowered = None
    if k and fallback_k is not None and fallback_k > k:
        lowered = tuple((n, k if n == "fallback_k" else v) for n, v in profile.method_params)
    shown = ", ".join(str(c.max_draft_tokens) for c, _ in options)
    basis = (f"its lookup record and its precision fallback's traces, K of {shown}" if key == PRECISION_KEY else
             f"its lookup record, K of {shown}")
    return Replanned(replace(profile.draft, max_draft_tokens=k), m, draft, options, note, basis=basis,
                     method_params=lowered)


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
)
