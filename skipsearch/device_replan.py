"""Search once, deploy anywhere: re-plan profiles and re-rank studies for another device's costs.

The layer-skip surrogate has two halves that belong to different things:
- acceptance, which belongs to the model, the skip set and the workload: one *trace* per calibration
  sequence, the draft's per-position agreement with the full model and its top probability
  (objective.trace). A trace does not depend on K or the exit rule, only on the skip set;
- cost, which belongs to the device (skipsearch.costs).
``objective.replay`` joins them. So a profile that keeps the traces of its shortlisted skip sets, and the
cost profile it was planned with, can be re-planned for any other device by replaying, with no model:
``plan --profile x.yaml --costs other.yaml`` tries every K and exit rule of a small grid on every kept skip
set. A study is re-ranked the same way (``optimize --study S --costs other.yaml --budget 0``); its trials
keep no traces, so those are re-traced on the loaded model, one forward per skip set and calibration
sequence and no timing, which also makes them the target machine's own numerics.

The kept traces are compact: one byte per position (the top bit: the draft's argmax matched; the low
seven: round(127 · top probability)), base64, one string per sequence. Confidences move only the exit
rule, whose threshold the quantisation (±0.004) crosses rarely.

The records' formats (and their checks, which profile.py runs on every load) are skipsearch.files.records;
this module makes them and re-plans from them, and imports torch only inside the functions that trace or
replay.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from skipsearch.config import AUTOREGRESSIVE, NO_EXIT, Candidate, ConfigError, DraftConfig, ExitRule, Trace
from skipsearch.costs import CostProfile, costs_from_model, planned_costs_of
from skipsearch.files.costs import (
    COSTS_KEY,
    Costs,
    PlannedCosts,
    SchemeCosts,
    planned_costs_from_dict,
    planned_costs_to_dict,
)
from skipsearch.files.errors import CostsError, ProfileError
from skipsearch.files.records import (
    ACCEPTANCE_KEY,
    FRACTAL_KEY,
    LOOKUP_KEY,
    NO_HIT,
    PRECISION_KEY,
    AcceptanceRecord,
    FractalRecord,
    LookupRecord,
    PrecisionRecord,
    SkipSetTraces,
    acceptance_from_dict,
    acceptance_to_dict,
    encode_trace,
    fractal_from_dict,
    fractal_to_dict,
    lookup_from_dict,
    lookup_to_dict,
    precision_from_dict,
    precision_to_dict,
)
from skipsearch.methods.clasp_dynamic import METHOD as CLASP_DYNAMIC
from skipsearch.methods.fractal import METHOD as FRACTAL
from skipsearch.methods.hierarchical import METHOD as HIERARCHICAL
from skipsearch.methods.hierarchical import Hierarchy, hierarchy_from_profile, hierarchy_to_profile_fields
from skipsearch.methods.hybrid import METHOD as HYBRID
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.ngram import METHOD as NGRAM
from skipsearch.methods.precision import METHOD as PRECISION
from skipsearch.profile import BASELINE_OURS_AR, BASELINE_PREDICTED, Measured, Profile

if TYPE_CHECKING:
    from skipsearch.measure import Measurement
    from skipsearch.models import SkippableModel
    from skipsearch.study import TrialRecord
    from skipsearch.surrogate import Calibration, CostModel

K_VALUES = (1, 2, 3, 4, 6, 8)  # SearchSpace's default choices of K
# the exit rules re-planning tries: none, and a fixed or adaptive threshold γ0 = 0.1 .. 0.9 (replays are cheap)
EXIT_RULES = (NO_EXIT, *(ExitRule(threshold=t / 10, adaptive=a) for a in (True, False) for t in range(1, 10)))
MAX_KEPT = 8  # skip sets a profile keeps the traces of
NOT_TIMED = "predicted, not timed"  # measured.notes of a re-planned profile starts with this


class NoRecordError(ProfileError):
    """The profile keeps no record of what its draft accepts, but one can be made on the model
    (``record_on_model``): a hand-written profile, or one written before profiles kept records."""


# -- the lookup record (skipsearch.files.records): recording it, and re-planning K from it ---------------------
LOOKUP_MAX_K = 16  # the largest K a lookup record can re-plan
LOOKUP_K_VALUES = (1, 2, 3, 4, 6, 8, 10, 12, 16)  # the K re-planning tries (NgramStrategy's grid and more)
LOOKUP_METHODS = (NGRAM.name, HYBRID.name)


def record_lookup(cal: Calibration, *, min_n: int, max_n: int, max_k: int = LOOKUP_MAX_K,
                  workload: str | None = None) -> LookupRecord:
    """The lookup record of prompt lookup with suffixes ``min_n .. max_n`` over the calibration's greedy
    continuations (no model runs: the lookup reads tokens)."""
    from skipsearch.methods.ngram import NgramIndex, leading_matches

    out = []
    for prompt, cont in zip(cal.prompts, cal.continuations, strict=True):
        index, seq, data = NgramIndex(min_n, max_n), [*prompt, *cont[:1]], bytearray()
        for t in range(1, len(cont)):
            tokens = index.lookup(seq, max_k)
            data.append(min(leading_matches(tokens, cont, t), max_k) if tokens else NO_HIT)
            seq.append(cont[t])
        out.append(base64.b64encode(bytes(data)).decode("ascii"))
    return LookupRecord(min_n, max_n, max_k, cal.max_new_tokens, tuple(out), workload)


def _recorded_lookup(seq: Sequence[int], k: int, n: int):
    """The lookup of one recorded sequence (positions t = 1 .. n - 1) at K = ``k``, as hybrid's
    LookupThenFallback reads it: (drafted, accepted) on a hit, None on a miss."""
    def lookup(_seq, t, limit):
        b = seq[t - 1]
        if b == NO_HIT:
            return None
        drafted = min(k, limit)
        return drafted, min(b, drafted, n - t)
    return lookup


def replay_recorded(rec: LookupRecord, k: int, costs: CostModel, *, fallback: DraftConfig | None = None,
                    traces: Sequence[Trace] = (), c: float = 0.0, source: str = PRECISION.name) -> Measurement:
    """Prompt lookup with K = ``k`` replayed cycle by cycle from the record by the engine's rules
    (ngram.replay_cycles), and, on a miss, the ``fallback`` draft (hybrid's, e.g. a precision draft) walked over
    ``traces`` (one per recorded sequence) by hybrid.LookupThenFallback, charged ``c`` per draft token: exact in
    acceptance; each cycle pays v(drafted + 1)."""
    from skipsearch.methods.hybrid import LookupThenFallback
    from skipsearch.methods.ngram import cycle_measurement, replay_cycles

    if not 1 <= k <= rec.max_k:
        raise ConfigError(f"K {k} is outside what the lookup record covers (1..{rec.max_k})")
    seqs = rec.positions()
    rows = zip(seqs, traces, strict=True) if fallback is not None else ((seq, None) for seq in seqs)
    cycles, drafted = [], 0
    for seq, tr in rows:
        n = len(seq) + 1
        propose = LookupThenFallback(_recorded_lookup(seq, k, n), source if fallback is not None else None,
                                     fallback, tr if tr is not None and tr.matches else None, n)
        cycles += replay_cycles((), range(n), max_new_tokens=rec.max_new_tokens, propose=propose)
        drafted += propose.fallback_drafted
    if fallback is None:
        return cycle_measurement(cycles, verify=costs.verify)
    matches = [m for tr in traces for m in tr.matches]
    fields = {"alpha": sum(matches) / len(matches)} if matches else {}
    return cycle_measurement(cycles, verify=costs.verify, draft_steps=drafted * c, cost_ratio=c, **fields)


def replay_lookup(rec: LookupRecord, k: int, costs: CostModel) -> Measurement:
    """What prompt lookup with K = ``k`` achieves under ``costs``, replayed cycle by cycle from the record by the
    engine's rules (ngram.replay_cycles): exact in acceptance; each cycle pays v(drafted + 1)."""
    return replay_recorded(rec, k, costs)


def replan_lookup(rec: LookupRecord, costs: CostModel, *, k_values: Sequence[int] = LOOKUP_K_VALUES,
                  also: Sequence[int] = ()) -> Replanned:
    """The K the replay predicts fastest under ``costs`` (ties: the smaller K); plain decoding when none pays."""
    ks = sorted({k for k in (*k_values, *also) if 1 <= k <= rec.max_k})
    scored = sorted(((replay_lookup(rec, k, costs), k) for k in ks), key=lambda mk: (-mk[0].speedup, mk[1]))
    options = tuple((DraftConfig(max_draft_tokens=k, exit=NO_EXIT), m) for m, k in scored)
    draft, m = options[0] if options else (None, None)
    ships = draft if m is not None and m.speedup > 1.0 else AUTOREGRESSIVE
    return Replanned(ships, m, draft, options)


# -- the precision record: a precision draft's traces, and c re-priced from a cost file's scheme costs ----------
def precision_draft(profile: Profile) -> Candidate | None:
    """The profile's precision draft as a precision candidate: its own (``method: precision``), or a hybrid's
    precision fallback; None otherwise. A profile that ships plain decoding (K = 0) keeps its method params,
    so its draft is still there: re-planned elsewhere it may pay."""
    if profile.method == PRECISION.name:
        return profile.candidate if "scheme" in dict(profile.method_params) else None
    fb = _hybrid_fallback(profile, PRECISION.name)
    return fb if fb is not None and "scheme" in fb.plain_params() else None


def layer_skip_fallback(profile: Profile) -> Candidate | None:
    """A hybrid profile's layer-skip fallback (with the full head) as a layer-skip candidate; None otherwise (no
    hybrid, another fallback, or a trimmed head, whose cost a cost file does not price)."""
    fb = _hybrid_fallback(profile, LAYER_SKIP.name)
    return fb if fb is not None and not fb.plain_params().get("vocab_subset") else None


def _hybrid_fallback(profile: Profile, method: str) -> Candidate | None:
    """A hybrid profile's fallback as a candidate of its own method, when that method is ``method``; else None
    (also for params that do not parse: the profile's own checks say why)."""
    from skipsearch.methods.hybrid import HybridParams

    params = dict(profile.method_params)
    if profile.method != HYBRID.name or params.get("fallback") != method:
        return None
    try:
        return HybridParams.parse(params, draft=profile.draft,
                                  num_layers=profile.model.num_layers).fallback_candidate(profile.draft)
    except ConfigError:
        return None


def record_precision(traces: Sequence[Trace], draft: DraftConfig, params: Any, *, vocab_size: int | None = None,
                     workload: str | None = None, architecture: str | None = None) -> PrecisionRecord:
    """The precision record of a precision draft (``params``: its PrecisionParams) from its traces."""
    return PrecisionRecord(params.scheme, draft.skip_attn, draft.skip_mlp, params.full_attn, params.full_mlp,
                           params.quant_head, tuple(encode_trace(t) for t in traces), params.vocab_subset,
                           vocab_size, workload, architecture)


def precision_ratio(costs: Costs, num_layers: int, draft: DraftConfig, params: Any, *, source: str,
                    vocab_size: int | None = None) -> tuple[float, str | None]:
    """c of a precision draft under a cost file's ``costs`` (its scheme's per-sublayer costs beside the full
    model's), and a note for people when it is an approximation:
    c = (step - L·(attn + mlp) - head saving + |quantized attn|·scheme attn + |full attn|·attn
         + |quantized mlp|·scheme mlp + |full mlp|·mlp) / step   (precision.surrogate.draft_ratio).
    A trimmed head (``vocab_subset`` V' of V tokens) is priced at V'/V of the head it trims (the scheme's, or the
    full one: ``lm_head_seconds``), all else equal; with no lm_head_seconds or no V it is priced as the untrimmed
    head, which understates its saving."""
    from skipsearch.methods.precision.surrogate import SchemeCost, draft_ratio

    scheme = costs.scheme(params.scheme)
    if scheme is None:
        raise CostsError(f"{source}: no costs for precision scheme {params.scheme}: measure them with "
                         f"`skipsearch costs --schemes {params.scheme}`")
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
    cost = SchemeCost(scheme.scheme, costs.step_seconds, scheme.attn_seconds, scheme.mlp_seconds, costs.attn_seconds,
                      costs.mlp_seconds, scheme.head_saving_seconds)
    return draft_ratio(cost, draft, params, num_layers, saving=saving), note


def _precision_parts(profile: Profile, *, source: str) -> tuple[PrecisionRecord, Candidate, Any]:
    """The profile's precision record, checked against its precision draft (own or fallback), that draft and
    its PrecisionParams; one line when it keeps none or one of another draft."""

    cand = precision_draft(profile)
    extra = dict(profile.measured.extra) if profile.measured else {}
    if cand is None or PRECISION_KEY not in extra:
        raise ProfileError(f"{source}: keeps no precision record (measured.{PRECISION_KEY}): it was written before "
                           f"precision profiles kept one; run optimize again")
    rec = precision_from_dict(extra[PRECISION_KEY], source=source)
    params = PRECISION.parse(cand.plain_params(), draft=cand.draft, num_layers=profile.model.num_layers)
    if (rec.scheme, rec.skip_attn, rec.skip_mlp, rec.full_attn, rec.full_mlp, rec.quant_head, rec.vocab_subset) != (
            params.scheme, cand.draft.skip_attn, cand.draft.skip_mlp, params.full_attn, params.full_mlp,
            params.quant_head, params.vocab_subset):
        raise ProfileError(f"{source}: measured.{PRECISION_KEY} was recorded for another precision draft than the "
                           f"profile's (scheme, skipped, full sublayers or head); run optimize again")
    return rec, cand, params


def portable_parts(profile: Profile, *, source: str) -> tuple[AcceptanceRecord | None, PlannedCosts | None]:
    extra = dict(profile.measured.extra) if profile.measured else {}
    acc = acceptance_from_dict(extra[ACCEPTANCE_KEY], source=source) if ACCEPTANCE_KEY in extra else None
    costs = planned_costs_from_dict(extra[COSTS_KEY], source=source) if COSTS_KEY in extra else None
    return acc, costs


# -- tracing (needs the model) -------------------------------------------------------------------------------
def trace_skip_sets(sm: SkippableModel, cal: Calibration, configs: Sequence[DraftConfig], *,
                    on_progress: Callable[[int, int], None] | None = None) -> dict[tuple, tuple[Trace, ...]]:
    """Traces of each distinct skip set among ``configs``, keyed by (skip_attn, skip_mlp). The full-model KV of
    each calibration sequence is built once and shared by every skip set (objective.trace crops its own)."""
    from skipsearch.surrogate import full_cache, trace

    keys = list(dict.fromkeys((c.skip_attn, c.skip_mlp) for c in configs))
    rows = [(p, c) for p, c in zip(cal.prompts, cal.continuations, strict=True) if c]
    caches = [full_cache(sm, p, c) for p, c in rows]
    out = {}
    for i, key in enumerate(keys):
        config = DraftConfig(*key)
        out[key] = tuple(trace(sm, p, c, config, cache=kv) for (p, c), kv in zip(rows, caches, strict=True))
        if on_progress:
            on_progress(i + 1, len(keys))
    return out


def record_acceptance(traced: dict[tuple, Sequence[Trace]], *, workload: str | None = None,
                      architecture: str | None = None) -> AcceptanceRecord:
    return AcceptanceRecord(tuple(SkipSetTraces(a, m, tuple(encode_trace(t) for t in trs))
                                  for (a, m), trs in traced.items()), workload, architecture)


def _aligned(traces: Sequence[Trace], cal: Calibration) -> tuple[Trace, ...]:
    """``traces`` (one per calibration sequence with a continuation) lined up with the lookup record's sequences
    (one per calibration sequence), an empty trace where a continuation is empty."""
    it = iter(traces)
    return tuple(next(it) if cont else Trace((), ()) for cont in cal.continuations)


def _fractal_entry(profile: Profile, sm: SkippableModel, cal: Calibration, *, workload: str) -> tuple[str, dict]:
    """The ``measured`` entry of the profile's fractal record, made on the model (fractal.surrogate.record)."""
    from skipsearch.costs import architecture_of
    from skipsearch.methods.fractal.surrogate import record

    params = FRACTAL.parse(profile.method_params, draft=profile.draft, num_layers=sm.num_layers)
    return FRACTAL_KEY, fractal_to_dict(record(sm, cal, params, workload=workload, architecture=architecture_of(sm)))


def keep_portable(profile: Profile, objective: Any, candidates: Sequence[Candidate], *,
                  workload: str | None = None) -> Profile:
    """``profile`` with what re-planning needs in ``measured``: the traces of the distinct layer-skip skip sets
    among ``candidates`` (the shortlist, best first; at most MAX_KEPT) and the cost model the search measured;
    for a precision draft (the profile's own, or a hybrid's precision fallback) its traces and its scheme's
    per-sublayer costs (in ``measured.costs.schemes``); for prompt lookup (ngram, or hybrid without a fallback
    or with a precision one) the lookup record; for a fractal draft its fractal record. ``objective`` is
    optimize's ModelObjective; its calibration is re-traced here (one forward per sequence)."""
    from skipsearch.costs import architecture_of

    drafts = [c.draft for c in candidates if c.method == LAYER_SKIP.name and not c.is_autoregressive]
    keys = list(dict.fromkeys((d.skip_attn, d.skip_mlp) for d in drafts))[:MAX_KEPT]
    costs = objective.measured_costs
    params = dict(profile.method_params)
    precision = precision_draft(profile)
    skipping = layer_skip_fallback(profile)
    lookup = profile.method in LOOKUP_METHODS and (params.get("fallback", "none") == "none" or
                                                   (profile.method == HYBRID.name and precision is not None)
                                                   or skipping is not None)
    fractal = profile.method == FRACTAL.name
    if profile.measured is None or not (keys or costs is not None or lookup or precision is not None or fractal):
        return profile
    sm, cal = objective.sm, objective.cal
    shown = workload or f"{len(cal.prompts)} prompts x {cal.max_new_tokens} tokens"
    extra = []
    if lookup:  # the lookup's match record: tokens only, no model runs
        rec = record_lookup(cal, min_n=params.get("min_n", 1), max_n=params.get("max_n", 3), workload=shown)
        extra.append((LOOKUP_KEY, lookup_to_dict(rec)))
    if skipping is not None:  # the fallback's traces, one per lookup sequence ("" where a continuation is empty)
        key = (skipping.draft.skip_attn, skipping.draft.skip_mlp)
        traced = {key: _aligned(trace_skip_sets(sm, cal, [DraftConfig(*key)])[key], cal)}
        extra.append((ACCEPTANCE_KEY, acceptance_to_dict(record_acceptance(traced, workload=shown,
                                                                           architecture=architecture_of(sm)))))
    elif keys:
        traced = trace_skip_sets(sm, cal, [DraftConfig(a, m) for a, m in keys])
        extra.append((ACCEPTANCE_KEY, acceptance_to_dict(record_acceptance(traced, workload=shown,
                                                                           architecture=architecture_of(sm)))))
    schemes: tuple[SchemeCosts, ...] = ()
    if precision is not None:
        from skipsearch.methods.precision.surrogate import draft_traces, scheme_cost

        pp = PRECISION.parse(precision.plain_params(), draft=precision.draft, num_layers=sm.num_layers)
        aligned = _aligned(draft_traces(objective, precision.draft, pp), cal)
        vocab = getattr(getattr(getattr(sm, "hf", None), "config", None), "vocab_size", None)
        extra.append((PRECISION_KEY, precision_to_dict(record_precision(
            aligned, precision.draft, pp, vocab_size=vocab if isinstance(vocab, int) else None, workload=shown,
            architecture=architecture_of(sm)))))
        sc = scheme_cost(objective, pp.scheme)
        schemes = (SchemeCosts(sc.scheme, sc.attn_seconds, sc.mlp_seconds, sc.head_saving_seconds),)
    if costs is not None:
        import torch

        planned = PlannedCosts(replace(costs_from_model(costs), schemes=schemes), str(sm.device), sm.dtype_name,
                               "measured by optimize", torch.get_num_threads())
        extra.append((COSTS_KEY, planned_costs_to_dict(planned)))
    if fractal:  # one draft pass per decoding cycle over the calibration
        extra.append(_fractal_entry(profile, sm, cal, workload=shown))
    drop = (ACCEPTANCE_KEY, COSTS_KEY, LOOKUP_KEY, PRECISION_KEY, FRACTAL_KEY)
    kept = tuple((k, v) for k, v in profile.measured.extra if k not in drop)
    return replace(profile, measured=replace(profile.measured, extra=kept + tuple(extra)))


# -- predicting and re-planning (no model) -------------------------------------------------------------------
def predict(traces: Sequence[Trace], config: DraftConfig, costs: CostModel) -> Measurement:
    from skipsearch.surrogate import replay_all

    return replay_all(traces, config, costs)


def replan_skip_set(traces: Sequence[Trace], skip: tuple, costs: CostModel, *, k_values: Sequence[int] = K_VALUES,
                    exit_rules: Sequence[ExitRule] = EXIT_RULES,
                    also: Sequence[DraftConfig] = ()) -> tuple[DraftConfig, Measurement]:
    """The K and exit rule that the replay predicts fastest for this skip set under ``costs``, of the grid and
    ``also`` (e.g. the config as searched). Ties go to the smaller K, then to the earlier exit rule."""
    configs = [DraftConfig(skip[0], skip[1], k, e) for k in sorted(k_values) for e in exit_rules]
    # ``also`` adds drafts only: a profile that ships plain decoding (K = 0) is not an option to weigh against them
    configs += [c for c in also if (c.skip_attn, c.skip_mlp) == tuple(skip) and c not in configs
                and not c.is_autoregressive]
    scored = [(predict(traces, c, costs), c) for c in configs]
    best = max(scored, key=lambda mc: mc[0].speedup)  # max keeps the first of equals
    return best[1], best[0]


@dataclass(frozen=True)
class Replanned:
    draft: DraftConfig  # what ships: the best draft, or plain decoding when no draft is predicted to pay
    predicted: Measurement | None  # of the best draft (even when plain decoding ships)
    best_draft: DraftConfig | None
    options: tuple[tuple[DraftConfig, Measurement], ...]  # the best per kept skip set (or per K), best first
    note: str | None = None  # for people: an approximation the prediction makes (e.g. a trimmed head's cost)


def replan_record(rec: AcceptanceRecord, costs: CostModel, *, k_values: Sequence[int] = K_VALUES,
                  also: Sequence[DraftConfig] = ()) -> Replanned:
    """Re-plan K, the exit rule and the skip set (among the kept ones) for ``costs``."""
    options = sorted((replan_skip_set(s.decoded(), (s.skip_attn, s.skip_mlp), costs, k_values=k_values, also=also)
                      for s in rec.skip_sets), key=lambda cm: -cm[1].speedup)
    draft, m = options[0] if options else (None, None)
    ships = draft if m is not None and m.speedup > 1.0 else AUTOREGRESSIVE
    return Replanned(ships, m, draft, tuple(options))


def replan_profile(profile: Profile, target: CostProfile, *, source: str, costs_source: str,
                   k_values: Sequence[int] = K_VALUES) -> tuple[Profile, Replanned]:
    """A new profile for ``target``'s device: K, the exit rule and the skip set re-planned from the profile's
    acceptance record, its ``measured`` block predicted, not timed (until ``bench --write-measured``)."""
    from skipsearch.costs import check_costs_model

    weights = profile.model.weights_fingerprint
    if profile.method in LOOKUP_METHODS:
        return _replan_lookup_profile(profile, target, source=source, costs_source=costs_source)
    if profile.method == PRECISION.name:
        return _replan_precision_profile(profile, target, source=source, costs_source=costs_source,
                                         k_values=k_values)
    if profile.method == HIERARCHICAL.name:
        return _replan_hierarchical_profile(profile, target, source=source, costs_source=costs_source)
    if profile.method == FRACTAL.name:
        return _replan_fractal_profile(profile, target, source=source, costs_source=costs_source)
    if profile.method not in (LAYER_SKIP.name, CLASP_DYNAMIC.name):
        raise ConfigError(f"{source}: re-planning needs a layer-skip profile's traces or a lookup profile's match "
                          f"record; this one is method {profile.method} (plan it again on the device instead)")
    rec, _ = portable_parts(profile, source=source)
    check_costs_model(target, num_layers=profile.model.num_layers,
                      architecture=(rec and rec.architecture) or (weights.split("-")[0] if weights else None),
                      fingerprint=profile.model.fingerprint, source=costs_source,
                      what=f"the profile's model ({profile.model.name})")
    if rec is None:  # after the cost file's checks: a caller may trace the draft on the model next
        raise NoRecordError(f"{source}: keeps no acceptance record (measured.acceptance): it was written before "
                            f"profiles kept one, or by hand; plan traces its draft on the model (`skipsearch plan "
                            f"--profile`), or run optimize again")
    if profile.method == CLASP_DYNAMIC.name:
        return _replan_clasp_dynamic_profile(profile, target, rec, source=source, costs_source=costs_source,
                                             k_values=k_values)
    plan = replan_record(rec, target.cost_model(), k_values=k_values, also=(profile.draft,))
    return _replanned_profile(profile, target, plan, plan.draft, plan.best_draft, costs_source=costs_source)


CLASP_DYNAMIC_NOTE = ("approximation: dynamic CLaSp re-selects its skipped sublayers every LOI verify steps; it is "
                      "priced with the traces of its starting skip set, which skips as many sublayers (so c is the "
                      "same), while the acceptance the re-selection adds is not modelled")


def _replan_clasp_dynamic_profile(profile: Profile, target: CostProfile, rec: AcceptanceRecord, *, source: str,
                                  costs_source: str, k_values: Sequence[int]) -> tuple[Profile, Replanned]:
    """``replan_profile`` for dynamic CLaSp: K and the exit rule re-chosen for ``target`` by replaying the
    traces of the profile's starting skip set (the DP's choice is left as it is)."""
    start = (profile.draft.skip_attn, profile.draft.skip_mlp)
    kept = [s for s in rec.skip_sets if (s.skip_attn, s.skip_mlp) == start]
    if not kept:
        raise ProfileError(f"{source}: measured.{ACCEPTANCE_KEY} keeps no traces of the profile's starting skip "
                           f"set; run optimize again")
    plan = replan_record(AcceptanceRecord(tuple(kept), rec.workload, rec.architecture), target.cost_model(),
                         k_values=k_values, also=(profile.draft,))
    plan = replace(plan, note=CLASP_DYNAMIC_NOTE)
    # plain decoding ships as K = 0 with the starting set kept, so the method's params stay valid
    ships = plan.draft if not plan.draft.is_autoregressive else replace(profile.draft, max_draft_tokens=0)
    return _replanned_profile(profile, target, replace(plan, draft=ships), ships, plan.best_draft,
                              costs_source=costs_source)


def record_on_model(profile: Profile, sm: SkippableModel, cal: Calibration, *, workload: str,
                    source: str) -> Profile:
    """``profile`` with the acceptance record of its own draft made on the loaded model, with no timing: its skip
    set traced over the calibration (one forward per sequence), as optimize keeps for its shortlist; for a fractal
    draft one draft pass per position (fractal.surrogate.record). For a profile that keeps none
    (``NoRecordError``); acceptance belongs to the model and the workload, not to the hardware, so the record is as
    good as one kept by optimize."""
    from skipsearch.costs import architecture_of

    draft = profile.draft
    measured = profile.measured or Measured(source="hand")
    if profile.method == FRACTAL.name:
        kept = tuple((k, v) for k, v in measured.extra if k != FRACTAL_KEY)
        entry = _fractal_entry(profile, sm, cal, workload=workload)
        return replace(profile, measured=replace(measured, extra=(*kept, entry)))
    if not (draft.skip_attn or draft.skip_mlp):
        raise ProfileError(f"{source}: its draft skips no sublayer, so there is no draft to trace; decode it "
                           f"without a profile")
    traced = trace_skip_sets(sm, cal, [draft])
    rec = record_acceptance(traced, workload=workload, architecture=architecture_of(sm))
    kept = tuple((k, v) for k, v in measured.extra if k != ACCEPTANCE_KEY)
    return replace(profile, measured=replace(measured, extra=(*kept, (ACCEPTANCE_KEY, acceptance_to_dict(rec)))))


def _replan_lookup_profile(profile: Profile, target: CostProfile, *, source: str,
                           costs_source: str) -> tuple[Profile, Replanned]:
    """``replan_profile`` for prompt lookup (ngram, or hybrid without a fallback): K re-chosen for ``target``'s
    v(k) by replaying the profile's lookup record."""
    from skipsearch.costs import check_costs_model

    params = dict(profile.method_params)
    if profile.method == HYBRID.name and params.get("fallback") in (PRECISION.name, LAYER_SKIP.name):
        return _replan_hybrid_fallback_profile(profile, target, source=source, costs_source=costs_source)
    if profile.method == HYBRID.name and params.get("fallback", "none") != "none":
        raise ConfigError(f"{source}: re-planning a hybrid profile with a {params.get('fallback')} fallback is not "
                          f"supported (its draft passes have no record); plan it again on the device")
    extra = dict(profile.measured.extra) if profile.measured else {}
    if LOOKUP_KEY not in extra:
        raise ProfileError(f"{source}: keeps no lookup record (measured.{LOOKUP_KEY}): it was written before "
                           f"lookup profiles kept one; run optimize again")
    rec = lookup_from_dict(extra[LOOKUP_KEY], source=source)
    if (rec.min_n, rec.max_n) != (params.get("min_n", rec.min_n), params.get("max_n", rec.max_n)):
        raise ProfileError(f"{source}: measured.{LOOKUP_KEY} was recorded for n {rec.min_n}..{rec.max_n}, "
                           f"not the profile's {params.get('min_n')}..{params.get('max_n')}; run optimize again")
    check_costs_model(target, num_layers=profile.model.num_layers, architecture=None,
                      fingerprint=profile.model.fingerprint, source=costs_source,
                      what=f"the profile's model ({profile.model.name})")
    searched = profile.draft.max_draft_tokens
    plan = replan_lookup(rec, target.cost_model(), also=(searched,) if searched else ())
    k = plan.draft.max_draft_tokens
    ships = replace(profile.draft, max_draft_tokens=k)
    return _replanned_profile(profile, target, plan, ships, ships if k else plan.best_draft,
                              costs_source=costs_source)


def _check_precision_costs(profile: Profile, target: CostProfile, rec: PrecisionRecord, *, costs_source: str):
    from skipsearch.costs import check_costs_model

    weights = profile.model.weights_fingerprint
    check_costs_model(target, num_layers=profile.model.num_layers,
                      architecture=rec.architecture or (weights.split("-")[0] if weights else None),
                      fingerprint=profile.model.fingerprint, source=costs_source,
                      what=f"the profile's model ({profile.model.name})")


def _replan_precision_profile(profile: Profile, target: CostProfile, *, source: str, costs_source: str,
                              k_values: Sequence[int] = K_VALUES) -> tuple[Profile, Replanned]:
    """``replan_profile`` for a precision draft: its c re-priced from ``target``'s scheme costs
    (``precision_ratio``), then, for each K, the layer-skip replay over its kept traces with the best exit rule."""
    from skipsearch.methods.precision.surrogate import priced

    rec, cand, params = _precision_parts(profile, source=source)
    _check_precision_costs(profile, target, rec, costs_source=costs_source)
    c, note = precision_ratio(target.costs, profile.model.num_layers, profile.draft, params, source=costs_source,
                              vocab_size=rec.vocab_size)
    costs, traces = priced(target.cost_model(), c), rec.decoded()
    skip, searched = (profile.draft.skip_attn, profile.draft.skip_mlp), profile.draft
    ks = sorted({*k_values, searched.max_draft_tokens} - {0})
    options = sorted((replan_skip_set(traces, skip, costs, k_values=(k,),
                                      also=(searched,) if searched.max_draft_tokens == k else ()) for k in ks),
                     key=lambda cm: -cm[1].speedup)  # stable: ties keep the smaller K
    best, m = options[0]
    ships = best if m.speedup > 1.0 else replace(searched, max_draft_tokens=0)
    plan = Replanned(ships, m, best, tuple(options), note)
    return _replanned_profile(profile, target, plan, ships, best, costs_source=costs_source)


def _replan_hybrid_fallback_profile(profile: Profile, target: CostProfile, *, source: str,
                                    costs_source: str) -> tuple[Profile, Replanned]:
    """``replan_profile`` for a hybrid with a precision or layer-skip fallback: K re-chosen for ``target`` by
    replaying the lookup record and, on a miss, the fallback over its kept traces (hybrid.LookupThenFallback, as
    hybrid's surrogate), the fallback charged the c ``target``'s costs give it (a precision draft's from its
    scheme costs, a layer-skip draft's from the per-sublayer costs). A ``fallback_k`` above the new K is lowered
    to it."""
    extra = dict(profile.measured.extra) if profile.measured else {}
    if LOOKUP_KEY not in extra:
        raise ProfileError(f"{source}: keeps no lookup record (measured.{LOOKUP_KEY}): it was written before "
                           f"lookup profiles kept one; run optimize again")
    lookup = lookup_from_dict(extra[LOOKUP_KEY], source=source)
    params = dict(profile.method_params)
    if (lookup.min_n, lookup.max_n) != (params.get("min_n", lookup.min_n), params.get("max_n", lookup.max_n)):
        raise ProfileError(f"{source}: measured.{LOOKUP_KEY} was recorded for n {lookup.min_n}..{lookup.max_n}, "
                           f"not the profile's {params.get('min_n')}..{params.get('max_n')}; run optimize again")
    if params.get("fallback") == PRECISION.name:
        rec, cand, pp = _precision_parts(profile, source=source)
        traces, key, fb_source = rec.decoded(), PRECISION_KEY, PRECISION.name
        _check_precision_costs(profile, target, rec, costs_source=costs_source)
        c, note = precision_ratio(target.costs, profile.model.num_layers, cand.draft, pp, source=costs_source,
                                  vocab_size=rec.vocab_size)
    else:
        from skipsearch.costs import check_costs_model

        cand = layer_skip_fallback(profile)
        acc, _ = portable_parts(profile, source=source)
        kept = [t for t in (acc.skip_sets if acc else ()) if cand is not None
                and (t.skip_attn, t.skip_mlp) == (cand.draft.skip_attn, cand.draft.skip_mlp)]
        if cand is None or not kept:
            raise ProfileError(f"{source}: keeps no traces of its layer-skip fallback (measured.{ACCEPTANCE_KEY}"
                               f"{'' if cand else '; a trimmed head is not priced by a cost file'}); run optimize "
                               f"again")
        traces, key, fb_source, note = kept[0].decoded(), ACCEPTANCE_KEY, LAYER_SKIP.name, None
        weights = profile.model.weights_fingerprint
        check_costs_model(target, num_layers=profile.model.num_layers,
                          architecture=acc.architecture or (weights.split("-")[0] if weights else None),
                          fingerprint=profile.model.fingerprint, source=costs_source,
                          what=f"the profile's model ({profile.model.name})")
        c = target.cost_model().draft_ratio(cand.draft)
    if len(traces) != len(lookup.sequences) or any(
            tr.matches and len(tr.matches) != len(seq) + 1 for tr, seq in zip(traces, lookup.positions(), strict=True)):
        raise ProfileError(f"{source}: measured.{key} and measured.{LOOKUP_KEY} were not recorded over the "
                           f"same calibration sequences; run optimize again")
    costs, fallback_k = target.cost_model(), params.get("fallback_k")
    searched = profile.draft.max_draft_tokens
    ks = sorted({k for k in (*LOOKUP_K_VALUES, searched) if 1 <= k <= lookup.max_k})

    def predicted(k: int) -> Measurement:
        fallback = replace(cand.draft, max_draft_tokens=min(fallback_k or k, k))
        return replay_recorded(lookup, k, costs, fallback=fallback, traces=traces, c=c, source=fb_source)

    scored = sorted(((predicted(k), k) for k in ks), key=lambda mk: (-mk[0].speedup, mk[1]))
    options = tuple((replace(profile.draft, max_draft_tokens=k), m) for m, k in scored)
    draft, m = options[0] if options else (None, None)
    k = draft.max_draft_tokens if draft is not None and m.speedup > 1.0 else 0
    ships = replace(profile.draft, max_draft_tokens=k)
    plan = Replanned(ships, m, draft, options, note)
    new, plan = _replanned_profile(profile, target, plan, ships, ships if k else draft, costs_source=costs_source)
    if k and fallback_k is not None and fallback_k > k:
        new = replace(new, method_params=tuple((n, k if n == "fallback_k" else v) for n, v in new.method_params))
    return new, plan


def fractal_scheme(quantization: str, device: str, have: Sequence[str], recorded: str | None = None) -> str:
    """The compressed layers' scheme a fractal draft runs on ``device`` (a cost file's device): ``quantization``
    itself, or for auto what the drafter picks there (int8-dynamic on a CPU; on CUDA bnb-int8 where the cost file
    has it, as the drafter takes it where bitsandbytes is installed, else int8-weight-only). A device named
    neither way takes the ``recorded`` scheme, or the first fractal scheme the cost file has."""
    if quantization != "auto":
        return quantization
    if device.startswith("cpu"):
        return "int8-dynamic"
    if device.startswith("cuda"):
        return "bnb-int8" if "bnb-int8" in have else "int8-weight-only"
    options = [s for s in (recorded, "int8-dynamic", "int8-weight-only", "bnb-int8") if s]
    return next((s for s in options if s in have), options[0])


def compressed_ratio(costs: Costs, num_layers: int, scheme: str, *, source: str) -> float:
    """c_q: a one-token step through fractal's compressed copy in ``scheme`` over one full step, from a cost
    file's ``costs`` (the whole model in the scheme); a ``none`` scheme (the ablation) compresses nothing: 1.
    A cost file without the scheme is one line."""
    if scheme == "none":
        return 1.0
    sc = costs.scheme(scheme)
    if sc is None:
        raise CostsError(f"{source}: no costs for fractal's {scheme} layers: measure them with "
                         f"`skipsearch costs --schemes {scheme}`")
    return max(costs.whole_model_ratio(sc, num_layers), 0.0)


def fractal_pass_ratio(rec: FractalRecord, scheme: str, cq: float, costs: CostModel) -> tuple[float, str]:
    """One fractal draft pass over one full step, and the note on how it is priced (fractal.surrogate):
    v(w + n + 1) · (1 + n · c_q), the n passes through the compressed copy at one-token cost (``cq``,
    ``compressed_ratio``) scaled by the full model's verify of the window."""
    k = rec.drafted
    note = (f"approximation: a fractal pass is priced as v({k}) x (1 + {rec.n} x {cq:.3f}), the {rec.n} passes "
            f"through the {scheme} copy at one-token cost scaled by the full model's v({k})")
    if scheme != rec.scheme:
        note += f"; its acceptance was recorded with {rec.scheme} layers"
    return costs.verify(k) * (1 + rec.n * cq), note


def replay_fractal(rec: FractalRecord, costs: CostModel, c_pass: float) -> Measurement:
    """The fractal draft's cycles replayed from the record by the engine's rules (ngram.replay_cycles); each cycle
    pays one pass (``c_pass`` steps) and v(drafted + 1). Acceptance is the record's (fractal.surrogate: the
    engine's own passes up to float rounding in the committed KV)."""
    from skipsearch.methods.ngram import cycle_measurement, replay_cycles

    cycles = []
    for seq in rec.positions():
        def propose(_seq, t, limit, seq=seq):
            if seq[t - 1] == NO_HIT:
                raise ProfileError(f"the fractal record has no cycle at position {t}, where its replay starts one")
            drafted = min(rec.drafted, limit)
            return FRACTAL.name, drafted, min(seq[t - 1], drafted)
        cycles += replay_cycles((), range(len(seq) + 1), max_new_tokens=rec.max_new_tokens, propose=propose)
    passes = sum(1 for c in cycles if c[1])
    return cycle_measurement(cycles, verify=costs.verify, draft_steps=passes * c_pass, cost_ratio=c_pass)


def _replan_fractal_profile(profile: Profile, target: CostProfile, *, source: str,
                            costs_source: str) -> tuple[Profile, Replanned]:
    """``replan_profile`` for a fractal draft: whether its (n, w) draft pays under ``target``'s costs, from its
    fractal record (acceptance) and its pass priced from the cost file (``fractal_pass_ratio``). K is the
    draft's w + n + 1 or 0: a shorter K would shrink w, another draft, which the record does not cover."""
    from skipsearch.costs import check_costs_model

    extra = dict(profile.measured.extra) if profile.measured else {}
    rec = fractal_from_dict(extra[FRACTAL_KEY], source=source) if FRACTAL_KEY in extra else None
    params = FRACTAL.parse(profile.method_params, draft=profile.draft, num_layers=profile.model.num_layers)
    positions = tuple(params.positions(profile.model.num_layers))
    if rec is not None and (rec.n, rec.w, rec.layers) != (len(positions), params.w, positions):
        raise ProfileError(f"{source}: measured.{FRACTAL_KEY} was recorded for another fractal draft than the "
                           f"profile's (n, w or layers); run optimize again")
    weights = profile.model.weights_fingerprint
    check_costs_model(target, num_layers=profile.model.num_layers,
                      architecture=(rec and rec.architecture) or (weights.split("-")[0] if weights else None),
                      fingerprint=profile.model.fingerprint, source=costs_source,
                      what=f"the profile's model ({profile.model.name})")
    scheme = fractal_scheme(params.quantization, target.device, [s.scheme for s in target.costs.schemes],
                            rec.scheme if rec is not None else None)
    cq = compressed_ratio(target.costs, profile.model.num_layers, scheme, source=costs_source)
    if rec is None:  # after the cost file's checks: a caller may trace the draft on the model next
        raise NoRecordError(f"{source}: keeps no fractal record (measured.{FRACTAL_KEY}): it was written before "
                            f"fractal profiles kept one, or by hand; plan traces its draft on the model "
                            f"(`skipsearch plan --profile`), or run optimize again")
    cm = target.cost_model()
    c, note = fractal_pass_ratio(rec, scheme, cq, cm)
    m = replay_fractal(rec, cm, c)
    best = replace(profile.draft, max_draft_tokens=rec.drafted)
    ships = best if m.speedup > 1.0 else replace(profile.draft, max_draft_tokens=0)
    plan = Replanned(ships, m, best, ((best, m),), note)
    return _replanned_profile(profile, target, plan, ships, best, costs_source=costs_source)


HIER_NOTE = ("α and β are the profile's (teacher-forced on the model: no hardware in them); c, c_s and v(k) the "
             "cost file's; the medium level's verify curve is taken to be the full model's")


def _replan_hierarchical_profile(profile: Profile, target: CostProfile, *, source: str,
                                 costs_source: str) -> tuple[Profile, Replanned]:
    """``replan_profile`` for a hierarchical profile: m and n re-chosen by the planner's closed forms
    (``plan.plan_table``) from the α and β the profile measured and ``target``'s costs for its two levels."""
    from skipsearch.costs import check_costs_model
    from skipsearch.hier_closed_form import PlanInputs, plan_table
    from skipsearch.measure import Measurement

    extra = dict(profile.measured.extra) if profile.measured else {}
    alpha, beta = extra.get("alpha"), extra.get("beta")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1 for x in (alpha, beta)):
        raise ProfileError(f"{source}: keeps no α and β (measured.alpha, measured.beta) in [0, 1]: make it again "
                           f"with skipsearch plan")
    weights = profile.model.weights_fingerprint
    check_costs_model(target, num_layers=profile.model.num_layers,
                      architecture=weights.split("-")[0] if weights else None,
                      fingerprint=profile.model.fingerprint, source=costs_source,
                      what=f"the profile's model ({profile.model.name})")
    old = hierarchy_from_profile(profile)
    cm = target.cost_model()
    c = cm.draft_ratio(old.medium)
    cs = cm.draft_ratio(old.small) / c if c > 0 else 0.0
    table = plan_table(PlanInputs(float(alpha), float(beta), c, cs, verify=tuple(target.costs.verify_ratio)))

    def measured(r) -> Measurement:
        return Measurement("surrogate", r.speedup, predicted_speedup=r.speedup, tau=r.tokens, alpha=float(alpha),
                           cost_ratio=c)

    def draft_of(r) -> DraftConfig:
        return hierarchy_to_profile_fields(Hierarchy(old.medium, old.small, r.m, r.n))[0]

    best_per_n = sorted((max((r for r in table.rows if r.n == n), key=lambda r: r.speedup)
                         for n in sorted({r.n for r in table.rows})), key=lambda r: -r.speedup)
    best = table.best
    chosen = Hierarchy(old.medium, old.small, best.m, best.n)
    draft, params = hierarchy_to_profile_fields(chosen)
    note = (f"m={best.m}, n={best.n} ({'three' if best.n else 'two'} levels; the third level "
            f"{'pays' if table.third_level_pays else 'does not pay'} here"
            + ("" if best.speedup > 1.0 else "; no (m, n) beats plain decoding: decode without a profile")
            + f"); {HIER_NOTE}")
    plan = Replanned(draft, measured(best), draft, tuple((draft_of(r), measured(r)) for r in best_per_n), note)
    new, plan = _replanned_profile(replace(profile, method_params=params), target, plan, draft, draft,
                                   costs_source=costs_source)
    kept = tuple((k, v) for k, v in new.measured.extra if k not in ("c", "cs", "verify_cost_v"))
    redone = (("c", round(c, 4)), ("cs", round(cs, 4)), ("verify_cost_v", [round(v, 3) for v in
                                                                           target.costs.verify_ratio]))
    return replace(new, measured=replace(new.measured, extra=kept + redone)), plan


def _replanned_profile(profile: Profile, target: CostProfile, plan: Replanned, draft: DraftConfig,
                       shown: DraftConfig | None, *, costs_source: str) -> tuple[Profile, Replanned]:
    from skipsearch.methods.summary import config_summary

    m = plan.predicted
    if draft.is_autoregressive:
        verdict = ("no kept draft is predicted to beat plain decoding here: ships max_draft_tokens 0"
                   + (f"; best draft {config_summary(shown)} predicted {m.speedup:.3f}x" if m and shown else ""))
    else:
        verdict = f"ships {config_summary(draft)}: {m.speedup:.3f}x predicted"
    old = profile.measured
    kept = tuple((k, v) for k, v in old.extra if k not in (COSTS_KEY, "before_bench", "timed", "timed_columns"))
    head = {k: v for k, v in (("speedup", old.speedup), ("predicted_speedup", old.predicted_speedup),
                              ("device", old.device), ("source", old.source)) if v is not None}
    ships_draft = not draft.is_autoregressive
    measured = Measured(
        predicted_speedup=m.speedup if m and ships_draft else None, baseline=BASELINE_PREDICTED,
        device=target.device, dataset=old.dataset, n_prompts=old.n_prompts, max_new_tokens=old.max_new_tokens,
        seed=old.seed, source="plan",
        notes=f"{NOT_TIMED}: re-planned for {target.device} ({target.dtype}) from {costs_source}; {verdict}; "
              + (f"{plan.note}; " if plan.note else "") + "time it with skipsearch bench --write-measured",
        extra=kept + ((COSTS_KEY, planned_costs_to_dict(planned_costs_of(target, source=costs_source))),
                      ("predicted", {"speedup": round(m.speedup, 4), "tau": round(m.tau or 0, 4),
                                     "cost_c": round(m.cost_ratio or 0, 4)} if m else None),
                      ("replanned_from", head or None)),
    )
    measured = replace(measured, extra=tuple((k, v) for k, v in measured.extra if v is not None))
    # the profile is for the target now: its dtype is the one decode picks on a GPU
    return replace(profile, model=replace(profile.model, dtype=target.dtype), draft=draft,
                   measured=measured), plan


def own_costs(profile: Profile, *, source: str) -> CostProfile:
    """The cost profile a profile was planned with (``measured.costs``), to re-plan it for its own device."""
    from skipsearch.costs import CostModelRef

    rec, planned = portable_parts(profile, source=source)
    if planned is None:
        raise ProfileError(f"{source}: keeps no cost profile (measured.costs): give --costs")
    return CostProfile(CostModelRef(profile.model.name, profile.model.num_layers, rec.architecture if rec else None),
                       planned.device or "unknown", planned.dtype or profile.model.dtype, planned.costs,
                       roofline=planned.roofline)  # modelled costs stay marked as modelled


def replan_to_dict(new: Profile, plan: Replanned) -> dict:
    def row(config: DraftConfig, m: Measurement) -> dict:
        return {"skip_attn": list(config.skip_attn), "skip_mlp": list(config.skip_mlp),
                "max_draft_tokens": config.max_draft_tokens, "exit": asdict(config.exit),
                "predicted_speedup": m.speedup, "tau": m.tau, "cost_c": m.cost_ratio}

    out = {"ships": row(new.draft, plan.predicted) if not new.draft.is_autoregressive else "plain decoding",
           "options": [row(c, m) for c, m in plan.options], "notes": new.measured.notes}
    if plan.note:
        out["approximation"] = plan.note
    return out


def format_replan(old: Profile, new: Profile, plan: Replanned, target: CostProfile) -> str:
    """For people: what the profile shipped, what each option it kept (a skip set, a K) is predicted to do under
    ``target``."""
    from skipsearch.methods.summary import config_summary

    before = old.measured.speedup or old.measured.predicted_speedup if old.measured else None
    ks = ", ".join(str(c.max_draft_tokens) for c, _ in plan.options)
    if old.method == PRECISION.name:
        source = f"its precision draft's traces ({old.candidate.param('scheme', '?')}), K of {ks}"
    elif old.method in LOOKUP_METHODS and PRECISION_KEY in dict(old.measured.extra if old.measured else ()):
        source = f"its lookup record and its precision fallback's traces, K of {ks}"
    elif old.method in LOOKUP_METHODS:
        source = "its lookup record, K of " + ks
    elif old.method == HIERARCHICAL.name:
        source = "its α and β, the best m per n (K = m·(n+1)): " + ks
    elif old.method == FRACTAL.name:
        source = f"its fractal record (n, w fixed: K = w + n + 1 = {ks}; c: one draft pass over one step)"
    elif old.method == CLASP_DYNAMIC.name:
        source = "the traces of its starting skip set"
    else:
        source = f"{len(plan.options)} kept skip set(s)"
    column = "the draft" if old.method == FRACTAL.name else "best K and exit rule for the kept skip set"
    lines = [f"re-planned for {target.device} ({target.dtype}) from {source}",
             f"was:   {config_summary(old.draft)}" + (f" ({before:.3f}x on {old.measured.device})" if before else ""),
             "", f"| predicted | τ | c | {column} |", "|---:|---:|---:|---|"]
    lines += [f"| {m.speedup:.3f}x | {m.tau or 0:.2f} | {m.cost_ratio or 0:.3f} | {config_summary(c)} |"
              for c, m in plan.options]
    lines += ["", f"note: {plan.note}"] if plan.note else []
    return "\n".join([*lines, "", f"ships: {config_summary(new.draft)}", new.measured.notes or ""])


# -- re-ranking a study ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankRow:
    config: DraftConfig
    predicted: Measurement  # under the other costs
    trial: int | None  # the study trial that evaluated it; None: K and exit re-planned for a shortlisted skip set
    study_predicted: float | None = None  # the study's own surrogate figure (its machine's costs)
    study_timed: float | None = None  # the study's timed speedup, where it timed this config
    timed: Measurement | None = None  # timed here (--time-shortlist)


def rerank(records: Sequence[TrialRecord], traced: dict[tuple, Sequence[Trace]], costs: CostModel, *,
           replan_top: int = 0, k_values: Sequence[int] = K_VALUES) -> tuple[RankRow, ...]:
    """Every layer-skip config the study evaluated, predicted under ``costs`` from its skip set's traces, best
    first; plus, for the best ``replan_top`` skip sets, their K and exit rule re-planned for ``costs``."""
    seen: dict[DraftConfig, dict] = {}
    for r in records:
        if r.candidate is None or r.measurement is None or r.candidate.method != LAYER_SKIP.name or r.config is None:
            continue
        if r.config.is_autoregressive or (r.config.skip_attn, r.config.skip_mlp) not in traced:
            continue
        row = seen.setdefault(r.config, {"trial": r.number})
        m = r.measurement
        if m.kind == "timed":
            row["study_timed"] = m.speedup
            row.setdefault("study_predicted", m.predicted_speedup)
        else:
            row["study_predicted"] = m.speedup
    rows = [RankRow(c, predict(traced[(c.skip_attn, c.skip_mlp)], c, costs), **info) for c, info in seen.items()]
    rows.sort(key=lambda r: (-r.predicted.speedup, r.trial))
    skips = list(dict.fromkeys((r.config.skip_attn, r.config.skip_mlp) for r in rows))[:replan_top]
    for skip in skips:
        config, m = replan_skip_set(traced[skip], skip, costs, k_values=k_values)
        if config not in seen:
            rows.append(RankRow(config, m, None))
    rows.sort(key=lambda r: (-r.predicted.speedup, r.trial is None, r.trial or 0))
    return tuple(rows)


def layer_skip_configs(records: Sequence[TrialRecord]) -> list[DraftConfig]:
    return [r.config for r in records if r.candidate is not None and r.candidate.method == LAYER_SKIP.name
            and r.measurement is not None and r.config is not None and not r.config.is_autoregressive]


def time_rows(sm: SkippableModel, cal: Calibration, rows: Sequence[RankRow], *, repeats: int = 1,
              on_row: Callable[[RankRow], None] | None = None) -> tuple[RankRow, ...]:
    """Time each row's config against plain decoding through the one harness (objective.time_drafter). The
    fastest, if it beat plain decoding, is timed once more and keeps the lower figure: as optimize does, a
    speedup that does not hold up is not shipped."""
    from skipsearch.decoding import make_drafter
    from skipsearch.methods.summary import config_summary
    from skipsearch.objective import time_drafter

    def timed(row: RankRow) -> Measurement:
        m, _ = time_drafter(sm, cal.prompts, lambda _p, c=row.config: make_drafter(c),
                            max_new_tokens=cal.max_new_tokens, repeats=repeats, label=config_summary(row.config))
        return replace(m, predicted_speedup=row.predicted.speedup)

    out = []
    for row in rows:
        out.append(replace(row, timed=timed(row)))
        if on_row:
            on_row(out[-1])
    top = max(range(len(out)), key=lambda i: out[i].timed.speedup, default=None)
    if top is not None and out[top].timed.speedup > 1.0:
        out[top] = replace(out[top], timed=min(out[top].timed, timed(out[top]), key=lambda m: m.speedup))
    return tuple(out)


@dataclass(frozen=True)
class Reranking:
    rows: tuple[RankRow, ...]  # best first under the other costs
    record: AcceptanceRecord  # the traces of the shortlisted skip sets: what the written profile keeps
    skipped: int  # evaluated trials that cannot be replayed (other methods, plain decoding)
    costs_source: str


def rerank_study(sm: SkippableModel, cal: Calibration, records: Sequence[TrialRecord], target: CostProfile, *,
                 costs_source: str, shortlist: int = 5, workload: str | None = None,
                 on_progress: Callable[[int, int], None] | None = None) -> Reranking:
    """Re-rank a study's evaluated layer-skip configs under ``target``'s costs, with no new trials: each distinct
    skip set is traced once on ``sm`` (calibration ``cal``), every config is replayed, and the best ``shortlist``
    skip sets also get their K and exit rule re-planned."""
    from skipsearch.costs import architecture_of, check_costs_for

    check_costs_for(target, sm, source=costs_source)
    configs = layer_skip_configs(records)
    if not configs:
        raise ConfigError("the study has no evaluated layer-skip config to re-rank")
    traced = trace_skip_sets(sm, cal, configs, on_progress=on_progress)
    rows = rerank(records, traced, target.cost_model(), replan_top=shortlist)
    keys = list(dict.fromkeys((r.config.skip_attn, r.config.skip_mlp) for r in rows))[:min(shortlist, MAX_KEPT)]
    record = record_acceptance({k: traced[k] for k in keys}, workload=workload, architecture=architecture_of(sm))
    skipped = sum(r.measurement is not None for r in records) - len(configs)  # configs: one per replayable trial
    return Reranking(rows, record, skipped, costs_source)


def reranked_profile(sm: SkippableModel, rr: Reranking, target: CostProfile, *, study: str, dataset: str | None,
                     n_prompts: int | None, max_new_tokens: int | None, seed: int | None) -> tuple[Profile, str]:
    """The profile to ship after a re-rank, and one sentence saying why: the best *timed* row if any row was
    timed here and beat plain decoding; else the best predicted row, predicted, not timed; never a loss."""
    from skipsearch.methods.summary import config_summary
    from skipsearch.profile import Environment, ModelRef, SearchInfo

    timed = sorted((r for r in rr.rows if r.timed is not None), key=lambda r: -r.timed.speedup)
    top = timed[0] if timed else rr.rows[0]
    figure = top.timed if timed else top.predicted
    word = "measured here" if timed else "predicted, not timed"
    pays = figure.speedup > 1.0
    verdict = (f"ships {config_summary(top.config)}: {figure.speedup:.3f}x {word}" if pays else
               f"no re-ranked draft beats plain decoding on {target.device}: ships max_draft_tokens 0; best draft "
               f"{config_summary(top.config)}: {figure.speedup:.3f}x {word}")
    extra = ((ACCEPTANCE_KEY, acceptance_to_dict(rr.record)),
             (COSTS_KEY, planned_costs_to_dict(planned_costs_of(target, source=rr.costs_source))),
             ("reranked", [[config_summary(r.config), round(r.predicted.speedup, 4), r.study_timed and
                            round(r.study_timed, 4), r.timed and round(r.timed.speedup, 4)] for r in rr.rows[:10]]),
             ("reranked_columns", ["candidate", "predicted here", "timed in the study", "timed here"]))
    common = dict(device=target.device, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                  seed=seed, source="optimize --budget 0 (re-ranked)", extra=extra)
    if not pays:
        measured = Measured(notes=verdict, **common)
    elif timed:
        m = top.timed
        measured = Measured(speedup=m.speedup, tokens_per_s=m.tokens_per_s,
                            baseline_tokens_per_s=m.baseline_tokens_per_s, tau=m.tau, acceptance_rate=m.acceptance_rate,
                            predicted_speedup=top.predicted.speedup,
                            baseline=BASELINE_OURS_AR, notes=verdict, **common)
    else:
        measured = Measured(predicted_speedup=top.predicted.speedup, baseline=BASELINE_PREDICTED,
                            notes=f"{NOT_TIMED}: {verdict}; time it with skipsearch bench --write-measured", **common)
    profile = Profile(
        model=ModelRef.of(sm), method=LAYER_SKIP.name, draft=top.config if pays else AUTOREGRESSIVE, measured=measured,
        environment=Environment.current(str(sm.device), placement=getattr(sm, "placement", None)),
        search=SearchInfo(strategy="rerank", budget=0, study=study,
                          objective=f"surrogate replay under {rr.costs_source}" + (" + timed" if timed else ""),
                          seed=seed),
    )
    return profile, verdict


__all__ = ["EXIT_RULES", "K_VALUES", "NoRecordError", "RankRow", "Replanned", "Reranking", "keep_portable",
           "layer_skip_configs", "own_costs", "portable_parts", "precision_draft", "precision_ratio", "predict",
           "record_acceptance", "record_lookup", "record_on_model", "record_precision", "replan_lookup",
           "replan_profile", "replan_record", "replan_skip_set", "replay_lookup", "replay_recorded", "rerank",
           "rerank_study", "reranked_profile", "time_rows", "trace_skip_sets"]
