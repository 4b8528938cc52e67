"""The value types that cross module boundaries: what to draft with, and how to sample.

They are frozen so that a config can be hashed (objective caches key on it) and so that
no module can change one behind another's back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# how a search scores a candidate (search/optimize.py); here so that the CLI's choices need not import the search
OBJECTIVES = ("auto", "two-stage", "surrogate", "timed")
# the target's precisions (model/target.py says what each is); here so that file formats can name them
NATIVE, INT8 = "native", "int8"
PRECISIONS = (NATIVE, INT8)


class ConfigError(ValueError):
    """A draft or sampling setting that cannot be used. The message is one line for users."""


def _layer_tuple(values, name: str) -> tuple[int, ...]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"draft.{name} must list layer indices as integers >= 0, got {v!r}")
        out.append(v)
    return tuple(sorted(set(out)))


@dataclass(frozen=True)
class ExitRule:
    """Draft&Verify's draft exit (§3.4): stop drafting once the draft's top probability < threshold.

    With ``adaptive`` the threshold γ follows the paper's update after every verify step:
    AR ← β1·AR + (1−β1)·AR_e;  γ̃ = γ+ε if AR ≤ α else γ−ε;  γ ← β2·γ + (1−β2)·γ̃.
    """

    threshold: float = 0.6  # γ0: initial (or, if not adaptive, fixed) confidence threshold
    adaptive: bool = True  # update γ after each verify step
    target_acceptance: float = 0.9  # α: the acceptance rate γ steers towards
    step: float = 0.01  # ε: the size of one γ nudge
    beta1: float = 0.5  # smoothing of the running acceptance rate AR
    beta2: float = 0.9  # smoothing of γ itself

    def __post_init__(self) -> None:
        for name in ("threshold", "target_acceptance", "beta1", "beta2"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"exit.{name} must be in [0, 1], got {value}")
        if not 0.0 <= self.step <= 1.0:
            raise ConfigError(f"exit.step must be in [0, 1], got {self.step}")


# A threshold of 0 never exits early: drafting always runs to max_draft_tokens.
NO_EXIT = ExitRule(threshold=0.0, adaptive=False)


@dataclass(frozen=True)
class DraftConfig:
    """Which sublayers the draft pass skips, and how long it drafts.

    ``max_draft_tokens == 0`` means plain autoregressive decoding (no drafting at all).
    Layer indices are 0-based; they are checked against a model in ``check_layers``.
    """

    skip_attn: tuple[int, ...] = ()  # layers whose self-attention is skipped while drafting
    skip_mlp: tuple[int, ...] = ()  # layers whose MLP is skipped while drafting
    max_draft_tokens: int = 4  # K: most tokens drafted per verify step
    exit: ExitRule = field(default_factory=ExitRule)

    def __post_init__(self) -> None:
        # Normalise to sorted, de-duplicated tuples so equal configs hash equal.
        object.__setattr__(self, "skip_attn", _layer_tuple(self.skip_attn, "skip_attn"))
        object.__setattr__(self, "skip_mlp", _layer_tuple(self.skip_mlp, "skip_mlp"))
        if not isinstance(self.max_draft_tokens, int) or self.max_draft_tokens < 0:
            raise ConfigError(f"max_draft_tokens must be an integer >= 0, got {self.max_draft_tokens!r}")

    @property
    def is_autoregressive(self) -> bool:
        return self.max_draft_tokens == 0

    def check_layers(self, num_layers: int) -> None:
        """Raise ConfigError if a skipped layer index does not exist in a model of ``num_layers``."""
        for name, layers in (("skip_attn", self.skip_attn), ("skip_mlp", self.skip_mlp)):
            bad = [i for i in layers if i >= num_layers]
            if bad:
                raise ConfigError(
                    f"draft.{name} has layer index {bad[0]} but the model has {num_layers} layers (0..{num_layers - 1})"
                )

    def skip_ratio(self, num_layers: int) -> float:
        """Fraction of the 2L sublayers that the draft skips."""
        return (len(self.skip_attn) + len(self.skip_mlp)) / (2 * num_layers)



AUTOREGRESSIVE = DraftConfig(max_draft_tokens=0, exit=NO_EXIT)


def int_list(text: str, option: str) -> tuple[int, ...]:
    """``"3,5,7"`` -> (3, 5, 7): an option's comma-separated integers; anything else is a one-line ConfigError."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values:
        raise ConfigError(f"{option} must be comma-separated integers, e.g. 3,5,7; got {text[:40]!r}")
    return values


class FrozenMap(tuple):
    """A mapping frozen for hashing: its sorted (key, value) pairs. ``thaw`` gives the dict back."""


def _frozen(value: Any) -> Any:
    # Lists and dicts from YAML or JSON become tuples, so that a candidate hashes and compares by value.
    if isinstance(value, dict):
        return FrozenMap(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)) and not isinstance(value, FrozenMap):
        return tuple(_frozen(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The plain YAML/JSON value a frozen one stands for: dicts and lists again."""
    if isinstance(value, FrozenMap):
        return {k: thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Candidate:
    """One point a search evaluates and a profile ships: a draft method, its draft config, its parameters.

    ``method`` names an entry of ``skipsearch.methods``; ``params`` are that method's ``method_params``
    as (key, value) pairs, sorted, with lists frozen to tuples (empty for methods that need none).
    """

    method: str
    draft: DraftConfig
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        pairs = self.params.items() if isinstance(self.params, dict) else self.params
        object.__setattr__(self, "params", tuple(sorted((str(k), _frozen(v)) for k, v in pairs)))

    def param(self, key: str, default: Any = None) -> Any:
        return thaw(dict(self.params).get(key, default))

    def plain_params(self) -> dict[str, Any]:
        """The params as a profile's ``method_params`` holds them."""
        return {k: thaw(v) for k, v in self.params}

    @property
    def is_autoregressive(self) -> bool:
        return self.draft.is_autoregressive


@dataclass(frozen=True)
class Trace:
    """Per-position agreement of a draft config with the full model on one sequence (surrogate.trace makes it;
    a profile keeps it encoded, skipsearch.files.records)."""

    matches: tuple[bool, ...]
    confidences: tuple[float, ...]
    predictions: tuple[int, ...] = ()  # the draft's argmax at each position (compare two drafts with it)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` is greedy (argmax)."""

    temperature: float = 0.0
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose mass reaches top_p
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams()
