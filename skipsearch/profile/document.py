"""The draft profile as a document: its parts, reading (validated through the method registry), writing, and the
checks that it fits a model.

People write and read these by hand and share them between teams, so the keys are a contract:
every load validates everything, and every error is one line naming the file and the key.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from skipsearch import methods
from skipsearch.config import Candidate, ConfigError, DraftConfig
from skipsearch.files import bounds
from skipsearch.files.costs import COSTS_KEY, planned_costs_from_dict
from skipsearch.files.engine_runs import ENGINES_KEY, EngineRun, engine_run_to_dict, engine_runs_from_dict
from skipsearch.files.errors import ProfileError
from skipsearch.files.schedule import Schedule, schedule_from_dict, schedule_to_dict
from skipsearch.files.targets import PROFILE, PROFILE_HEADER, check_target, misplaced
from skipsearch.files.yamlio import MAX_BYTES, build, coerce, read_yaml, section, write_atomic
from skipsearch.files.yamlio import Dumper as _Dumper
from skipsearch.files.yamlio import plain as _plain
from skipsearch.files.yamlio import short as _short
from skipsearch.hardware import Environment
from skipsearch.model.target import NATIVE, PRECISIONS
from skipsearch.profile.schema import BASELINES, SCHEMA_VERSION, _err, _mapping, upgrade

_TOP_KEYS = ("schema_version", "model", "method", "draft", "kernel", "schedule", "measured", "environment", "search",
             "method_params")


@dataclass(frozen=True)
class ModelRef:
    name: str
    num_layers: int
    dtype: str = "float32"
    fingerprint: str | None = None  # architecture and --model string (schema 1): used without weights_fingerprint
    # "<layout>-<content>" (skipsearch.checkpoints.weights_fingerprint): equal means the same weights
    # wherever they live; equal layouts mean the same architecture
    weights_fingerprint: str | None = None
    # the target's precision (skipsearch.model.target): "int8" for the model's int8 weight-only target; None (left
    # out, as in every file before schema 6) or "native": the checkpoint's weights in ``dtype``
    precision: str | None = None

    @classmethod
    def of(cls, sm: Any) -> ModelRef:
        """The reference to a loaded SkippableModel, with both fingerprints and, for a quantized target, its
        precision."""
        precision = getattr(sm, "target_precision", NATIVE)
        return cls(name=sm.name, num_layers=sm.num_layers, dtype=sm.dtype_name, fingerprint=sm.fingerprint,
                   weights_fingerprint=sm.weights_fingerprint, precision=None if precision == NATIVE else precision)

    @property
    def target_precision(self) -> str:
        """The target's precision, ``native`` where the file names none."""
        return self.precision or NATIVE


@dataclass(frozen=True)
class Measured:
    """What the profile achieved when it was made. A speedup means nothing without its baseline."""

    speedup: float | None = None
    tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    tau: float | None = None  # mean tokens accepted per verify step
    acceptance_rate: float | None = None
    predicted_speedup: float | None = None
    wall_seconds: float | None = None
    baseline: str | None = None  # what speedup is relative to: one of BASELINES (e.g. "hf-greedy")
    device: str | None = None
    dataset: str | None = None
    n_prompts: int | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    source: str | None = None  # "optimize", "bench" or "hand"
    notes: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()  # unknown keys, kept so that a round trip loses nothing


@dataclass(frozen=True)
class SearchInfo:
    strategy: str
    budget: int | None = None
    trials: int | None = None
    study: str | None = None
    objective: str | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Profile:
    model: ModelRef
    method: str
    draft: DraftConfig
    measured: Measured | None = None
    environment: Environment | None = None
    search: SearchInfo | None = None
    method_params: tuple[tuple[str, Any], ...] = ()  # the method's own; skipsearch.methods validates them
    kernel: str | None = None  # the kernel it was timed or planned with (skipsearch.kernels); None: eager
    schedule: Schedule | None = None  # K per batch-size range (files.schedule); None: its own K at every size
    schema_version: int = SCHEMA_VERSION

    @property
    def candidate(self) -> Candidate:
        """What this profile decodes with: its method, draft config and method params."""
        return Candidate(self.method, self.draft, self.method_params)

    def describe(self) -> str:
        """A multi-line summary for people (``skipsearch profile show``)."""
        m, d, n, e = self.model, self.draft, self.model.num_layers, self.draft.exit
        if e.adaptive:
            exit_rule = (f"adaptive threshold from {e.threshold:g} towards acceptance {e.target_acceptance:g} "
                         f"(step {e.step:g}, beta1 {e.beta1:g}, beta2 {e.beta2:g})")
        else:
            exit_rule = f"fixed threshold {e.threshold:g}" if e.threshold else "none (always drafts K tokens)"
        ms = self.measured
        # A speedup means nothing without what it was measured against, so the two are shown together.
        speedup = []
        against = ms and (f"{ms.baseline} ({BASELINES[ms.baseline]})" if ms.baseline in BASELINES else ms.baseline)
        if ms is not None and ms.speedup is not None:
            speedup = [f"{ms.speedup:.2f}x speedup vs {against or 'an unrecorded baseline'}"]
        elif against:
            speedup = [f"baseline {against}"]
        rows = {
            "model": f"{m.name} ({n} layers, {m.dtype}" + (f", {m.precision} target" if m.precision else "")
                     + (f", fingerprint {m.fingerprint})" if m.fingerprint else ")"),
            "method": self.method,
            "max draft": f"K={d.max_draft_tokens}" if d.max_draft_tokens else "0 (plain autoregressive decoding)",
            "kernel": self.kernel or "eager (none recorded)",
            "schedule": self.schedule and self.schedule.describe(),
            "exit rule": exit_rule,
            "skip attn": f"{', '.join(map(str, d.skip_attn)) or 'none'} ({len(d.skip_attn)} of {n})",
            "skip mlp": f"{', '.join(map(str, d.skip_mlp)) or 'none'} ({len(d.skip_mlp)} of {n})",
            "skip ratio": f"{d.skip_ratio(n):.1%} of {2 * n} sublayers",
            "params": ", ".join(f"{k} {v}" for k, v in self.method_params),
            "measured": ms and "; ".join(speedup + _named(ms, skip=("speedup", "baseline")) or ["nothing recorded"]),
            "search": self.search and ", ".join(_named(self.search)),
            "environment": self.environment and ", ".join(_named(self.environment)),
        }
        return "\n".join(f"{label + ':':<13}{text}" for label, text in rows.items() if text)


def _named(obj: Any, skip: tuple[str, ...] = ()) -> list[str]:
    pairs = [(f.name, getattr(obj, f.name)) for f in fields(obj) if f.name not in skip and f.name != "extra"]
    pairs += [(k, _brief(k, v)) for k, v in getattr(obj, "extra", ())]
    return [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in pairs if v is not None]


def _brief(key: str, value: Any) -> Any:
    """measured.acceptance and measured.costs run to kilobytes: for people, say what they hold."""
    if key == "acceptance" and isinstance(value, dict):
        return f"traces of {len(value.get('skip_sets') or ())} skip set(s) ({value.get('workload', 'calibration')})"
    if key == "costs" and isinstance(value, dict):
        return f"planned with {value.get('device', '?')} costs ({value.get('source', '?')})"
    if key == ENGINES_KEY and isinstance(value, dict):
        runs = engine_runs_from_dict(value, source="<profile>")
        return " | ".join(run.summary() for run in runs.values())
    return value


# The shared YAML toolkit (skipsearch.files.yamlio), with this file's error type.
def _coerce(value: Any, kind: str, path: str, source: str) -> Any:
    return coerce(value, kind, path, source, error=ProfileError)


def _section(cls: type, raw: Any, path: str, source: str, **checks: Any) -> tuple[dict, dict]:
    return section(cls, raw, path, source, error=ProfileError, **checks)


def _bounded(values: dict, section: str, source: str) -> dict:
    """A section's values, each number finite and inside its bound (files.bounds.PROFILE_BOUNDS): what the engine
    runs, so that a profile `validate` passes is one `decode` uses as written."""
    problem = bounds.check_section(values, section)
    if problem:
        raise _err(source, problem)
    return values


def _build(cls: type, kwargs: dict, prefix: str, source: str) -> Any:
    return build(cls, kwargs, prefix, source, error=ProfileError)


def _read_yaml(path: str | os.PathLike, source: str) -> Any:
    return read_yaml(path, source, error=ProfileError, what="profile")


def profile_from_dict(raw: Any, *, source: str = "<profile>") -> Profile:
    """Validate a parsed profile of any known schema version and build a Profile."""
    if problem := misplaced(raw, PROFILE):  # a cost file or an export's manifest, given as a profile
        raise _err(source, problem)
    raw = upgrade(raw, source=source)
    for key in raw:
        if key not in _TOP_KEYS:
            raise _err(source, f"unknown top-level key {key!r} (known: {', '.join(_TOP_KEYS)})")
    for key in ("model", "method", "draft"):
        if raw.get(key) is None:
            raise _err(source, f"missing required key {key}")
    values = _section(ModelRef, raw["model"], "model", source, required=("name", "num_layers"))[0]
    if values["num_layers"] < 1:  # also keeps skip_ratio's division and the "0..n-1" messages meaningful
        raise _err(source, f"model.num_layers must be >= 1, got {values['num_layers']}")
    model = ModelRef(**_bounded(values, "model", source))
    if not model.name.strip():
        raise _err(source, "model.name must not be empty")
    if bounds.check_dtype(model.dtype):  # the dtypes a model loads in: no other is ever decoded with
        raise _err(source, bounds.check_dtype(model.dtype))
    if model.precision is not None and model.precision not in PRECISIONS:
        raise _err(source, f"model.precision must be one of {', '.join(PRECISIONS)}, got {_short(model.precision)}")
    if model.target_precision != NATIVE and model.dtype != "float32":
        raise _err(source, f"model.precision {model.precision} takes fp32 activations, but model.dtype is "
                           f"{model.dtype}")
    method_name = _coerce(raw["method"], "str", "method", source)
    values = _section(DraftConfig, raw["draft"], "draft", source)[0]
    draft = _build(DraftConfig, values, "draft.", source)
    _bounded(values, "draft", source)  # after DraftConfig's own checks: K within what the engine runs
    params = _mapping(raw.get("method_params") or {}, "method_params", source)
    try:
        method = methods.get(method_name)
        draft.check_layers(model.num_layers)
        method.parse(params, draft=draft, num_layers=model.num_layers)  # the method's one validation path
        methods.check_target(Candidate(method.name, draft, tuple(params.items())), model.target_precision,
                             source="its draft")  # an int8 target's drafts copy no fp32 weights
    except ConfigError as e:
        raise _err(source, str(e)) from None
    measured = environment = search = None
    if raw.get("measured") is not None:
        values, unknown = _section(Measured, raw["measured"], "measured", source, keep_unknown=True,
                                   nonnegative=("n_prompts", "max_new_tokens"))
        measured = Measured(**_bounded(values, "measured", source), extra=tuple(unknown.items()))
        if measured.baseline is not None and measured.baseline not in BASELINES:
            raise _err(source, f"measured.baseline must be one of {', '.join(BASELINES)}, "
                               f"got {_short(measured.baseline)}")
        _check_records(measured.extra, source=source)
    if raw.get("environment") is not None:
        environment = Environment(**_bounded(_section(Environment, raw["environment"], "environment", source)[0],
                                             "environment", source))
    if raw.get("search") is not None:
        search = SearchInfo(**_bounded(_section(SearchInfo, raw["search"], "search", source, required=("strategy",))[0],
                                       "search", source))
    kernel = raw.get("kernel")
    if kernel is not None:
        from skipsearch.kernels import parse_kernel

        if not isinstance(kernel, str):
            raise _err(source, f"kernel must be a kernel's name (eager, inductor-c4, ...), got {_short(kernel)}")
        try:
            kernel = parse_kernel(kernel).label
        except ConfigError as e:
            raise _err(source, f"kernel: {e}") from None
    schedule = schedule_from_dict(raw["schedule"], source=source) if raw.get("schedule") is not None else None
    return Profile(model=model, method=method.name, draft=draft, measured=measured, environment=environment,
                   search=search, method_params=tuple(params.items()), kernel=kernel, schedule=schedule)


def _check_records(extra: tuple[tuple[str, Any], ...], *, source: str) -> None:
    """Validate the ``measured`` keys with a format: the costs a profile was planned with, what serving engines
    measured (``files.engine_runs``), and every record a method keeps (``methods.record_reader``: acceptance,
    lookup, precision, fractal, ...)."""
    readers = {COSTS_KEY: planned_costs_from_dict, ENGINES_KEY: engine_runs_from_dict}
    for key, value in extra:
        read = readers.get(key) or methods.record_reader(key)
        if read is not None:
            read(value, source=source)


def engine_run(profile: Profile, engine: str) -> EngineRun | None:
    """What ``engine`` measured for this profile's model (``measured.engines``), or None."""
    raw = dict(profile.measured.extra).get(ENGINES_KEY) if profile.measured is not None else None
    return engine_runs_from_dict(raw, source="<profile>").get(engine) if raw is not None else None


def without_engine_run(profile: Profile, engine: str) -> Profile:
    """``profile`` without ``engine``'s record (another engine's records kept)."""
    if profile.measured is None:
        return profile
    extra = dict(profile.measured.extra)
    engines = {k: v for k, v in dict(extra.get(ENGINES_KEY) or {}).items() if k != engine}
    extra.pop(ENGINES_KEY, None)
    if engines:
        extra[ENGINES_KEY] = engines
    return replace(profile, measured=replace(profile.measured, extra=tuple(extra.items())))


def with_engine_run(profile: Profile, run: EngineRun) -> Profile:
    """``profile`` with ``run`` as its engine's record (another engine's records kept)."""
    measured = profile.measured or Measured()
    extra = dict(measured.extra)
    engines = dict(extra.get(ENGINES_KEY) or {})
    engines[run.engine] = engine_run_to_dict(run)
    extra[ENGINES_KEY] = engines
    return replace(profile, measured=replace(measured, extra=tuple(extra.items())))


def profile_to_dict(p: Profile) -> dict:
    """The YAML-ready dict, keys in contract order; fields that are None are left out."""
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    for key in ("model", "method", "draft", "kernel", "measured", "environment", "search"):
        if getattr(p, key) is not None:
            out[key] = _plain(getattr(p, key))
        if key == "kernel" and p.schedule is not None:
            out["schedule"] = schedule_to_dict(p.schedule)
    if p.method_params:
        out["method_params"] = {k: _plain(v) for k, v in p.method_params}
    return out


def check_model(profile: Profile, *, num_layers: int | None = None, fingerprint: str | None = None,
                weights_fingerprint: str | None = None, fingerprint_as_profile: str | None = None,
                force: bool = False, source: str = "<profile>", precision: str | None = None) -> None:
    """Refuse a profile made for another model, or for another target precision of it (``precision``: the loaded
    model's, ``native`` or ``int8``; None: not checked). Only a fingerprint mismatch can be forced: with another
    layer count the skipped indices would name other layers, or none; with another precision the drafts were
    chosen against another model.

    When both sides know the weights fingerprint, it decides: the same weights are accepted under any
    path or name (so the architecture fingerprint, which hashes the --model string, is not looked at);
    other weights are refused. A schema-1 profile has only the architecture fingerprint, checked as before.
    ``fingerprint_as_profile`` is this model's architecture fingerprint under the profile's own model name: with
    the same weights, a profile whose ``model.fingerprint`` is not that one was made for (or edited to name) another
    architecture, and is refused like other weights are.
    """
    made_for = profile.model.num_layers
    if num_layers is not None and num_layers != made_for:
        raise _err(source, f"profile was made for a {made_for}-layer model, this model has {num_layers} layers")
    theirs_p = profile.model.target_precision
    if precision is not None and precision != theirs_p:
        raise _err(source, f"profile was made for the {theirs_p} target (model.precision), this run loads the "
                           f"{precision} one: pass --target-precision {theirs_p}, or leave it out")
    theirs_w = profile.model.weights_fingerprint
    if weights_fingerprint is not None and theirs_w is not None:
        if weights_fingerprint == theirs_w:
            theirs = profile.model.fingerprint
            if fingerprint_as_profile is None or theirs is None or fingerprint_as_profile == theirs:
                return
            problem = (f"profile records model fingerprint {theirs} beside this model's weights, whose architecture "
                       f"fingerprint is {fingerprint_as_profile}: re-run optimize, or --force")
        elif weights_fingerprint.split("-")[0] == theirs_w.split("-")[0]:  # same tensor names and shapes
            problem = (f"this model has different weights of the same architecture: re-run optimize, or --force "
                       f"(profile weights {theirs_w}, this model's {weights_fingerprint})")
        else:
            problem = (f"this model is another architecture than the profile's (weights {weights_fingerprint}, "
                       f"profile {theirs_w}): re-run optimize, or --force")
    else:
        theirs = profile.model.fingerprint
        if fingerprint is None or theirs is None or fingerprint == theirs:
            return
        problem = f"profile was made for model fingerprint {theirs}, this model's is {fingerprint}"
        problem += "" if force else " (force to use it anyway)"
    if not force:
        raise _err(source, problem)
    warnings.warn(f"{source}: {problem}; using it anyway (forced)", UserWarning, stacklevel=2)


MAX_PROFILE_BYTES = MAX_BYTES  # the reader's cap on a file


def load_profile(path: str | os.PathLike, *, num_layers: int | None = None, fingerprint: str | None = None,
                 force: bool = False) -> Profile:
    """Read and validate a profile; with num_layers or fingerprint, also check it fits that model."""
    source = str(path)
    raw = _read_yaml(path, source)
    if not isinstance(raw, dict):
        got = "an empty file" if raw is None else f"a {type(raw).__name__}"
        raise _err(source, f"expected a YAML mapping at the top level, got {got}")
    profile = profile_from_dict(raw, source=source)
    check_model(profile, num_layers=num_layers, fingerprint=fingerprint, force=force, source=source)
    return profile


def save_profile(profile: Profile, path: str | os.PathLike) -> Path:
    """Validate, then write atomically, so that a crash never leaves a half-written profile."""
    path, source = Path(path), str(path)
    data = profile_to_dict(profile)
    profile_from_dict(data, source=source)  # an invalid profile must never reach disk
    try:
        body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError as e:
        raise _err(source, f"cannot write as YAML: {e}") from None
    return write_atomic(path, f"{PROFILE_HEADER} (schema v{SCHEMA_VERSION})\n{body}")


def check_profile_target(path: str | os.PathLike, *, force: bool = False) -> Path:
    """Refuse, in one line and before any work, a path a profile could not or must not be written to: the one
    overwrite rule (``files.targets.check_target``) for a profile, replaced only with ``force``."""
    return check_target(path, PROFILE, replace=force)
