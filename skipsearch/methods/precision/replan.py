"""Precision's record and re-plan: a precision draft's traces, and its c re-priced from a cost file's scheme costs.

A precision draft's acceptance belongs to the model, its roles (skipped, full and quantized sublayers, the head)
and its scheme's numerics, not to the device's speed: the profile keeps its teacher-forced traces
(``record.PrecisionRecord``) and the scheme's per-sublayer costs on the searching device (in
``measured.costs.schemes``). Re-planning prices c from another device's scheme costs (``precision_ratio``) and
replays the traces at each K with the best exit rule. A hybrid's precision fallback reads the same parts.
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
from skipsearch.methods.precision.record import PRECISION_KEY, PrecisionRecord, precision_from_dict, precision_to_dict


def record_precision(traces, draft: DraftConfig, params: PrecisionParams, *, vocab_size: int | None = None,
                     workload: str | None = None, architecture: str | None = None) -> PrecisionRecord:
    """The precision record of a precision draft (``params``: its PrecisionParams) from its traces."""
    return PrecisionRecord(params.scheme, draft.skip_attn, draft.skip_mlp, params.full_attn, params.full_mlp,
                           params.quant_head, tuple(encode_trace(t) for t in traces), params.vocab_subset,
                           vocab_size, workload, architecture)


def keep_draft(k: Keeping, cand: Candidate) -> Kept:
    """The record of the precision draft ``cand`` (the profile's own, or a hybrid's fallback): its traces, one per
    calibration sequence, and its scheme's per-sublayer costs on this device."""
    from skipsearch.methods.precision.surrogate import draft_traces, scheme_cost
    from skipsearch.surrogate import aligned

    sm, cal = k.objective.sm, k.objective.cal
    pp = PrecisionParams.parse(cand.plain_params(), draft=cand.draft, num_layers=sm.num_layers)
    traces = aligned(draft_traces(k.objective, cand.draft, pp), cal)
    vocab = getattr(getattr(getattr(sm, "hf", None), "config", None), "vocab_size", None)
    rec = record_precision(traces, cand.draft, pp, vocab_size=vocab if isinstance(vocab, int) else None,
                           workload=k.workload, architecture=k.architecture)
    sc = scheme_cost(k.objective, pp.scheme)
    return Kept(((PRECISION_KEY, precision_to_dict(rec)),),
                (sc.kept(),))


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
    The cost file is then checked against the profile's model."""
    extra = job.extra
    if cand is None or PRECISION_KEY not in extra:
        raise ProfileError(f"{job.source}: keeps no precision record (measured.{PRECISION_KEY}): it was written "
                           f"before precision profiles kept one; run optimize again")
    rec = precision_from_dict(extra[PRECISION_KEY], source=job.source)
    params = PrecisionParams.parse(cand.plain_params(), draft=cand.draft, num_layers=job.profile.model.num_layers)
    if (rec.scheme, rec.skip_attn, rec.skip_mlp, rec.full_attn, rec.full_mlp, rec.quant_head, rec.vocab_subset) != (
            params.scheme, cand.draft.skip_attn, cand.draft.skip_mlp, params.full_attn, params.full_mlp,
            params.quant_head, params.vocab_subset):
        raise ProfileError(f"{job.source}: measured.{PRECISION_KEY} was recorded for another precision draft than "
                           f"the profile's (scheme, skipped, full sublayers or head); run optimize again")
    job.check_costs(rec.architecture or job.weights_architecture)
    return rec, params


# -- as a draft another method drafts through (Method.traces: a hybrid's fallback) ------------------------------
def _named(cand: Candidate) -> Candidate | None:
    # a draft whose params name no scheme keeps no record (as a precision profile's own, see keep)
    return cand if "scheme" in cand.plain_params() else None


def keep_traced(k: Keeping, cand: Candidate) -> Kept | None:
    """``keep_draft`` of ``cand``, lined up with the calibration's sequences; None where its params name no scheme."""
    return keep_draft(k, cand) if _named(cand) is not None else None


def read_draft(job: Replanning, cand: Candidate) -> Traced:
    """``cand``'s kept traces (``kept_precision``) and its c from the cost file's scheme costs
    (``precision_ratio``), with the note of any approximation that makes."""
    rec, params = kept_precision(job, _named(cand))
    c, note = precision_ratio(job.target.costs, job.profile.model.num_layers, cand.draft, params,
                              source=job.costs_source, vocab_size=rec.vocab_size, device=job.target.device)
    return Traced(rec.decoded(), c, note, key=PRECISION_KEY)


# -- re-planning the profile's own draft ----------------------------------------------------------------------
def replan(job: Replanning) -> Replanned:
    """c re-priced from the cost file's scheme costs (``precision_ratio``), then, for each K, the layer-skip replay
    over the kept traces with the best exit rule."""
    from skipsearch.methods.precision.surrogate import priced
    from skipsearch.surrogate import replan_skip_set

    profile, target = job.profile, job.target
    own = profile.candidate if "scheme" in dict(profile.method_params) else None
    rec, params = kept_precision(job, own)
    c, note = precision_ratio(target.costs, profile.model.num_layers, profile.draft, params,
                              source=job.costs_source, vocab_size=rec.vocab_size, device=target.device)
    costs, traces = priced(target.cost_model(), c), rec.decoded()
    skip, searched = (profile.draft.skip_attn, profile.draft.skip_mlp), profile.draft
    ks = sorted({*job.k_values, searched.max_draft_tokens} - {0})
    options = sorted((replan_skip_set(traces, skip, costs, k_values=(k,),
                                      also=(searched,) if searched.max_draft_tokens == k else ()) for k in ks),
                     key=lambda cm: -cm[1].speedup)  # stable: ties keep the smaller K
    best, m = options[0]
    ships = best if m.speedup > 1.0 else replace(searched, max_draft_tokens=0)
    shown = ", ".join(str(c.max_draft_tokens) for c, _ in options)
    return Replanned(ships, m, best, tuple(options), note,
                     basis=f"its precision draft's traces ({profile.candidate.param('scheme', '?')}), K of {shown}")


__all__ = ["RECORD", "keep", "keep_draft", "keep_traced", "kept_precision", "missing_scheme", "precision_ratio",
           "read_draft", "record_precision", "replan"]
