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
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from . import methods
from .config import Candidate, ConfigError, DraftConfig, ExitRule

# Schema versions. Bump SCHEMA_VERSION whenever a key changes shape or meaning, and add a step
# to _UPGRADES that takes a dict of the previous version to the new one, so old files still load.
#   1: first version: schema_version, model, method, draft (skip_attn, skip_mlp,
#      max_draft_tokens, exit), optional measured, environment, search, method_params.
#   2: new optional keys (a version-1 file is a valid version-2 file, so _v1_to_v2 changes nothing):
#      - model.weights_fingerprint: a hash of the weights themselves, which check_model trusts over
#        model.fingerprint (architecture and --model string), kept beside it for upgrade
#      - environment.device, environment.device_choice: the device the model ran on and how
#        --device/--dtype auto were resolved
#      - measured.acceptance: the traces (per-position match bit and top probability, per calibration
#        sequence) of the shortlisted layer-skip skip sets, and measured.costs: the cost profile the
#        profile was planned with; what `plan --profile --costs` re-plans from (skipsearch.replan
#        validates both, here and where they are read)
SCHEMA_VERSION = 2


def _v1_to_v2(raw: dict) -> dict:
    return dict(raw)  # version 2 only adds optional keys


_UPGRADES: dict[int, Callable[[dict], dict]] = {1: _v1_to_v2}  # version v -> function returning version v+1

_TOP_KEYS = ("schema_version", "model", "method", "draft", "measured", "environment", "search", "method_params")


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
    fingerprint: str | None = None  # architecture and --model string (schema 1): used without weights_fingerprint
    # "<layout>-<content>" (skipsearch.checkpoints.weights_fingerprint): equal means the same weights
    # wherever they live; equal layouts mean the same architecture
    weights_fingerprint: str | None = None

    @classmethod
    def of(cls, sm: Any) -> ModelRef:
        """The reference to a loaded SkippableModel, with both fingerprints."""
        return cls(name=sm.name, num_layers=sm.num_layers, dtype=sm.dtype_name, fingerprint=sm.fingerprint,
                   weights_fingerprint=sm.weights_fingerprint)


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
    device: str | None = None  # cpu, cuda, cuda:N, or auto (the layers spread over several GPUs)
    device_choice: str | None = None  # how --device and --dtype were resolved, e.g. "device auto: no CUDA device; ..."

    @classmethod
    def current(cls, device: str = "cpu", *, placement: Any = None) -> Environment:
        """This machine. ``placement``: the loaded model's (``SkippableModel.placement``), recorded
        with its reason; without it only ``device`` is."""
        versions = {name: _version(name) for name in ("torch", "transformers", "skipsearch")}
        where = getattr(placement, "device", None) or device
        return cls(python=platform.python_version(), device_name=_device_name(device), device=where,
                   device_choice=getattr(placement, "reason", None), **versions)


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
    pairs += [(k, _brief(k, v)) for k, v in getattr(obj, "extra", ())]
    return [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in pairs if v is not None]


def _brief(key: str, value: Any) -> Any:
    """measured.acceptance and measured.costs run to kilobytes: for people, say what they hold."""
    if key == "acceptance" and isinstance(value, dict):
        return f"traces of {len(value.get('skip_sets') or ())} skip set(s) ({value.get('workload', 'calibration')})"
    if key == "costs" and isinstance(value, dict):
        return f"planned with {value.get('device', '?')} costs ({value.get('source', '?')})"
    return value


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


def _short(value: Any, limit: int = 60) -> str:
    """repr(value) for a message, at most ``limit`` characters. A value from a file may be huge (or
    share itself many times over through YAML aliases), so the repr is bounded while it is built."""
    text = _bounded_repr(value, limit + 1)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bounded_repr(value: Any, budget: int) -> str:
    # Returns at least min(len(repr(value)), budget) characters of repr(value), or a stand-in for
    # what repr cannot show briefly. Each nesting level costs one character of the budget, so a deep
    # or self-referencing value stops too.
    if budget <= 0:
        return ""
    if isinstance(value, (str, bytes)):
        return repr(value[:budget])
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * budget:
        return f"<an integer of {value.bit_length()} bits>"  # repr would be long, or raise past 4300 digits
    if isinstance(value, (list, tuple, dict, set, frozenset)) and value:
        opening, closing = {dict: "{}", list: "[]", tuple: "()"}.get(type(value), "{}")
        items = value.items() if isinstance(value, dict) else value
        text = opening
        for item in items:
            if len(text) >= budget:
                return text  # cut: _short adds "..."
            left = budget - len(text) - 1
            if isinstance(value, dict):
                key = _bounded_repr(item[0], left)
                text += key + ": " + _bounded_repr(item[1], left - len(key) - 2) + ", "
            else:
                text += _bounded_repr(item, left) + ", "
        return (text[:-2] if text.endswith(", ") else text) + closing
    return repr(value)  # numbers, booleans, None, dates: short by nature


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
    method_name = _coerce(raw["method"], "str", "method", source)
    draft = _build(DraftConfig, _section(DraftConfig, raw["draft"], "draft", source)[0], "draft.", source)
    params = _mapping(raw.get("method_params") or {}, "method_params", source)
    try:
        method = methods.get(method_name)
        draft.check_layers(model.num_layers)
        method.parse(params, draft=draft, num_layers=model.num_layers)  # the method's one validation path
    except ConfigError as e:
        raise _err(source, str(e)) from None
    measured = environment = search = None
    if raw.get("measured") is not None:
        values, unknown = _section(Measured, raw["measured"], "measured", source, keep_unknown=True,
                                   nonnegative=("n_prompts", "max_new_tokens"))
        measured = Measured(**values, extra=tuple(unknown.items()))
        from .replan import check_measured_extra  # here: replan imports this module

        check_measured_extra(measured.extra, source=source)
    if raw.get("environment") is not None:
        environment = Environment(**_section(Environment, raw["environment"], "environment", source)[0])
    if raw.get("search") is not None:
        search = SearchInfo(**_section(SearchInfo, raw["search"], "search", source, required=("strategy",),
                                       nonnegative=("budget", "trials"))[0])
    return Profile(model=model, method=method.name, draft=draft, measured=measured, environment=environment,
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
                weights_fingerprint: str | None = None, force: bool = False, source: str = "<profile>") -> None:
    """Refuse a profile made for another model. Only a fingerprint mismatch can be forced:
    with another layer count the skipped indices would name other layers, or none.

    When both sides know the weights fingerprint, it decides: the same weights are accepted under any
    path or name (so the architecture fingerprint, which hashes the --model string, is not looked at);
    other weights are refused. A schema-1 profile has only the architecture fingerprint, checked as before.
    """
    made_for = profile.model.num_layers
    if num_layers is not None and num_layers != made_for:
        raise _err(source, f"profile was made for a {made_for}-layer model, this model has {num_layers} layers")
    theirs_w = profile.model.weights_fingerprint
    if weights_fingerprint is not None and theirs_w is not None:
        if weights_fingerprint == theirs_w:
            return
        if weights_fingerprint.split("-")[0] == theirs_w.split("-")[0]:  # same tensor names and shapes
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


# A profile is a few hundred bytes. The caps keep a hostile or mistaken file from costing minutes
# and gigabytes: on the file itself, and on the document as its aliases expand it (a 1 KB
# "billion laughs" of nested aliases is a billion nodes to anything that walks or prints it).
MAX_PROFILE_BYTES = 1 << 20
MAX_EXPANDED_SIZE = 1 << 20  # nodes plus scalar characters, with every alias counted in full
_PROFILE_HEADER = "# skipsearch draft profile"  # the first line save_profile writes


class _TooLarge(yaml.YAMLError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """safe_load that refuses a document whose aliases expand it past MAX_EXPANDED_SIZE (or into
    itself), and turns a value that Python cannot construct (a 5000-digit integer, February 30)
    into a YAML error with its line."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> expanded size, for nodes composed so far

    def compose_node(self, parent, index):
        is_alias = self.check_event(yaml.AliasEvent)
        mark = self.peek_event().start_mark
        node = super().compose_node(parent, index)
        if is_alias:
            if id(node) not in self._sizes:  # the anchor is still open: an alias to its own ancestor
                raise yaml.composer.ComposerError(None, None, "an alias refers to a node that contains it", mark)
            return node  # an alias adds nothing new; its parent counts it in full
        if isinstance(node, yaml.ScalarNode):
            size = 1 + len(node.value)
        elif isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._sizes[id(child)] for child in node.value)
        else:
            size = 1 + sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
        if size > MAX_EXPANDED_SIZE:
            raise _TooLarge(f"at line {node.start_mark.line + 1} the document expands through its aliases past "
                            f"{MAX_EXPANDED_SIZE} nodes and characters (a profile has a few hundred)")
        self._sizes[id(node)] = size
        return node

    def construct_object(self, node, deep=False):
        try:
            value = super().construct_object(node, deep)
        except (ValueError, OverflowError) as e:  # YAMLError is not a ValueError: only Python's own
            raise yaml.constructor.ConstructorError(None, None, str(e), node.start_mark) from None
        if isinstance(value, int) and value.bit_length() > 256:  # e.g. 0xfff...: too long to even print
            raise yaml.constructor.ConstructorError(None, None, f"an integer of {value.bit_length()} bits",
                                                    node.start_mark)
        return value


def _read_yaml(path: str | os.PathLike, source: str) -> Any:
    """The parsed document of a profile file, with every way of failing as one ProfileError."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROFILE_BYTES + 1)  # never more, whatever the file (or /dev/zero) holds
        if len(data) > MAX_PROFILE_BYTES:
            raise _err(source, f"refused: larger than {MAX_PROFILE_BYTES >> 20} MiB (a profile is a few hundred bytes)")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise _err(source, f"cannot read the profile: {getattr(e, 'strerror', None) or e}") from None
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except _TooLarge as e:
        raise _err(source, f"refused: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        what = "; ".join(filter(None, (getattr(e, "context", None), getattr(e, "problem", None)))) or str(e)
        what = what if len(what) <= 200 else what[:197] + "..."
        raise _err(source, f"malformed YAML{where}: {what}") from None
    except RecursionError:
        raise _err(source, "malformed YAML: nested too deeply") from None


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


def check_profile_target(path: str | os.PathLike, *, force: bool = False) -> Path:
    """Refuse, in one line and before any work, a path that save_profile could not or should not write.

    Checked: every existing ancestor is a directory and the nearest is writable (the profile is
    written there first and renamed); the target, if it exists, is a regular file, writable, and
    a skipsearch profile (or empty). Another file is replaced only with ``force``: an --out typo
    must not eat someone's work. A read-only target is refused even for root, who could replace
    it: its write bits were taken away on purpose.
    """
    target, source = Path(path), str(path)
    try:
        _check_target(target, source, force=force)
    except OSError as e:  # e.g. a folder on the way that may not even be looked into
        raise _err(source, f"cannot write here: {e.strerror or e}") from None
    return target


def _check_target(target: Path, source: str, *, force: bool) -> None:
    ancestor = target.parent
    while not ancestor.exists() and ancestor != ancestor.parent:  # the first folder that exists
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise _err(source, f"cannot write here: {ancestor} is not a directory")
    if not _writable(ancestor, directory=True):
        raise _err(source, f"cannot write here: directory {ancestor} is not writable")
    if not target.exists() and not target.is_symlink():
        return
    if target.is_dir():
        raise _err(source, "is a directory; give a file path")
    if not target.is_file():
        raise _err(source, "exists and is not a regular file; refusing to replace it")
    if not _writable(target, directory=False):
        raise _err(source, "exists and is read-only (or immutable); refusing to replace it")
    if not force and not _is_profile(target):
        raise _err(source, "exists and is not a skipsearch profile; refusing to overwrite it (force to replace it)")


def _writable(path: Path, *, directory: bool) -> bool:
    # os.access alone says yes to root for anything; the mode bits say what the owner meant, and a
    # real open (which writes nothing) catches what neither sees: immutable files, read-only mounts.
    try:
        if not os.access(path, os.W_OK | (os.X_OK if directory else 0)) or not path.stat().st_mode & 0o222:
            return False
        if directory:
            fd, probe = tempfile.mkstemp(prefix=".skipsearch-probe-", dir=path)
            os.close(fd)
            os.unlink(probe)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))  # no O_CREAT, no O_TRUNC: the bytes stay
    except OSError:
        return False
    return True


def _is_profile(path: Path) -> bool:
    """An empty file, or one that reads as a profile (valid or not): it has our header or the keys."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_PROFILE_HEADER))
        if not head or head.decode("utf-8", "replace") == _PROFILE_HEADER:
            return True
        raw = _read_yaml(path, str(path))
    except (OSError, ProfileError):
        return False
    return isinstance(raw, dict) and "schema_version" in raw and "model" in raw
