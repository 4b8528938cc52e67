"""Draft profiles: the portable YAML file that says how to self-speculatively decode one model.

People write and read these by hand and share them between teams, so the keys are a contract:
every load validates everything, and every error is one line naming the file and the key.
"""

from __future__ import annotations

import importlib.metadata
import numbers
import os
import platform
import secrets
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, DraftConfig, ExitRule

# Schema versions. Bump SCHEMA_VERSION whenever a key changes shape or meaning, and add a step
# to _UPGRADES that takes a dict of the previous version to the new one, so old files still load.
#   1: first version: schema_version, model, method, draft (skip_attn, skip_mlp,
#      max_draft_tokens, exit), optional measured, environment, search, method_params.
SCHEMA_VERSION = 1
_UPGRADES: dict[int, Callable[[dict], dict]] = {}  # version v -> function returning version v+1

KNOWN_METHODS: set[str] = {"layer-skip", "clasp-dynamic", "hierarchical", "fractal"}
_TOP_KEYS = ("schema_version", "model", "method", "draft", "measured", "environment", "search", "method_params")


def register_method(name: str) -> None:
    """Make a method name loadable; its own module validates its method_params later."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(f"a method name must be a non-empty string without surrounding spaces, got {name!r}")
    KNOWN_METHODS.add(name)


class ProfileError(ValueError):
    """A profile that cannot be read, written or used. str() is one line: ``<file>: <problem>``."""

    def __init__(self, message: str) -> None:
        # Collapsed here so that nothing quoted into a message (a YAML error, a repr) can span lines.
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class ModelRef:
    name: str
    num_layers: int
    dtype: str = "float32"
    fingerprint: str | None = None  # optional weights hash: a mismatch means the layers may differ


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
    baseline: str | None = None  # e.g. "skipsearch-autoregressive, same run"
    device: str | None = None
    dataset: str | None = None
    n_prompts: int | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    source: str | None = None  # "optimize", "bench" or "hand"
    notes: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()  # unknown keys, kept so that a round trip loses nothing


@dataclass(frozen=True)
class Environment:
    python: str | None = None
    torch: str | None = None
    transformers: str | None = None
    skipsearch: str | None = None
    device_name: str | None = None

    @classmethod
    def current(cls, device: str = "cpu") -> Environment:
        versions = {name: _version(name) for name in ("torch", "transformers", "skipsearch")}
        return cls(python=platform.python_version(), device_name=_device_name(device), **versions)


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
    method_params: tuple[tuple[str, Any], ...] = ()  # free-form; the method validates them
    schema_version: int = SCHEMA_VERSION

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
        if ms is not None and ms.speedup is not None:
            speedup = [f"{ms.speedup:.2f}x speedup vs {ms.baseline or 'an unrecorded baseline'}"]
        rows = {
            "model": f"{m.name} ({n} layers, {m.dtype}" + (f", fingerprint {m.fingerprint})" if m.fingerprint else ")"),
            "method": self.method,
            "max draft": f"K={d.max_draft_tokens}" if d.max_draft_tokens else "0 (plain autoregressive decoding)",
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
    pairs += list(getattr(obj, "extra", ()))
    return [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in pairs if v is not None]


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device_name(device: str) -> str | None:
    if not device.startswith("cuda"):
        return platform.processor() or "cpu"
    try:
        import torch  # here, so that reading and writing profiles never needs torch

        return torch.cuda.get_device_name(device)
    except Exception:  # provenance is best-effort: a missing driver must not fail a run
        return None


def _err(source: str, problem: str) -> ProfileError:
    return ProfileError(f"{source}: {problem}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _mapping(value: Any, path: str, source: str) -> dict:
    if not isinstance(value, dict):
        raise _err(source, f"{path} must be a mapping, got {_short(value)}")
    for key in value:
        if not isinstance(key, str):
            raise _err(source, f"{path} has a non-string key {_short(key)}")
    return value


_KIND_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string",
               "tuple[int, ...]": "a list of layer indices"}


def _coerce(value: Any, kind: str, path: str, source: str) -> Any:
    # bool is an int to Python, but `max_draft_tokens: true` is a mistake, never an intent.
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind == "int" and real and isinstance(value, numbers.Integral):
        return int(value)
    if kind == "float" and real:
        return float(value)  # ints too, so a hand-written `threshold: 1` compares equal to 1.0
    if (kind == "bool" and isinstance(value, bool)) or (kind == "str" and isinstance(value, str)):
        return value
    if kind == "tuple[int, ...]" and isinstance(value, (list, tuple)):
        return tuple(value)  # DraftConfig itself rejects non-integer and negative indices
    if kind == "ExitRule":
        return _build(ExitRule, _section(ExitRule, value, path, source)[0], "draft.", source)
    raise _err(source, f"{path} must be {_KIND_WORDS[kind]}, got {_short(value)}")


def _section(cls: type, raw: Any, path: str, source: str, *, required: tuple[str, ...] = (),
             nonnegative: tuple[str, ...] = (), keep_unknown: bool = False) -> tuple[dict, dict]:
    """Check one mapping against a dataclass: its field annotations are the schema."""
    known = {f.name: f.type.split("|")[0].strip() for f in fields(cls) if f.name != "extra"}
    values, unknown = {}, {}
    for key, value in _mapping(raw, path, source).items():
        if key not in known and not keep_unknown:
            raise _err(source, f"unknown key {path}.{key} (known: {', '.join(known)})")
        if key not in known:
            unknown[key] = value
        elif value is not None:  # null means "not given", just as leaving the key out does
            values[key] = _coerce(value, known[key], f"{path}.{key}", source)
    for key in required:
        if key not in values:
            raise _err(source, f"missing required key {path}.{key}")
    for key in nonnegative:
        if values.get(key, 0) < 0:
            raise _err(source, f"{path}.{key} must be >= 0, got {values[key]}")
    return values, unknown


def _build(cls: type, kwargs: dict, prefix: str, source: str) -> Any:
    # config.py names a field relative to its own object; a profile's reader needs the full path.
    try:
        return cls(**kwargs)
    except ConfigError as e:
        msg = str(e)
        raise _err(source, msg if msg.startswith(prefix) else prefix + msg) from None


def upgrade(raw: dict, *, source: str = "<profile>") -> dict:
    """Take a profile dict of any schema version this release knows to the current version."""
    version = _mapping(raw, "the profile", source).get("schema_version")
    if version is None:
        raise _err(source, "missing required key schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        readable = "1" if SCHEMA_VERSION == 1 else f"1..{SCHEMA_VERSION}"
        shown = version if type(version) is int else _short(version)
        raise _err(source, f"unknown schema_version {shown} (this skipsearch reads {readable})")
    out = dict(raw)  # the caller's dict stays as it was
    while version < SCHEMA_VERSION:
        out, version = _UPGRADES[version](out), version + 1
    out["schema_version"] = SCHEMA_VERSION
    return out


def profile_from_dict(raw: Any, *, source: str = "<profile>") -> Profile:
    """Validate a parsed profile of any known schema version and build a Profile."""
    raw = upgrade(raw, source=source)
    for key in raw:
        if key not in _TOP_KEYS:
            raise _err(source, f"unknown top-level key {key!r} (known: {', '.join(_TOP_KEYS)})")
    for key in ("model", "method", "draft"):
        if raw.get(key) is None:
            raise _err(source, f"missing required key {key}")
    model = ModelRef(**_section(ModelRef, raw["model"], "model", source, required=("name", "num_layers"))[0])
    if not model.name.strip():
        raise _err(source, "model.name must not be empty")
    if model.num_layers < 1:  # also keeps skip_ratio's division and the "0..n-1" messages meaningful
        raise _err(source, f"model.num_layers must be >= 1, got {model.num_layers}")
    method = _coerce(raw["method"], "str", "method", source)
    if method not in KNOWN_METHODS:
        raise _err(source, f"unknown method {method!r} (known: {', '.join(sorted(KNOWN_METHODS))})")
    draft = _build(DraftConfig, _section(DraftConfig, raw["draft"], "draft", source)[0], "draft.", source)
    try:
        draft.check_layers(model.num_layers)
    except ConfigError as e:
        raise _err(source, str(e)) from None
    measured = environment = search = None
    if raw.get("measured") is not None:
        values, unknown = _section(Measured, raw["measured"], "measured", source, keep_unknown=True,
                                   nonnegative=("n_prompts", "max_new_tokens"))
        measured = Measured(**values, extra=tuple(unknown.items()))
    if raw.get("environment") is not None:
        environment = Environment(**_section(Environment, raw["environment"], "environment", source)[0])
    if raw.get("search") is not None:
        search = SearchInfo(**_section(SearchInfo, raw["search"], "search", source, required=("strategy",),
                                       nonnegative=("budget", "trials"))[0])
    params = _mapping(raw.get("method_params") or {}, "method_params", source)
    return Profile(model=model, method=method, draft=draft, measured=measured, environment=environment,
                   search=search, method_params=tuple(params.items()))


def _plain(value: Any) -> Any:
    # safe_dump refuses numpy scalars and would write tuples as lists anyway: hand it plain YAML types.
    if is_dataclass(value):
        out = {f.name: _plain(getattr(value, f.name)) for f in fields(value)
               if f.name != "extra" and getattr(value, f.name) is not None}  # None is the same as left out
        return {**out, **{k: _plain(v) for k, v in getattr(value, "extra", ())}}
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return int(value) if isinstance(value, numbers.Integral) else float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value  # anything else that YAML cannot hold is refused, with the file named, by save_profile


def profile_to_dict(p: Profile) -> dict:
    """The YAML-ready dict, keys in contract order; fields that are None are left out."""
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    for key in ("model", "method", "draft", "measured", "environment", "search"):
        if getattr(p, key) is not None:
            out[key] = _plain(getattr(p, key))
    if p.method_params:
        out["method_params"] = {k: _plain(v) for k, v in p.method_params}
    return out


class _Dumper(yaml.SafeDumper):
    """safe_dump, but lists of scalars in flow style (`skip_attn: [3, 7]`), as people write them."""


_Dumper.add_representer(list, lambda dumper, data: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", data, flow_style=all(not isinstance(v, (list, dict)) for v in data)))


def check_model(profile: Profile, *, num_layers: int | None = None, fingerprint: str | None = None,
                force: bool = False, source: str = "<profile>") -> None:
    """Refuse a profile made for another model. Only a fingerprint mismatch can be forced:
    with another layer count the skipped indices would name other layers, or none."""
    made_for = profile.model.num_layers
    if num_layers is not None and num_layers != made_for:
        raise _err(source, f"profile was made for a {made_for}-layer model, this model has {num_layers} layers")
    theirs = profile.model.fingerprint
    if fingerprint is not None and theirs is not None and fingerprint != theirs:
        problem = f"profile was made for model fingerprint {theirs}, this model's is {fingerprint}"
        if not force:
            raise _err(source, problem + " (force to use it anyway)")
        warnings.warn(f"{source}: {problem}; using it anyway (forced)", UserWarning, stacklevel=2)


def load_profile(path: str | os.PathLike, *, num_layers: int | None = None, fingerprint: str | None = None,
                 force: bool = False) -> Profile:
    """Read and validate a profile; with num_layers or fingerprint, also check it fits that model."""
    source = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise _err(source, f"cannot read the profile: {getattr(e, 'strerror', None) or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        what = "; ".join(filter(None, (getattr(e, "context", None), getattr(e, "problem", None)))) or str(e)
        raise _err(source, f"malformed YAML{where}: {what}") from None
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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # os.open with 0o666 honours the umask, unlike mkstemp's 0o600, so shared profiles stay readable.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"# skipsearch draft profile (schema v{SCHEMA_VERSION})\n{body}")
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them the profile
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
