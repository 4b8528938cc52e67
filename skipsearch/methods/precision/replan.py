"""Precision's record and re-plan: a precision draft's traces, and its c re-priced from a cost file's scheme costs.

A precision draft's acceptance belongs to the model, its roles (skipped, full and quantized sublayers, the head)
and its scheme's numerics, not to the device's speed: the profile keeps its teacher-forced traces
(``record.PrecisionRecord``) and the scheme's per-sublayer costs on the searching device (in
``measured.costs.schemes``). The record also traces the draft in the other schemes the searching device runs
(``portable_schemes``: int8 and int4 beside a CPU's fp16), so that it travels to a device without the searched
scheme's kernel. Re-planning takes every traced scheme the target cost file prices (``priced_schemes``), prices c
from its scheme costs (``precision_ratio``), replays its traces at each K with the best exit rule, and ships the
best. A hybrid's precision fallback reads the same parts (``variants``, ``read_draft``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from skipsearch.config import Candidate, DraftConfig
from skipsearch.files.costs import Costs
from skipsearch.files.errors import CostsError, ProfileError
from skipsearch.files.records import encode_trace
from skipsearch.methods.base import Keeping, Kept, Record, Replanned, Replanning, Traced
from skipsearch.methods.precision.params import SCHEMES, PrecisionParams
from skipsearch.methods.precision.record import (
    PRECISION_KEY,
    PrecisionRecord,
    SchemeTraces,
    precision_from_dict,
    precision_to_dict,
)


def record_precision(traces, draft: DraftConfig, params: PrecisionParams, *, vocab_size: int | None = None,
                     workload: str | None = None, architecture: str | None = None,
                     others: tuple[tuple[str, Any, str | None], ...] = ()) -> PrecisionRecord:
    """The precision record of a precision draft (``params``: its PrecisionParams) from its traces; ``others``:
    (scheme, traces, device type) of the same draft traced in other schemes, over the same sequences."""
    return PrecisionRecord(params.scheme, draft.skip_attn, draft.skip_mlp, params.full_attn, params.full_mlp,
                           params.quant_head, tuple(encode_trace(t) for t in traces), params.vocab_subset,
                           vocab_size, workload, architecture,
                           tuple(SchemeTraces(s, tuple(encode_trace(t) for t in trs), d) for s, trs, d in others))


def portable_schemes(scheme: str, device: Any) -> tuple[str, ...]:
    """The schemes besides ``scheme`` whose kernels ``device`` has (a CPU: int8 and int4 beside fp16), in
    SCHEMES' order: a draft is traced in each too, so that its record prices it on a device where ``scheme`` has
    no kernel (fbgemm's fp16 on a GPU). Torch is imported here (the kernel check)."""
    from skipsearch.config import ConfigError
    from skipsearch.methods.precision.linears import check_scheme

    out = []
    for name in SCHEMES:
        if name == scheme:
            continue
        try:
            check_scheme(name, device)
        except ConfigError:  # no kernel here (fp8 on a CPU, fp16 on a GPU, torchao missing): not traceable here
            continue
        out.append(name)
    return tuple(out)


def trace_record(objective, cand: Candidate, *, workload: str | None, architecture: str | None,
                 schemes: tuple[str, ...] | None = None) -> PrecisionRecord:
    """The precision draft ``cand``'s record on ``objective``'s model and calibration: its teacher-forced traces in
    its own scheme and in each of ``schemes`` (default: ``portable_schemes`` of this device), lined up with the
    calibration's sequences. One forward per sequence and scheme; nothing is timed."""
    from skipsearch.engine.surrogate import aligned
    from skipsearch.methods.precision.surrogate import draft_traces

    sm, cal = objective.sm, objective.cal
    pp = PrecisionParams.parse(cand.plain_params(), draft=cand.draft, num_layers=sm.num_layers)
    traces = aligned(draft_traces(objective, cand.draft, pp), cal)
    kind = str(sm.device).split(":")[0]
    others = tuple((s, aligned(draft_traces(objective, cand.draft, replace(pp, scheme=s)), cal), kind)
                   for s in (portable_schemes(pp.scheme, sm.device) if schemes is None else schemes))
    vocab = getattr(getattr(getattr(sm, "hf", None), "config", None), "vocab_size", None)
    return record_precision(traces, cand.draft, pp, vocab_size=vocab if isinstance(vocab, int) else None,
                            workload=workload, architecture=architecture, others=others)


def keep_draft(k: Keeping, cand: Candidate) -> Kept:
    """The record of the precision draft ``cand`` (the profile's own, or a hybrid's fallback): its traces in its
    own scheme and the other schemes this device runs (``trace_record``), and, after a search, its own scheme's
    per-sublayer costs on this device (the search measured them; ``plan --profile`` tracing a profile that keeps
    no record times nothing)."""
    from skipsearch.methods.precision.surrogate import scheme_cost

    rec = trace_record(k.objective, cand, workload=k.workload, architecture=k.architecture)
    schemes = (scheme_cost(k.objective, rec.scheme).kept(),) if k.searched is not None else ()
    return Kept(((PRECISION_KEY, precision_to_dict(rec)),), schemes)


def keep(k: Keeping) -> Kept:
    """A precision profile's record. A profile that ships plain decoding (K = 0) keeps its method params, so its
    draft is still there: re-planned elsewhere it may pay."""
    return keep_draft(k, k.candidate) if "scheme" in k.candidate.plain_params() else Kept()


RECORD = Record(formats=((PRECISION_KEY, precision_from_dict),), build=keep)


def missing_scheme(scheme: str, device: str | None, *, source: str) -> CostsError:
    """The one line for a cost file with no costs for ``scheme``: measure them, where the cost file's ``device``
    has the scheme's kernels; else that the draft cannot run there (fp16 drafts run on a CPU only)."""
    spec, kind = SCHEMES.get(scheme), (device or "").split(":")[0]
    if spec is None or kind in spec.devices or not any(kind in s.devices for s in SCHEMES.values()):
        return CostsError(f"{source}: no costs for precision scheme {scheme}: measure them with "
                          f"`skipsearch costs --schemes {scheme}`")
    *some, last = [s.name for s in SCHEMES.values() if kind in s.devices]
    others = f"{', '.join(some)} or {last}" if some else last
    return CostsError(f"{source}: no costs for precision scheme {scheme}: it has no draft kernel on {kind} (it runs "
                      f"on {' or '.join(spec.devices)} only), so this draft cannot run there; search one with {others}")


def precision_ratio(costs: Costs, num_layers: int, draft: DraftConfig, params: Any, *, source: str,
                    vocab_size: int | None = None, device: str | None = None) -> tuple[float, str | None]:
    """c of a precision draft under a cost file's ``costs`` (its scheme's per-sublayer costs beside the full
    model's), and a note for people when it is an approximation:
    c = (step - L·(attn + mlp) - head saving + |quantized attn|·scheme attn + |full attn|·attn
         + |quantized mlp|·scheme mlp + |full mlp|·mlp) / step   (precision.surrogate.draft_ratio).
    A trimmed head (``vocab_subset`` V' of V tokens) is priced at V'/V of the head it trims (the scheme's, or the
    full one: ``lm_head_seconds``), all else equal; with no lm_head_seconds or no V it is priced as the untrimmed
    head, which understates its saving. ``device``: the cost file's, for the one line when the scheme is missing."""
    from skipsearch.methods.precision.surrogate import SchemeCost, draft_ratio

    scheme = costs.scheme(params.scheme)
    if scheme is None:
        raise missing_scheme(params.scheme, device, source=source)
    saving, note = scheme.head_saving_seconds if params.quant_head else 0.0, None
    if params.vocab_subset is not None:
        head = costs.lm_head_seconds
        if head is not None and vocab_size:
            share = min(params.vocab_subset / vocab_size, 1.0)
            saving = head - (head - saving) * share
            note = (f"approximation: the trimmed head ({params.vocab_subset} of {vocab_size} tokens) is priced at "
                    f"{share:.3f} of the LM head's cost (lm_head_seconds), the rest of the step unchanged")
        else:
            why = "the cost file has no lm_head_seconds" if head is None else "the record keeps no vocabulary size"
            note = f"approximation: the trimmed head is priced as the untrimmed head ({why}), understating its saving"
    cost = SchemeCost(scheme.scheme, costs.parts_seconds, scheme.attn_seconds, scheme.mlp_seconds, costs.attn_seconds,
                      costs.mlp_seconds, scheme.head_saving_seconds, unit_seconds=costs.step_seconds,
                      whole_seconds=scheme.whole_seconds)
    return draft_ratio(cost, draft, params, num_layers, saving=saving), note


def kept_precision(job: Replanning, cand: Candidate | None) -> tuple[PrecisionRecord, PrecisionParams]:
    """The profile's precision record, checked against its precision draft ``cand`` (own or a hybrid's fallback;
    None: it has none), with that draft's PrecisionParams; one line when it keeps none or one of another draft.
    The draft's scheme may be any the record traced (a profile re-planned into another scheme keeps the record).
    The cost file is then checked against the profile's model."""
    extra = job.extra
    if cand is None or PRECISION_KEY not in extra:
        raise ProfileError(f"{job.source}: keeps no precision record (measured.{PRECISION_KEY}): it was written "
                           f"before precision profiles kept one; run optimize again")
    rec = precision_from_dict(extra[PRECISION_KEY], source=job.source)
    params = PrecisionParams.parse(cand.plain_params(), draft=cand.draft, num_layers=job.profile.model.num_layers)
    if params.scheme not in rec.schemes() or (
            rec.skip_attn, rec.skip_mlp, rec.full_attn, rec.full_mlp, rec.quant_head, rec.vocab_subset) != (
            cand.draft.skip_attn, cand.draft.skip_mlp, params.full_attn, params.full_mlp, params.quant_head,
            params.vocab_subset):
        raise ProfileError(f"{job.source}: measured.{PRECISION_KEY} was recorded for another precision draft than "
                           f"the profile's (scheme, skipped, full sublayers or head); run optimize again")
    job.check_costs(rec.architecture or job.weights_architecture)
    return rec, params


def priced_schemes(job: Replanning, rec: PrecisionRecord, own: str) -> tuple[str, ...]:
    """The schemes ``rec`` traced that the job's cost file prices, the draft's own (``own``) first; one line when
    it prices none of them (for a record of one scheme, ``missing_scheme``'s)."""
    costs = job.target.costs
    traced = (own, *(s for s in rec.schemes() if s != own))
    out = tuple(s for s in traced if costs.scheme(s) is not None)
    if out:
        return out
    if len(traced) == 1:
        raise missing_scheme(own, job.target.device, source=job.costs_source)
    kind = (job.target.device or "").split(":")[0]
    runs = [s for s in traced if s in SCHEMES and kind in SCHEMES[s].devices]
    fix = (f"measure one with `skipsearch costs --schemes {runs[0]}`" if runs
           else f"none has a draft kernel on {kind or 'its device'}; search the draft again there")
    raise CostsError(f"{job.costs_source}: no costs for any precision scheme this draft was traced in "
                     f"({', '.join(traced)}): {fix}")


def traced_note(rec: PrecisionRecord, scheme: str, device: str | None) -> str | None:
    """For people, where ``scheme``'s traces were made through another device's kernel than the cost file's
    ``device``: that kernel rounds as it does, not as the target's (e.g. int4 in groups of 32, not 128)."""
    other, kind = rec.other(scheme), (device or "").split(":")[0]
    if other is None or other.device is None or other.device == kind:
        return None
    spec = SCHEMES.get(scheme)
    where = spec.kernel.get(other.device) if spec else None
    theirs = spec.kernel.get(kind) if spec else None
    return (f"approximation: {scheme}'s acceptance was traced through the {other.device} kernel"
            + (f" ({where})" if where else "") + (f", not {kind}'s ({theirs}), whose rounding differs" if theirs
                                                   else ""))


def _with_scheme(cand: Candidate, scheme: str) -> Candidate:
    return Candidate(cand.method, cand.draft, tuple((k, scheme if k == "scheme" else v) for k, v in cand.params))


# -- as a draft another method drafts through (Method.traces: a hybrid's fallback) ------------------------------
def _named(cand: Candidate) -> Candidate | None:
    # a draft whose params name no scheme keeps no record (as a precision profile's own, see keep)
    return cand if "scheme" in cand.plain_params() else None


def keep_traced(k: Keeping, cand: Candidate) -> Kept | None:
    """``keep_draft`` of ``cand``, lined up with the calibration's sequences; None where its params name no scheme."""
    return keep_draft(k, cand) if _named(cand) is not None else None


def variants(job: Replanning, cand: Candidate) -> tuple[Candidate, ...]:
    """``cand`` in each scheme its kept record traced that the job's cost file prices, its own first
    (``priced_schemes``); one line when the profile keeps no record of it or the cost file prices none."""
    rec, params = kept_precision(job, _named(cand))
    return tuple(cand if s == params.scheme else _with_scheme(cand, s)
                 for s in priced_schemes(job, rec, params.scheme))


def read_draft(job: Replanning, cand: Candidate) -> Traced:
    """``cand``'s kept traces in its scheme (``kept_precision``) and its c from the cost file's scheme costs
    (``precision_ratio``), with the note of any approximation that makes."""
    rec, params = kept_precision(job, _named(cand))
    c, note = precision_ratio(job.target.costs, job.profile.model.num_layers, cand.draft, params,
                              source=job.costs_source, vocab_size=rec.vocab_size, device=job.target.device)
    notes = "; ".join(n for n in (note, traced_note(rec, params.scheme, job.target.device)) if n)
    return Traced(rec.decoded(params.scheme), c, notes or None, key=PRECISION_KEY, label=params.scheme)


# -- re-planning the profile's own draft ----------------------------------------------------------------------
def _plan_scheme(job: Replanning, rec: PrecisionRecord, params: PrecisionParams, scheme: str):
    """The options (draft, Measurement) over K for the draft in ``scheme``, best first, and c's note."""
    from skipsearch.engine.surrogate import replan_skip_set
    from skipsearch.methods.precision.surrogate import priced

    profile, target = job.profile, job.target
    c, note = precision_ratio(target.costs, profile.model.num_layers, profile.draft, replace(params, scheme=scheme),
                              source=job.costs_source, vocab_size=rec.vocab_size, device=target.device)
    costs, traces = priced(target.cost_model(), c), rec.decoded(scheme)
    skip, searched = (profile.draft.skip_attn, profile.draft.skip_mlp), profile.draft
    ks = sorted({*job.k_values, searched.max_draft_tokens} - {0})
    options = sorted((replan_skip_set(traces, skip, costs, k_values=(k,),
                                      also=(searched,) if searched.max_draft_tokens == k else ()) for k in ks),
                     key=lambda cm: -cm[1].speedup)  # stable: ties keep the smaller K
    notes = "; ".join(n for n in (note, traced_note(rec, scheme, target.device)) if n)
    return tuple(options), notes or None


def replan(job: Replanning) -> Replanned:
    """For each scheme the record traced that the cost file prices (``priced_schemes``): c re-priced from its
    scheme costs (``precision_ratio``), then, for each K, the layer-skip replay over its traces with the best exit
    rule. The best scheme ships (the searched one on a tie); its name replaces method_params.scheme."""
    profile = job.profile
    own = profile.candidate if "scheme" in dict(profile.method_params) else None
    rec, params = kept_precision(job, own)
    schemes = priced_schemes(job, rec, params.scheme)
    plans = [(s, *_plan_scheme(job, rec, params, s)) for s in schemes]
    scheme, options, note = max(plans, key=lambda p: p[1][0][1].speedup)  # the first of equals: the searched one
    best, m = options[0]
    ships = best if m.speedup > 1.0 else replace(profile.draft, max_draft_tokens=0)
    shown = ", ".join(str(c.max_draft_tokens) for c, _ in options)
    if len(rec.schemes()) == 1:
        basis = f"its precision draft's traces ({scheme}), K of {shown}"
    else:
        weighed = ", ".join(f"{s} {opts[0][1].speedup:.3f}x" for s, opts, _ in plans)
        unpriced = [s for s in rec.schemes() if s not in schemes]
        basis = (f"its precision draft's traces in {scheme}: the best predicted of the schemes it was traced in "
                 f"that the cost file prices ({weighed}"
                 + (f"; no costs for {', '.join(unpriced)}" if unpriced else "") + f"), K of {shown}")
    changed = None if scheme == params.scheme else tuple(
        (k, scheme if k == "scheme" else v) for k, v in profile.method_params)
    return Replanned(ships, m, best, options, note, basis=basis, method_params=changed)


__all__ = ["RECORD", "keep", "keep_draft", "keep_traced", "kept_precision", "missing_scheme", "portable_schemes",
           "precision_ratio", "priced_schemes", "read_draft", "record_precision", "replan", "trace_record",
           "traced_note", "variants"]
