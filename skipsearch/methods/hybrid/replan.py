"""The hybrid's surrogate, record and re-plan: the lookup replayed exactly and, on a miss, a traced fallback over
its own traces, cycle by cycle, under a cost model."""

from __future__ import annotations

from dataclasses import replace

from skipsearch.config import Candidate, ConfigError, DraftConfig
from skipsearch.files.errors import ProfileError
from skipsearch.methods import ngram
from skipsearch.methods.base import (
    REGISTRY,
    Keeping,
    Kept,
    Record,
    Replanned,
    Replanning,
    Traced,
)
from skipsearch.methods.hybrid.params import _OWN, NONE, HybridParams, _tracing, parse
from skipsearch.methods.ngram import (
    LOOKUP_KEY,
    LookupRecord,
    NgramIndex,
    cycle_measurement,
    leading_matches,
    lookup_from_dict,
    replay_cycles,
)
from skipsearch.methods.ngram import METHOD as NGRAM


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

    params = parse(candidate.params, draft=candidate.draft, num_layers=objective.sm.num_layers)
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


def recorded_cycles(rec: LookupRecord, k: int, *, fallback: DraftConfig | None = None, traces=(),
                    source: str = "fallback") -> tuple[list[tuple[str, int, int, int]], int]:
    """Every recorded sequence's cycles (ngram.replay_cycles: source, drafted, accepted, emitted) with prompt lookup
    at K = ``k`` and, on a miss, the ``fallback`` draft walked over ``traces`` (one per recorded sequence) by
    LookupThenFallback; and how many tokens the fallback drafted."""
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
    return cycles, drafted


def replay_recorded(rec: LookupRecord, k: int, costs, *, fallback: DraftConfig | None = None,
                    traces=(), c: float = 0.0, source: str = "fallback"):
    """Prompt lookup with K = ``k`` replayed cycle by cycle from the record by the engine's rules
    (``recorded_cycles``), and, on a miss, the ``fallback`` draft (e.g. a precision draft) walked over ``traces``,
    charged ``c`` per draft token: exact in acceptance; each cycle pays v(drafted + 1)."""
    cycles, drafted = recorded_cycles(rec, k, fallback=fallback, traces=traces, source=source)
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
