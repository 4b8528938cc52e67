"""A study's record: what every trial keeps in its user attrs (its candidate, its measurement, any error) as JSON,
and how it is read back (``TrialRecord``, the best, the shortlist, the table ``study show`` prints)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import optuna

from skipsearch.config import Candidate, DraftConfig, ExitRule
from skipsearch.files.errors import StudyError  # noqa: F401  (re-exported: the study's error, defined light)
from skipsearch.measure import Kind, Measurement

_STATES = optuna.trial.TrialState
STRATEGY_ATTR, SPACE_ATTR, SEED_ATTR = "strategy", "space", "seed"  # study user attrs
SEEDED_ATTR = "seeded"  # study user attr: the strategy's seed points are enqueued
CONFIG_ATTR, MEASUREMENT_ATTR, ERROR_ATTR, REUSED_ATTR = "config", "measurement", "error", "reused_from"  # trial's
EVALUATING_ATTR = "evaluating"  # trial's: set when a shared study's trial starts measuring its config
KIND_ATTR = "kind"  # trial's: "surrogate" or "timed", set before evaluation so other workers see it
METHOD_ATTR, PARAMS_ATTR = "method", "params"  # trial's: the candidate's method and method params
WORKER_ATTR = "worker"  # trial's: "host:pid" of the process that runs it
MACHINE_ATTR = "machine"  # a timed trial's: the machine that timed it (hardware.machine_key)
MODEL_ATTR = "model"  # study's: {name, num_layers, fingerprint} of the model the search ran on
# in MODEL_ATTR: the target's precision (model/target.py) where it is not the native one
PRECISION_KEY = "target_precision"


@dataclass(frozen=True)
class TrialRecord:
    number: int
    state: str  # Optuna's state name: COMPLETE, FAIL, RUNNING, ...
    candidate: Candidate | None  # None when the trial failed before it had one
    measurement: Measurement | None
    error: str | None  # one line, for FAIL trials
    machine: str | None = None  # a timed trial's: the machine that timed it (None: a study from before it was kept)

    @property
    def config(self) -> DraftConfig | None:
        """The candidate's draft config (skip sets, K, exit rule)."""
        return self.candidate.draft if self.candidate is not None else None


@dataclass(frozen=True)
class SearchSummary:
    trials_total: int  # in the study, every worker's included
    trials_run_here: int  # by this call
    failed: int  # by this call
    best: TrialRecord | None
    seconds: float
    conflicts: tuple[str, ...] = ()  # storage conflicts this call survived, one line each (see ``finish_trial``)


# -- (de)serialisation of what a trial records ---------------------------------------------------


def config_to_dict(config: DraftConfig) -> dict:
    return {"skip_attn": list(config.skip_attn), "skip_mlp": list(config.skip_mlp),
            "max_draft_tokens": config.max_draft_tokens, "exit": asdict(config.exit)}


def config_from_dict(raw: dict) -> DraftConfig:
    return DraftConfig(skip_attn=tuple(raw["skip_attn"]), skip_mlp=tuple(raw["skip_mlp"]),
                       max_draft_tokens=raw["max_draft_tokens"], exit=ExitRule(**raw["exit"]))


def candidate_attrs(candidate: Candidate) -> dict:
    """The user attrs a trial records its candidate in (JSON: every storage keeps them)."""
    return {CONFIG_ATTR: config_to_dict(candidate.draft), METHOD_ATTR: candidate.method,
            PARAMS_ATTR: candidate.plain_params()}


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# -- reading the record ---------------------------------------------------------------------------


def trial_candidate(t: optuna.trial.FrozenTrial) -> Candidate | None:
    """The candidate a trial evaluated (or is evaluating); None before it had one.

    Studies made before methods were recorded hold layer-skip configs only: their trials have no method."""
    raw = t.user_attrs.get(CONFIG_ATTR)
    if raw is None:
        return None
    from skipsearch.methods import PLAIN  # the method of old studies' trials

    return Candidate(t.user_attrs.get(METHOD_ATTR, PLAIN), config_from_dict(raw),
                     t.user_attrs.get(PARAMS_ATTR) or ())


LOST = "lost: its worker stopped sending heartbeats"


def trial_record(t: optuna.trial.FrozenTrial) -> TrialRecord:
    measurement = t.user_attrs.get(MEASUREMENT_ATTR)
    error = t.user_attrs.get(ERROR_ATTR)
    if t.state == _STATES.FAIL and error is None:
        # skipsearch records an error before it fails a trial; only Optuna's stale-heartbeat check, for a
        # worker that was killed, fails one without (its attrs are frozen by then).
        error = LOST
    return TrialRecord(number=t.number, state=t.state.name, candidate=trial_candidate(t),
                       measurement=Measurement.from_dict(measurement) if measurement is not None else None,
                       error=error, machine=t.user_attrs.get(MACHINE_ATTR))


def records(study: optuna.Study) -> list[TrialRecord]:
    """Every trial that has started, in order (enqueued ones still waiting are left out)."""
    return [trial_record(t) for t in study.get_trials(deepcopy=False) if t.state != _STATES.WAITING]


STUDY_COLUMNS = ("#", "kind", "speedup", "predicted", "tau", "accept", "candidate")


def study_table(recs: list[TrialRecord], *, top: int = 10) -> list[tuple[str, ...]]:
    """What ``skipsearch study show`` lists (STUDY_COLUMNS): the ``top`` measured trials, timed ones first, best
    first, each as one row of text. A candidate is shown whole, method and parameters with its draft config:
    an ngram trial is ``ngram min_n=1 max_n=3 K=4``, not the layer-skip config it carries."""
    from skipsearch.methods.summary import candidate_summary

    done = [r for r in recs if r.measurement is not None]
    rows = []
    for r in sorted(done, key=lambda r: (r.measurement.kind != "timed", -r.measurement.speedup))[:top]:
        m = r.measurement
        rows.append((str(r.number), m.kind, f"{m.speedup:.3f}x", f"{m.predicted_speedup or 0:.3f}x",
                     f"{m.tau or 0:.2f}", "-" if m.acceptance_rate is None else f"{m.acceptance_rate:.2f}",
                     candidate_summary(r.candidate) if r.candidate is not None else "-"))
    return rows


def _ranked(study: optuna.Study, kind: str, machine: str | None = None) -> Iterator[TrialRecord]:
    """The completed trials measured as ``kind`` (timed: on ``machine``, if given), best first. Ranked on the stored
    attrs and made into records one by one as they are read: a search asks for its best after every trial, and the
    study holds hundreds."""
    done = []
    for t in study.get_trials(deepcopy=False, states=(_STATES.COMPLETE,)):
        raw = t.user_attrs.get(MEASUREMENT_ATTR)
        if not isinstance(raw, dict) or raw.get("kind") != kind:
            continue
        if machine is not None and kind == "timed" and t.user_attrs.get(MACHINE_ATTR) != machine:
            continue
        done.append((-raw["speedup"], t.number, t))
    done.sort(key=lambda x: x[:2])
    for *_, t in done:
        r = trial_record(t)
        if r.config is not None:
            yield r


def shortlist(study: optuna.Study, n: int, *, kind: Kind = "surrogate") -> list[Candidate]:
    """The best ``n`` distinct candidates measured as ``kind``, best first."""
    out: list[Candidate] = []
    for r in _ranked(study, kind):
        if len(out) >= n:
            break
        if r.candidate not in out:
            out.append(r.candidate)
    return out


def best(study: optuna.Study, *, prefer: Kind = "timed", machine: str | None = None) -> TrialRecord | None:
    """The best trial of the preferred kind, else the best of the other: a timed speedup is a
    measurement, a surrogate one a prediction, so one timed trial outranks any surrogate. With ``machine``
    (``hardware.machine_key``), only that machine's timings count: another's are left out, not ranked."""
    for kind in (prefer, "surrogate" if prefer == "timed" else "timed"):
        top = next(_ranked(study, kind, machine), None)
        if top is not None:
            return top
    return None
