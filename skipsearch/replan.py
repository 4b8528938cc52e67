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

This module imports torch only inside the functions that trace or replay: profile.py validates the
acceptance record with it on every load.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from skipsearch.config import AUTOREGRESSIVE, NO_EXIT, Candidate, ConfigError, DraftConfig, ExitRule
from skipsearch.costs import (
    COSTS_KEY,
    CostProfile,
    PlannedCosts,
    costs_from_model,
    planned_costs_from_dict,
    planned_costs_of,
    planned_costs_to_dict,
)
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.profile import Measured, Profile, ProfileError, _mapping

if TYPE_CHECKING:
    from skipsearch.measure import Measurement
    from skipsearch.models import SkippableModel
    from skipsearch.objective import Calibration, CostModel, Trace
    from skipsearch.study import TrialRecord

ENCODING = "b64-u8"  # one byte per position: 128 if the draft's argmax matched, + round(127 · its top probability)
ACCEPTANCE_KEY = "acceptance"  # measured.<key> of a profile (schema v2), beside costs.COSTS_KEY
K_VALUES = (1, 2, 3, 4, 6, 8)  # SearchSpace's default choices of K
# the exit rules re-planning tries: none, and a fixed or adaptive threshold γ0 = 0.1 .. 0.9 (replays are cheap)
EXIT_RULES = (NO_EXIT, *(ExitRule(threshold=t / 10, adaptive=a) for a in (True, False) for t in range(1, 10)))
MAX_KEPT = 8  # skip sets a profile keeps the traces of
NOT_TIMED = "predicted, not timed"  # measured.notes of a re-planned profile starts with this


# -- the acceptance record ---------------------------------------------------------------------------------
def encode_trace(tr: Trace) -> str:
    data = bytes((128 if m else 0) | round(127 * min(max(c, 0.0), 1.0)) for m, c in zip(tr.matches, tr.confidences,
                                                                                         strict=True))
    return base64.b64encode(data).decode("ascii")


def decode_trace(text: str) -> Trace:
    from skipsearch.objective import Trace

    data = base64.b64decode(text, validate=True)
    return Trace(tuple(b >= 128 for b in data), tuple((b & 127) / 127 for b in data))


@dataclass(frozen=True)
class SkipSetTraces:
    """One skip set's traces: what acceptance it gets on each calibration sequence."""

    skip_attn: tuple[int, ...]
    skip_mlp: tuple[int, ...]
    traces: tuple[str, ...]  # encoded (ENCODING), one per calibration sequence

    def decoded(self) -> tuple[Trace, ...]:
        return tuple(decode_trace(t) for t in self.traces)

    def acceptance_curve(self, k: int = 8) -> tuple[float, ...]:
        """α by draft position, for people: P(the first i drafts of a block all match), i = 1..k, over
        every start position (no exit rule)."""
        bits = [tuple(b >= 128 for b in base64.b64decode(t)) for t in self.traces]
        out = []
        for i in range(1, k + 1):
            runs = [all(seq[t:t + i]) for seq in bits for t in range(len(seq) - i + 1)]
            out.append(round(sum(runs) / len(runs), 4) if runs else 0.0)
        return tuple(out)


@dataclass(frozen=True)
class AcceptanceRecord:
    skip_sets: tuple[SkipSetTraces, ...]
    workload: str | None = None  # the calibration set, for people: "mtbench (calib split), 8 prompts x 64 tokens"
    architecture: str | None = None  # costs.architecture_of the traced model: a cost file must match it


def acceptance_to_dict(rec: AcceptanceRecord) -> dict:
    out: dict[str, Any] = {"encoding": ENCODING}
    out.update({k: v for k, v in (("workload", rec.workload), ("architecture", rec.architecture)) if v})
    out["skip_sets"] = [{"skip_attn": list(s.skip_attn), "skip_mlp": list(s.skip_mlp),
                         "alpha_by_position": list(s.acceptance_curve()), "traces": list(s.traces)}
                        for s in rec.skip_sets]
    return out


def acceptance_from_dict(raw: Any, *, source: str = "<profile>") -> AcceptanceRecord:
    """Validate ``measured.acceptance``; every problem is one ProfileError line."""
    path = f"measured.{ACCEPTANCE_KEY}"
    raw = _mapping(raw, path, source)
    if raw.get("encoding") != ENCODING:
        raise ProfileError(f"{source}: {path}.encoding must be {ENCODING!r}, got {str(raw.get('encoding'))[:40]!r}")
    items = raw.get("skip_sets")
    if not isinstance(items, list) or not items:
        raise ProfileError(f"{source}: {path}.skip_sets must list the kept skip sets and their traces")
    sets = []
    for i, item in enumerate(items):
        where = f"{path}.skip_sets[{i}]"
        item = _mapping(item, where, source)
        unknown = set(item) - {"skip_attn", "skip_mlp", "alpha_by_position", "traces"}
        if unknown:
            raise ProfileError(f"{source}: unknown key {where}.{sorted(unknown)[0][:40]}")
        traces = item.get("traces")
        if not isinstance(traces, list) or not traces or not all(isinstance(t, str) for t in traces):
            raise ProfileError(f"{source}: {where}.traces must list one encoded trace per calibration sequence")
        try:
            draft = DraftConfig(tuple(item.get("skip_attn") or ()), tuple(item.get("skip_mlp") or ()))
            for t in traces:
                base64.b64decode(t, validate=True)
        except (ConfigError, TypeError) as e:
            raise ProfileError(f"{source}: {where}: {e}") from None
        except (binascii.Error, ValueError):
            raise ProfileError(f"{source}: {where}.traces holds a string that is not base64") from None
        sets.append(SkipSetTraces(draft.skip_attn, draft.skip_mlp, tuple(traces)))
    workload, arch = raw.get("workload"), raw.get("architecture")
    for key, value in (("workload", workload), ("architecture", arch)):
        if value is not None and not isinstance(value, str):
            raise ProfileError(f"{source}: {path}.{key} must be a string")
    return AcceptanceRecord(tuple(sets), workload, arch)


def check_measured_extra(extra: Sequence[tuple[str, Any]], *, source: str) -> None:
    """profile.py's hook: validate the two keys this module owns in ``measured``."""
    for key, value in extra:
        if key == ACCEPTANCE_KEY:
            acceptance_from_dict(value, source=source)
        elif key == COSTS_KEY:
            planned_costs_from_dict(value, source=source)


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
    from skipsearch.objective import full_cache, trace

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


def keep_portable(profile: Profile, objective: Any, candidates: Sequence[Candidate], *,
                  workload: str | None = None) -> Profile:
    """``profile`` with what re-planning needs in ``measured``: the traces of the distinct layer-skip skip sets
    among ``candidates`` (the shortlist, best first; at most MAX_KEPT) and the cost model the search measured.
    ``objective`` is optimize's ModelObjective; its calibration is re-traced here (one forward per sequence)."""
    from skipsearch.costs import architecture_of

    drafts = [c.draft for c in candidates if c.method == LAYER_SKIP.name and not c.is_autoregressive]
    keys = list(dict.fromkeys((d.skip_attn, d.skip_mlp) for d in drafts))[:MAX_KEPT]
    costs = objective.measured_costs
    if profile.measured is None or (not keys and costs is None):
        return profile
    sm, cal = objective.sm, objective.cal
    extra = []
    if keys:
        traced = trace_skip_sets(sm, cal, [DraftConfig(a, m) for a, m in keys])
        shown = workload or f"{len(cal.prompts)} prompts x {cal.max_new_tokens} tokens"
        extra.append((ACCEPTANCE_KEY, acceptance_to_dict(record_acceptance(traced, workload=shown,
                                                                           architecture=architecture_of(sm)))))
    if costs is not None:
        import torch

        planned = PlannedCosts(costs_from_model(costs), str(sm.device), sm.dtype_name, "measured by optimize",
                               torch.get_num_threads())
        extra.append((COSTS_KEY, planned_costs_to_dict(planned)))
    kept = tuple((k, v) for k, v in profile.measured.extra if k not in (ACCEPTANCE_KEY, COSTS_KEY))
    return replace(profile, measured=replace(profile.measured, extra=kept + tuple(extra)))


# -- predicting and re-planning (no model) -------------------------------------------------------------------
def predict(traces: Sequence[Trace], config: DraftConfig, costs: CostModel) -> Measurement:
    from skipsearch.objective import replay_all

    return replay_all(traces, config, costs)


def replan_skip_set(traces: Sequence[Trace], skip: tuple, costs: CostModel, *, k_values: Sequence[int] = K_VALUES,
                    exit_rules: Sequence[ExitRule] = EXIT_RULES,
                    also: Sequence[DraftConfig] = ()) -> tuple[DraftConfig, Measurement]:
    """The K and exit rule that the replay predicts fastest for this skip set under ``costs``, of the grid and
    ``also`` (e.g. the config as searched). Ties go to the smaller K, then to the earlier exit rule."""
    configs = [DraftConfig(skip[0], skip[1], k, e) for k in sorted(k_values) for e in exit_rules]
    configs += [c for c in also if (c.skip_attn, c.skip_mlp) == tuple(skip) and c not in configs]
    scored = [(predict(traces, c, costs), c) for c in configs]
    best = max(scored, key=lambda mc: mc[0].speedup)  # max keeps the first of equals
    return best[1], best[0]


@dataclass(frozen=True)
class Replanned:
    draft: DraftConfig  # what ships: the best draft, or plain decoding when no draft is predicted to pay
    predicted: Measurement | None  # of the best draft (even when plain decoding ships)
    best_draft: DraftConfig | None
    options: tuple[tuple[DraftConfig, Measurement], ...]  # the best per kept skip set, best first


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
    from skipsearch.optimize import config_summary

    if profile.method != LAYER_SKIP.name:
        raise ConfigError(f"{source}: re-planning needs a layer-skip profile's traces; this one is "
                          f"method {profile.method} (plan it again on the device instead)")
    rec, _ = portable_parts(profile, source=source)
    if rec is None:
        raise ProfileError(f"{source}: keeps no acceptance record (measured.acceptance): it was written before "
                           f"profiles kept one; run optimize again, or optimize --study S --costs ... --budget 0")
    weights = profile.model.weights_fingerprint
    check_costs_model(target, num_layers=profile.model.num_layers,
                      architecture=rec.architecture or (weights.split("-")[0] if weights else None),
                      fingerprint=profile.model.fingerprint, source=costs_source,
                      what=f"the profile's model ({profile.model.name})")
    plan = replan_record(rec, target.cost_model(), k_values=k_values, also=(profile.draft,))
    m = plan.predicted
    if plan.draft.is_autoregressive:
        verdict = ("no kept draft is predicted to beat plain decoding here: ships max_draft_tokens 0"
                   + (f"; best draft {config_summary(plan.best_draft)} predicted {m.speedup:.3f}x" if m else ""))
    else:
        verdict = f"ships {config_summary(plan.draft)}: {m.speedup:.3f}x predicted"
    old = profile.measured
    kept = tuple((k, v) for k, v in old.extra if k not in (COSTS_KEY, "before_bench", "timed", "timed_columns"))
    head = {k: v for k, v in (("speedup", old.speedup), ("predicted_speedup", old.predicted_speedup),
                              ("device", old.device), ("source", old.source)) if v is not None}
    ships_draft = not plan.draft.is_autoregressive
    measured = Measured(
        predicted_speedup=m.speedup if m and ships_draft else None, baseline="cost-model prediction (not timed)",
        device=target.device, dataset=old.dataset, n_prompts=old.n_prompts, max_new_tokens=old.max_new_tokens,
        seed=old.seed, source="plan",
        notes=f"{NOT_TIMED}: re-planned for {target.device} ({target.dtype}) from {costs_source}; {verdict}; "
              f"time it with skipsearch bench --write-measured",
        extra=kept + ((COSTS_KEY, planned_costs_to_dict(planned_costs_of(target, source=costs_source))),
                      ("predicted", {"speedup": round(m.speedup, 4), "tau": round(m.tau or 0, 4),
                                     "cost_c": round(m.cost_ratio or 0, 4)} if m else None),
                      ("replanned_from", head or None)),
    )
    measured = replace(measured, extra=tuple((k, v) for k, v in measured.extra if v is not None))
    # the profile is for the target now: its dtype is the one decode picks on a GPU
    return replace(profile, model=replace(profile.model, dtype=target.dtype), draft=plan.draft,
                   measured=measured), plan


def own_costs(profile: Profile, *, source: str) -> CostProfile:
    """The cost profile a profile was planned with (``measured.costs``), to re-plan it for its own device."""
    from skipsearch.costs import CostModelRef

    rec, planned = portable_parts(profile, source=source)
    if planned is None:
        raise ProfileError(f"{source}: keeps no cost profile (measured.costs): give --costs")
    return CostProfile(CostModelRef(profile.model.name, profile.model.num_layers, rec.architecture if rec else None),
                       planned.device or "unknown", planned.dtype or profile.model.dtype, planned.costs)


def replan_to_dict(new: Profile, plan: Replanned) -> dict:
    def row(config: DraftConfig, m: Measurement) -> dict:
        return {"skip_attn": list(config.skip_attn), "skip_mlp": list(config.skip_mlp),
                "max_draft_tokens": config.max_draft_tokens, "exit": asdict(config.exit),
                "predicted_speedup": m.speedup, "tau": m.tau, "cost_c": m.cost_ratio}

    return {"ships": row(new.draft, plan.predicted) if not new.draft.is_autoregressive else "plain decoding",
            "options": [row(c, m) for c, m in plan.options], "notes": new.measured.notes}


def format_replan(old: Profile, new: Profile, plan: Replanned, target: CostProfile) -> str:
    """For people: what the profile shipped, what each kept skip set is predicted to do under ``target``."""
    from skipsearch.optimize import config_summary

    before = old.measured.speedup or old.measured.predicted_speedup if old.measured else None
    lines = [f"re-planned for {target.device} ({target.dtype}) from {len(plan.options)} kept skip set(s)",
             f"was:   {config_summary(old.draft)}" + (f" ({before:.3f}x on {old.measured.device})" if before else ""),
             "", "| predicted | τ | c | best K and exit rule for the kept skip set |", "|---:|---:|---:|---|"]
    lines += [f"| {m.speedup:.3f}x | {m.tau or 0:.2f} | {m.cost_ratio or 0:.3f} | {config_summary(c)} |"
              for c, m in plan.options]
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
    from skipsearch.objective import time_drafter
    from skipsearch.optimize import config_summary

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
    from skipsearch.optimize import config_summary
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
                            baseline="skipsearch autoregressive, same process, interleaved", notes=verdict, **common)
    else:
        measured = Measured(predicted_speedup=top.predicted.speedup, baseline="cost-model prediction (not timed)",
                            notes=f"{NOT_TIMED}: {verdict}; time it with skipsearch bench --write-measured", **common)
    profile = Profile(
        model=ModelRef.of(sm), method=LAYER_SKIP.name, draft=top.config if pays else AUTOREGRESSIVE, measured=measured,
        environment=Environment.current(str(sm.device), placement=getattr(sm, "placement", None)),
        search=SearchInfo(strategy="rerank", budget=0, study=study,
                          objective=f"surrogate replay under {rr.costs_source}" + (" + timed" if timed else ""),
                          seed=seed),
    )
    return profile, verdict


__all__ = ["ENCODING", "EXIT_RULES", "K_VALUES", "AcceptanceRecord", "PlannedCosts", "RankRow", "Replanned",
           "Reranking", "SkipSetTraces", "acceptance_from_dict", "acceptance_to_dict", "check_measured_extra",
           "decode_trace", "encode_trace", "keep_portable", "layer_skip_configs", "planned_costs_from_dict", "predict",
           "record_acceptance", "replan_profile", "replan_record", "replan_skip_set", "rerank",
           "rerank_study", "reranked_profile", "time_rows", "trace_skip_sets"]
