"""The hybrid's ``method_params``: the lookup's suffix lengths, the fallback and its K, the fallback's own params."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from skipsearch.config import Candidate, ConfigError, DraftConfig
from skipsearch.methods.base import (
    REGISTRY,
    ParamsError,
    Tracing,
    get,
    int_param,
    parse_params,
)
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.ngram import (
    check_n_range,
)

NONE = "none"  # no fallback: the lookup alone
_OWN = ("min_n", "max_n", "fallback", "fallback_k")


def fallbacks() -> tuple[str, ...]:
    """What ``method_params.fallback`` may name: every registered method that drafts alone
    (``Method.drafts_alone``), in registry order, then none."""
    return (*(m.name for m in REGISTRY.values() if m.drafts_alone), NONE)


def _tracing(fallback: Any) -> Tracing | None:
    """The fallback's trace hooks (``Method.traces``): its skip sets are the profile's draft.skip_*, and the
    surrogate, the record and re-planning replay it. None: none, or a fallback that can only be timed."""
    method = REGISTRY.get(fallback) if isinstance(fallback, str) else None
    return method.traces if method is not None else None


@dataclass(frozen=True)
class HybridParams:
    method: ClassVar[str] = "hybrid"
    min_n: int = 1  # shortest suffix looked up
    max_n: int = 3  # longest suffix looked up (tried first)
    fallback: str = LAYER_SKIP.name  # the source of a cycle whose lookup finds nothing; "none": no draft then
    fallback_k: int | None = None  # the most tokens the fallback drafts a cycle; None: the draft's K
    fallback_params: tuple[tuple[str, Any], ...] = ()  # the fallback method's own method_params

    def __post_init__(self) -> None:
        check_n_range(self.method, self.min_n, self.max_n)
        allowed = fallbacks()
        if self.fallback not in allowed:
            shown = self.fallback if isinstance(self.fallback, str) else type(self.fallback).__name__
            raise ParamsError(f"hybrid: method_params.fallback must be one of {', '.join(allowed)}, got "
                              f"{shown[:40]!r}")
        if self.fallback_k is not None:
            int_param(self.method, {"fallback_k": self.fallback_k}, "fallback_k", low=1)
        if self.fallback == NONE and (self.fallback_k is not None or self.fallback_params):
            raise ParamsError("hybrid: with fallback none, method_params takes no fallback_k and no fallback keys")
        object.__setattr__(self, "fallback_params", tuple(sorted(dict(self.fallback_params).items())))

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> HybridParams:
        fallback = raw.get("fallback", cls.fallback)
        theirs = (tuple(f.name for f in fields(get(fallback).params)) if fallback != NONE and fallback in fallbacks()
                  else ())
        for key in raw:
            if key not in _OWN and key not in theirs:
                shown = key[:40] if isinstance(key, str) else type(key).__name__
                raise ParamsError(f"hybrid: unknown key method_params.{shown} (known with fallback "
                                  f"{fallback if isinstance(fallback, str) else '?'}: {', '.join((*_OWN, *theirs))})")
        params = cls(min_n=raw.get("min_n", cls.min_n), max_n=raw.get("max_n", cls.max_n), fallback=fallback,
                     fallback_k=raw.get("fallback_k"), fallback_params=tuple((k, raw[k]) for k in theirs if k in raw))
        if _tracing(params.fallback) is None and (draft.skip_attn or draft.skip_mlp):
            raise ParamsError(f"hybrid: draft.skip_attn and draft.skip_mlp must be empty with fallback "
                              f"{params.fallback} (they are the layer-skip fallback's)")
        k = draft.max_draft_tokens
        if k and params.fallback_k is not None and params.fallback_k > k:
            raise ParamsError(f"hybrid: method_params.fallback_k ({params.fallback_k}) must be <= the draft's "
                              f"max_draft_tokens ({k})")
        fb = params.fallback_candidate(draft)
        if fb is not None:
            try:
                get(fb.method).parse(fb.params, draft=fb.draft, num_layers=num_layers)
            except ConfigError as e:
                raise ParamsError(f"hybrid: fallback {e}") from None
        return params

    def fallback_candidate(self, draft: DraftConfig) -> Candidate | None:
        """The fallback as a candidate of its own method: the draft config with K = fallback_k."""
        if self.fallback == NONE:
            return None
        return Candidate(self.fallback, replace(draft, max_draft_tokens=self.fallback_k or draft.max_draft_tokens),
                         self.fallback_params)

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        own = [("min_n", self.min_n), ("max_n", self.max_n), ("fallback", self.fallback)]
        if self.fallback_k is not None:
            own.append(("fallback_k", self.fallback_k))
        return (*own, *self.fallback_params)


def parse(raw: Mapping[str, Any] | Sequence[tuple[str, Any]], *, draft: DraftConfig, num_layers: int) -> HybridParams:
    """``method_params`` as the registry reads them (``Method.parse``)."""
    return parse_params(HybridParams, raw, draft=draft, num_layers=num_layers)
