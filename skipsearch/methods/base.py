"""What every method shares: the ``Method`` record, the ``Params`` protocol, ``ParamsError``, the validators, the
types a method's record and re-plan exchange with the shared re-planner, and the registry's functions. The
registry lines themselves are in ``skipsearch/methods/__init__.py``.

A *method* is what a profile's ``method:`` key names. Each package (or light module) in
``skipsearch.methods`` exports one ``METHOD``, a ``Method`` record:
- ``name``: the profile's ``method:`` value (it appears as a literal in its own module only);
- ``params``: its ``method_params`` type, a frozen dataclass with one validation path,
  ``parse(raw, draft=..., num_layers=...)``, whose every problem is one ``ParamsError`` line;
- ``drafter``: ``(candidate, model) -> Drafter | None``, a fresh drafter per sequence (None: plain decoding);
- ``batch_drafter``: ``(candidate, model) -> BatchDrafter``, a fresh one per batch (``engine.batched``, greedy);
  None: its candidates cannot decode a batch (``batch_drafter`` below refuses them in one line);
- ``strategy``: its search entry, the name of the registered ``Strategy`` that searches it (None: none);
- ``example``: ``num_layers -> Candidate``, a small valid candidate (docs, and the shared test suite that
  every registered method passes: tests/test_methods.py);
- ``predict``: its surrogate, ``(objective, candidate) -> Measurement`` from the calibration data and the
  measured cost model, with no timing (None: its candidates can only be timed);
- ``record``: what its profiles keep in ``measured`` so that they can be re-planned for another device (a
  ``Record``: the formats it reads back, and how it is made on the model from a ``Keeping``);
- ``replan``: ``Replanning -> Replanned``, its draft re-priced under another device's cost file from that record,
  with no model (None: plan it again on the device);
- ``speculation``: what its candidates are as an engine-neutral speculative setting (a ``Setting``: a prompt
  lookup, a draft model, both, or nothing a serving engine runs), and the candidate it makes of a setting it
  expresses exactly (``skipsearch export`` reads them through ``setting_of`` and ``candidate_for``; None: its
  candidates are nothing a serving engine runs);
- ``drafts_alone`` and ``traces``: what it is as a draft source another method drafts through on the cycles that
  method does not draft itself (a hybrid's fallback, on a lookup's miss): whether it can be handed such a cycle,
  and, for a draft whose acceptance is its teacher-forced traces, the hooks that replay it with no timing (a
  ``Tracing``). The other method asks any registered method for them and names none.

Adding a method is one package (or module) plus its line in ``skipsearch/methods/__init__.py``.
``profile``, ``api``, ``cli``, ``search.optimize`` and ``search.replan`` read only the registry. A method's record,
params and re-plan import no torch (its drafter and surrogate load it when called), so reading and validating
profiles stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig, ExitRule, thaw
from skipsearch.model.target import NATIVE

if TYPE_CHECKING:
    from skipsearch.engine.decoding import Drafter
    from skipsearch.engine.draft import BatchDrafter
    from skipsearch.kernels import Kernel
    from skipsearch.model.skippable import SkippableModel


# -- a method's record and re-plan: the types they exchange with the shared re-planner (skipsearch.search.replan) --
@dataclass(frozen=True)
class Keeping:
    """What a method's record is made from, on the model: after a search, or for a profile that keeps none."""

    objective: Any  # objective.ModelObjective: the model (``.sm``), the calibration (``.cal``), the cost model
    candidate: Candidate  # the profile's own
    workload: str  # the calibration, for people: "mtbench (calib split), 8 prompts x 64 tokens"
    architecture: str  # costs.architecture_of the model: a cost file must match it
    source: str = "<profile>"  # the profile, as messages name it
    # the searched candidates, best first (the timed ones and the shortlist); None: the profile alone (``plan
    # --profile`` traces the draft of a profile that keeps no record)
    searched: tuple[Candidate, ...] | None = None


@dataclass(frozen=True)
class Kept:
    """A method's record as its profile keeps it: ``measured`` entries, and the weight formats' costs that
    re-pricing its draft reads (``files.costs.SchemeCosts``, kept in ``measured.costs.schemes``)."""

    entries: tuple[tuple[str, Any], ...] = ()  # (measured key, its mapping)
    schemes: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Record:
    """What a method's profiles keep so that they can be re-planned with no model."""

    # (measured key, reader): ``reader(raw, source=...)`` validates and returns the record, every problem one
    # ProfileError line; the profile reader runs it on every load
    formats: tuple[tuple[str, Callable[..., Any]], ...]
    build: Callable[[Keeping], Kept]  # made on the model (one forward per calibration sequence, no timing)


@dataclass(frozen=True)
class Replanning:
    """What the shared re-planner hands a method's re-plan: the profile, the cost file it is re-planned for, and
    the shared check of that cost file against the profile's model."""

    profile: Any  # profile.Profile
    target: Any  # costs.CostProfile: ``.cost_model()``, ``.costs``, ``.device``
    source: str  # the profile, as messages name it
    costs_source: str  # the cost file, as messages name it
    k_values: tuple[int, ...]  # the K a skip set's draft is re-planned over
    # (architecture or None) -> None: a one-line CostsError for a cost file measured on another model (its depth,
    # else the architecture where both sides know it, else the fingerprint)
    check_costs: Callable[[str | None], None]

    @property
    def extra(self) -> dict[str, Any]:
        """The profile's ``measured`` entries, where its records are."""
        return dict(self.profile.measured.extra) if self.profile.measured else {}

    @property
    def weights_architecture(self) -> str | None:
        """The architecture half of the profile's weights fingerprint, for a record that names none."""
        weights = self.profile.model.weights_fingerprint
        return weights.split("-")[0] if weights else None


@dataclass(frozen=True)
class Replanned:
    """A method's re-plan: what ships under the other costs, and the options it weighed, best first."""

    draft: DraftConfig  # what ships: the best draft, or plain decoding (K = 0) when no draft is predicted to pay
    predicted: Any | None  # Measurement of the best draft (even when plain decoding ships)
    best_draft: DraftConfig | None
    options: tuple[tuple[DraftConfig, Any], ...]  # the best per kept skip set (or per K), best first
    note: str | None = None  # for people: an approximation the prediction makes (e.g. a trimmed head's cost)
    basis: str = ""  # for people: what it was re-planned from ("its lookup record, K of 1, 2, 4")
    column: str = "best K and exit rule for the kept skip set"  # what each option's row shows
    method_params: tuple[tuple[str, Any], ...] | None = None  # the new profile's, where re-planning changes them
    extra: tuple[tuple[str, Any], ...] = ()  # measured entries the re-plan redoes (after the rest, replacing them)


# -- a draft another method drafts through (a hybrid's fallback): what it reads of it ------------------------------
@dataclass(frozen=True)
class Traced:
    """A draft's teacher-forced traces over a calibration, and what one of its steps costs."""

    traces: tuple[Any, ...]  # one config.Trace per calibration sequence, in the calibration's order
    c: float  # one draft step / one full step
    note: str | None = None  # for people: an approximation c makes (e.g. a trimmed head's cost)
    key: str | None = None  # the measured key a profile keeps them under, for messages (read back only)
    label: str | None = None  # for people: which of the draft's kept variants these are (e.g. a scheme)


@dataclass(frozen=True)
class Tracing:
    """The hooks of a draft whose acceptance is its teacher-forced traces (``config.Trace``: per position, whether
    its argmax matched the full model's, and its top probability). A method that drafts through it replays the
    traces cycle by cycle by the draft's exit rule and adaptive γ, as the draft's own surrogate does. Such a draft
    is the model under its draft config, so the config's skip sets are its own. Each hook takes the draft as a
    candidate of its own method."""

    # (objective, candidate) -> its traces over the objective's calibration, one per sequence, and its c there
    measure: Callable[[Any, Candidate], Traced]
    # (keeping, candidate) -> its record, the traces lined up with the calibration's sequences (an empty trace where
    # a continuation is empty); None where its record cannot price the draft (e.g. a trimmed head)
    keep: Callable[[Keeping, Candidate], Kept | None]
    # (job, candidate) -> its kept traces and its c under the job's cost file; one ProfileError line when the profile
    # keeps none of this draft
    read: Callable[[Replanning, Candidate], Traced]
    # (job, candidate) -> the draft as each variant its record kept traces of that the job's cost file prices (e.g.
    # the same draft in another weight format), its own first, for ``read``; one line when the cost file prices
    # none. Default: the draft alone.
    variants: Callable[[Replanning, Candidate], tuple[Candidate, ...]] = lambda _job, cand: (cand,)


# -- a candidate as the speculative settings serving engines have (``skipsearch export``) ---------------------------
@dataclass(frozen=True)
class Lookup:
    """Prompt lookup: the tokens that followed the latest earlier match of the longest suffix of ``min_n`` ..
    ``max_n`` tokens, up to ``k`` of them."""

    min_n: int
    max_n: int
    k: int


@dataclass(frozen=True)
class DraftModel:
    """A draft by the model's own weights in a reduced-precision ``scheme``, up to ``k`` tokens a cycle, and what
    of it no serving engine runs (skipped sublayers, a trimmed head, an adaptive exit threshold)."""

    scheme: str
    k: int
    exit: ExitRule  # the draft's exit rule: a threshold stops it early
    quant_head: bool = True  # the LM head is in the scheme too
    full_attn: tuple[int, ...] = ()  # layers whose attention stays at full precision
    full_mlp: tuple[int, ...] = ()
    skips: bool = False  # some sublayers skipped (no engine can)
    trimmed_head: bool = False  # the draft head covers part of the vocabulary (no engine can)

    @property
    def threshold(self) -> float:
        return self.exit.threshold

    @property
    def adaptive(self) -> bool:
        return self.exit.adaptive

    def runnable(self, scheme: str | None = None, *, exit: bool = True) -> DraftModel:
        """This draft as an engine runs it: no sublayer skipped, the full vocabulary, its threshold fixed (or no
        exit: always without ``exit``), in ``scheme`` if given."""
        exit_rule = replace(self.exit, adaptive=False) if self.threshold and exit else NO_EXIT
        return replace(self, scheme=scheme or self.scheme, exit=exit_rule, skips=False, trimmed_head=False)


@dataclass(frozen=True)
class Setting:
    """A candidate's draft as an engine-neutral speculative setting: a prompt lookup, a draft model, both (the
    lookup first, the draft model on a miss), or neither: nothing a serving engine runs."""

    lookup: Lookup | None = None
    draft_model: DraftModel | None = None
    # what drafts on a lookup's miss, as the profile names it (for messages); None: nothing. With no draft_model
    # beside it, it is a draft no serving engine runs.
    fallback: str | None = None


@dataclass(frozen=True)
class Speculation:
    """How a method's candidates read as engine-neutral settings, and back."""

    setting: Callable[[Candidate], Setting]  # the setting a candidate of the method is
    candidate: Callable[[Setting], Candidate | None] = lambda _s: None  # its candidate that is exactly the setting


class ParamsError(ConfigError):
    """A method's ``method_params`` that cannot be used. One line: ``<method>: method_params.<key> ...``."""


class Params(Protocol):
    """A method's parameters. ``parse`` is the only way in from a profile or a study."""

    method: ClassVar[str]

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> Params: ...

    def to_pairs(self) -> tuple[tuple[str, Any], ...]: ...


def parse_params(params: type, raw: Mapping[str, Any] | Sequence[tuple[str, Any]], *, draft: DraftConfig,
                 num_layers: int) -> Any:
    """``method_params`` (a mapping, or a profile's pairs) validated by the Params type ``params``, for a model of
    ``num_layers``: what ``Method.parse`` does, for a method's own modules, which cannot import its METHOD."""
    values = {k: thaw(v) for k, v in (raw.items() if isinstance(raw, Mapping) else raw)}
    return params.parse(values, draft=draft, num_layers=num_layers)


@dataclass(frozen=True)
class Method:
    name: str
    summary: str  # one line for people: what drafts, and where it comes from
    params: type  # its Params type
    drafter: Callable[[Candidate, SkippableModel], Drafter | None]
    example: Callable[[int], Candidate] | None = None  # required by the shared suite: tests/test_methods.py
    strategy: str | None = None  # the search entry: a name in skipsearch.search.strategies.REGISTRY
    predict: Callable[[Any, Candidate], Any] | None = None  # (ModelObjective, candidate) -> Measurement
    # (candidate, device) -> None: a one-line ConfigError when the device cannot run the candidate (e.g. a
    # precision scheme without its kernel there); called before the model loads. None: any device runs it.
    check_device: Callable[[Candidate, str], None] | None = None
    # candidate -> bits per weight of the draft's own copy of the model's layers (None: it keeps none); the
    # memory check counts that copy before the model loads.
    draft_weight_bits: Callable[[Candidate], int | None] | None = None
    # candidate -> whether its draft copies fp32 weights out of the model's nn.Linear layers (a trimmed head's rows,
    # fractal's compressed layers): what an int8 target (model/target.py), whose linears are int8 stand-ins, cannot
    # give (a precision copy reads the int8 weights themselves). None: it never does (lookups, skipped sublayers).
    copies_weights: Callable[[Candidate], bool] | None = None
    # the weight formats of the draft's own copy whose per-sublayer costs a cost file keeps for re-planning
    # (``skipsearch costs --schemes``), and (model, context, schemes, repeats) -> surrogate.SchemeCost per scheme
    cost_schemes: tuple[str, ...] = ()
    measure_schemes: Callable[..., Sequence[Any]] | None = None
    record: Record | None = None  # what its profiles keep so that they can be re-planned (None: nothing)
    replan: Callable[[Replanning], Replanned] | None = None  # its re-pricing under a cost file (None: none)
    # (candidate, device) -> the schemes among those whose costs a cost file for ``device`` must keep for
    # ``plan --profile`` to re-plan the candidate there (what ``skipsearch costs`` measures by default for the
    # shipped profiles). None: re-planning it needs no scheme's costs.
    replan_schemes: Callable[[Candidate, str], tuple[str, ...]] | None = None
    speculation: Speculation | None = None  # its candidates as serving engines' settings (None: none they run)
    # Whether another method may hand its drafter the cycles that method does not draft (a hybrid's fallback on a
    # lookup's miss): it drafts any one cycle from the model and the cache alone, up to the K its draft config is
    # given. Not a lookup (it reads the tokens), CLaSp (its DP reads the verify pass, which only the engine hands
    # it) or hierarchical (its K is m·(n+1), fixed by its params).
    drafts_alone: bool = False
    compiled_kernels: bool = True  # its drafter runs beside a compiled kernel's StaticCache (not CLaSp's dynamic DP)
    traces: Tracing | None = None  # a traced draft's hooks (see Tracing); None: where it drafts it can only be timed
    # (candidate, model) -> a fresh BatchDrafter for one batch (engine.batched, greedy); None: it cannot batch
    batch_drafter: Callable[[Candidate, SkippableModel], BatchDrafter] | None = None
    # (model, scheme) -> a context factory: inside each context the model's own forward is the whole-model draft in
    # that scheme (every sublayer and the head in it), as the method's batched draft runs it; ``skipsearch costs
    # --batch-sizes`` times one B x 1 forward inside it as the scheme's c(B). None: its schemes get no c(B).
    scheme_draft: Callable[[Any, str], Callable[[], AbstractContextManager[None]]] | None = None

    def parse(self, raw: Mapping[str, Any] | Sequence[tuple[str, Any]], *, draft: DraftConfig,
              num_layers: int) -> Any:
        """Validate ``method_params`` for a model of ``num_layers``; ParamsError (one line) if bad."""
        return parse_params(self.params, raw, draft=draft, num_layers=num_layers)

    def candidate(self, draft: DraftConfig, params: Any = None) -> Candidate:
        return Candidate(self.name, draft, params.to_pairs() if params is not None else ())


REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` (a test's toy method, or a plug-in's). A name is registered once."""
    if not isinstance(method.name, str) or not method.name or method.name != method.name.strip():
        raise ValueError(f"a method name must be a non-empty string without surrounding spaces, got {method.name!r}")
    if REGISTRY.get(method.name, method) is not method:
        raise ValueError(f"method '{method.name}' is registered already")
    REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)


def get(name: str) -> Method:
    """The method registered as ``name``; a one-line ConfigError for anything else."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown method {_shown(name)} (known: {', '.join(names())})") from None


def scheme_method(scheme: str) -> Method:
    """The method whose draft copy runs weight format ``scheme`` (``Method.cost_schemes``); one line otherwise."""
    for method in REGISTRY.values():
        if scheme in method.cost_schemes and method.measure_schemes is not None:
            return method
    known = [s for m in REGISTRY.values() for s in m.cost_schemes]
    raise ConfigError(f"unknown scheme {_shown(scheme)} (schemes a cost file can keep: {', '.join(known)})")


def measure_scheme_costs(sm: Any, context: Sequence[int], schemes: Sequence[str], *, repeats: int = 9) -> tuple:
    """Each scheme's per-sublayer costs on ``sm``'s device (``surrogate.SchemeCost``), timed by the method that
    owns it; every name is checked before anything is timed."""
    owners = [scheme_method(s) for s in schemes]
    return tuple(m for owner, scheme in zip(owners, schemes, strict=True)
                 for m in owner.measure_schemes(sm, context, (scheme,), repeats=repeats))


def scheme_draft(sm: Any, scheme: str) -> Callable[[], AbstractContextManager[None]] | None:
    """The whole-model draft in ``scheme`` on ``sm`` as its owner runs it (``Method.scheme_draft``): a factory of
    contexts in which the model's forward is that draft, its copy built here, before anything is timed; None where
    the owner has no such draft (its scheme gets no c(B) column)."""
    owner = scheme_method(scheme)
    return owner.scheme_draft(sm, scheme) if owner.scheme_draft is not None else None


def replan_schemes(candidate: Candidate, device: str) -> tuple[str, ...]:
    """The draft schemes a cost file for ``device`` must keep to re-plan ``candidate`` there (its method's
    ``replan_schemes``); () for a method that needs none, or an unknown one (loading it says why)."""
    method = REGISTRY.get(candidate.method) if isinstance(candidate.method, str) else None
    return tuple(method.replan_schemes(candidate, device)) if method and method.replan_schemes else ()


def names() -> tuple[str, ...]:
    return tuple(sorted(REGISTRY))


def record_reader(key: str) -> Callable[..., Any] | None:
    """The reader of the record a profile keeps as ``measured.<key>`` (a method's ``Record.formats``); None for a
    key no method keeps."""
    for method in REGISTRY.values():
        for name, read in method.record.formats if method.record else ():
            if name == key:
                return read
    return None


def record_keys() -> tuple[str, ...]:
    """Every ``measured`` key a registered method keeps a record under."""
    keys = (name for m in REGISTRY.values() if m.record for name, _ in m.record.formats)
    return tuple(dict.fromkeys(keys))


def setting_of(candidate: Candidate) -> Setting:
    """``candidate``'s draft as an engine-neutral speculative setting (``Setting()``: nothing a serving engine
    runs, plain decoding included)."""
    speculation = get(candidate.method).speculation
    if candidate.is_autoregressive:
        return Setting()
    return speculation.setting(candidate) if speculation is not None else Setting()


def candidate_for(setting: Setting) -> Candidate:
    """The candidate that is exactly ``setting``, made by the method that expresses it; one line when none does."""
    for method in REGISTRY.values():
        made = method.speculation.candidate(setting) if method.speculation is not None else None
        if made is not None:
            return made
    raise ConfigError(f"no registered method drafts with {setting}")


def copies_weights(candidate: Candidate) -> bool:
    """Whether ``candidate``'s draft copies fp32 weights out of the model's linears (``Method.copies_weights``)."""
    method = get(candidate.method)
    return not candidate.is_autoregressive and method.copies_weights is not None and method.copies_weights(candidate)


def check_target(candidate: Candidate, precision: str, *, source: str = "the profile") -> None:
    """One ConfigError line where ``candidate`` cannot draft for the ``precision`` target: on a quantized target
    (model/target.py) a draft that copies the fp32 weights the target no longer holds."""
    if precision != NATIVE and copies_weights(candidate):
        raise ConfigError(f"{source}: its {candidate.method} draft copies the model's fp32 weights (a trimmed head, "
                          f"fractal's compressed layers), which the {precision} target does not keep: the "
                          f"{precision} target drafts with lookups, its own layers and copies of its int8 weights")


def check_kernel_fits(candidate: Candidate, kernel: Kernel, *, source: str = "the profile",
                      instead: str = "--kernel eager") -> None:
    """One ConfigError line where ``candidate`` cannot draft beside ``kernel`` (``instead``: asking for eager)."""
    if kernel.compiled and not candidate.is_autoregressive and not get(candidate.method).compiled_kernels:
        raise ConfigError(f"{source}: its {candidate.method} draft reads the hidden states of every verify pass and "
                          f"runs single layers on a cache that grows, which the compiled kernel {kernel.label} does "
                          f"not give: decode it with {instead}")


def build_drafter(candidate: Candidate, sm: SkippableModel) -> Drafter | None:
    """A fresh drafter for ``candidate`` on ``sm`` (None: plain decoding)."""
    if candidate.is_autoregressive:
        return None
    return get(candidate.method).drafter(candidate, sm)


def batch_drafter(candidate: Candidate, sm: SkippableModel) -> BatchDrafter | None:
    """A fresh batch drafter for ``candidate`` on ``sm`` (None: plain batched decoding, a K = 0 candidate); a
    one-line ConfigError for a method that cannot decode a batch."""
    check_batchable(candidate)
    return None if candidate.is_autoregressive else get(candidate.method).batch_drafter(candidate, sm)


def check_batchable(candidate: Candidate) -> None:
    """A one-line ConfigError for a candidate whose method cannot decode a batch (no model needed: a command checks
    it before the model loads). A K = 0 candidate decodes any batch plainly."""
    method = get(candidate.method)
    if method.batch_drafter is None and not candidate.is_autoregressive:
        raise ConfigError(f"method {_shown(method.name)} cannot decode a batch (batched decoding covers: "
                          f"{', '.join(batch_methods())})")


def batch_methods() -> tuple[str, ...]:
    """The registered methods that decode a batch (``Method.batch_drafter``), in registry order."""
    return tuple(m.name for m in REGISTRY.values() if m.batch_drafter is not None)


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else f"of type {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


# -- one validation path for every Params type ----------------------------------------------------
def check_keys(method: str, raw: Mapping[str, Any], params_type: type, *, required: Sequence[str] = ()) -> None:
    """Unknown or missing ``method_params`` keys, against the dataclass's own fields."""
    known = [f.name for f in fields(params_type)]
    for key in raw:
        if key not in known:
            shown = key[:40] if isinstance(key, str) else _shown(key)
            raise ParamsError(f"{method}: unknown key method_params.{shown} (known: {', '.join(known)})")
    for key in required:
        if key not in raw:
            raise ParamsError(f"{method}: missing required key method_params.{key}")


def int_param(method: str, raw: Mapping[str, Any], key: str, default: int | None = None, *, low: int = 0,
              high: int | None = None, why: str = "") -> int:
    value = raw.get(key, default)
    bad = isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high)
    if bad:
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        shown = value if type(value) is int else _shown(value)
        raise ParamsError(f"{method}: method_params.{key} must be an integer {bound}{why}, got {shown}")
    return value


def choice_param(method: str, raw: Mapping[str, Any], key: str, default: Any, choices: Sequence[Any]) -> Any:
    value = raw.get(key, default)
    if isinstance(value, bool) is not isinstance(default, bool) or value not in choices:
        raise ParamsError(f"{method}: method_params.{key} must be one of {', '.join(map(str, choices))}, "
                          f"got {_shown(value) if not isinstance(value, (bool, int)) else value}")
    return value


def layers_param(method: str, value: Any, key: str, num_layers: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ParamsError(f"{method}: method_params.{key} must be a list of layer indices")
    bad = [v for v in value if not 0 <= v < num_layers]
    if bad:
        raise ParamsError(f"{method}: method_params.{key} has layer {bad[0]}, but the model has "
                          f"{num_layers} layers (0..{num_layers - 1})")
    return tuple(sorted(set(value)))


__all__ = ["REGISTRY", "DraftModel", "Keeping", "Kept", "Lookup", "Method", "Params", "ParamsError", "Record",
           "Replanned", "Replanning", "Setting", "Speculation", "Traced", "Tracing", "batch_drafter", "batch_methods",
           "build_drafter", "check_batchable", "candidate_for",
           "check_keys", "choice_param", "get", "int_param", "layers_param", "names", "record_keys", "record_reader",
           "register", "setting_of", "unregister"]
