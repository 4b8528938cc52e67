"""Precision drafts on a grid: scheme x K x quantized head x trimmed head x exit rule x skip set.

Every point has a surrogate (teacher-forced agreement of the quantized draft, replayed with the
scheme's measured per-sublayer costs), so the default two-stage search scores the whole grid and
times the shortlist. The skip sets are ``none`` (every sublayer quantized) and the warm start's
(``--warm-start``: a layer-skip profile's skip sets, the rest of the draft quantized), so a search
can weigh skipping against quantizing the same sublayers. The trimmed heads (``vocab_sizes``, FR-Spec; 0 is
the whole vocabulary) keep the most frequent tokens of the calibration prompts and their continuations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig, ExitRule
from skipsearch.methods import Method
from skipsearch.methods.layer_skip import LayerSkipParams, frequent_tokens
from skipsearch.methods.precision import METHOD as PRECISION
from skipsearch.methods.precision import SCHEMES, PrecisionParams, build_drafts_aside, check_scheme
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies._base import Option
from skipsearch.search.strategies._grid import GridStrategy

NONE = "none"
# A quantized copy of a model agrees with it on nearly every token, so its best K is longer than a
# layer-skip draft's: the grid reaches further.
K_VALUES = (2, 3, 4, 6, 8, 10, 12)
EXITS = {NONE: NO_EXIT, "g0.5a": ExitRule(threshold=0.5, adaptive=True)}
# What a skip-set strategy (bayes, clasp) takes to search precision drafts: the declaration they share.
ONE_SCHEME = Option("schemes", str, (), "search precision drafts: the skip set's kept sublayers quantized in this "
                    "one weight format", many=True, choices=tuple(SCHEMES), method=PRECISION)


class PrecisionStrategy(GridStrategy):
    name = PRECISION.name
    methods = (PRECISION,)
    options = (
        Option("schemes", str, ("fp16", "int8", "int4"), "weight formats of the draft's copy, e.g. fp16,int8,int4 "
               "(CPU) or int8,int4,fp8 (CUDA)", many=True, choices=tuple(SCHEMES)),
        Option("k_values", int, K_VALUES, "draft lengths K to try", many=True, low=1),
        Option("vocab_sizes", int, (0, 16384), "trimmed draft heads to try, the V' most frequent tokens (0: the full "
               "head)", many=True, low=0),
    )
    warm_starts = True  # a layer-skip profile's skip sets join the grid as skip patterns

    def __init__(self, space: SearchSpace, *, method: Method | None = None, seed: int = 0,
                 warm_start: Sequence[DraftConfig] = (), schemes: Sequence[str] = ("fp16", "int8", "int4"),
                 k_values: Sequence[int] = K_VALUES, vocab_sizes: Sequence[int] = (0, 16384)) -> None:
        super().__init__(space, method=method, seed=seed, warm_start=warm_start)
        # make_strategy checked the values' types and bounds (``options``); the schemes are the method's to check
        self.schemes = tuple(dict.fromkeys(schemes))
        for scheme in self.schemes:
            PrecisionParams(scheme=scheme)  # every value is valid, or fail before anything runs
        if not self.schemes:
            raise ConfigError(f"precision needs at least one scheme: {', '.join(SCHEMES)}")
        self.k_values = tuple(sorted(set(k_values)))
        self.vocab_sizes = tuple(sorted(set(vocab_sizes)))
        self._heads: dict[int, LayerSkipParams] = {}  # V' -> the trimmed head's keys, from the calibration data
        self.skips: dict[str, DraftConfig] = {NONE: DraftConfig()}
        for config in self.warm_start:
            if config.skip_attn or config.skip_mlp:
                label = f"attn{','.join(map(str, config.skip_attn))}|mlp{','.join(map(str, config.skip_mlp))}"
                self.skips.setdefault(label, config)

    def grid(self) -> dict[str, list[Any]]:
        return {"scheme": list(self.schemes), "k": list(self.k_values), "quant_head": [True, False],
                "vocab": list(self.vocab_sizes), "exit": list(EXITS), "skip": list(self.skips)}

    def prepare(self, sm, calibration, *, say: Callable[[str], None]) -> None:
        check_runnable(self.schemes, sm.device)
        build_drafts_aside(sm, self.schemes)  # the surrogate times each compiled: built side by side, now
        vocab = sm.vocab_size
        data = [*calibration.prompts, *calibration.continuations]
        self._heads = {v: LayerSkipParams.trimmed(frequent_tokens(data, v, vocab)) if v < vocab else LayerSkipParams()
                       for v in self.vocab_sizes if v > 0}
        say(f"{self.name}: schemes {', '.join(self.schemes)} on {sm.device.type}; skip patterns: "
            f"{', '.join(self.skips)}")

    def candidate(self, point: dict[str, Any]) -> Candidate:
        skips = self.skips[point["skip"]]
        draft = DraftConfig(skip_attn=skips.skip_attn, skip_mlp=skips.skip_mlp, max_draft_tokens=point["k"],
                            exit=EXITS[point["exit"]])
        size = point.get("vocab", 0)
        head = self._heads.get(size)
        if head is None:  # not prepared (no model yet): the lowest ids, the same rule with no data
            head = LayerSkipParams.trimmed(range(size)) if size else LayerSkipParams()
        return self.propose(draft, PrecisionParams(scheme=point["scheme"], quant_head=point["quant_head"],
                                                   **dict(head.to_pairs())))


def one_scheme(strategy: str, schemes: Sequence[str]) -> PrecisionParams | None:
    """For a skip-set strategy (bayes, clasp) given ``--schemes``: the precision params its candidates carry,
    every sublayer it does not skip quantized in the one scheme (None: it searches layer-skip drafts)."""
    schemes = tuple(dict.fromkeys(schemes))
    if len(schemes) > 1:
        raise ConfigError(f"strategy '{strategy}' searches skip sets for one precision scheme: give one of "
                          f"{', '.join(schemes)} (tpe and precision search several)")
    return PrecisionParams(scheme=schemes[0]) if schemes else None


def check_runnable(schemes: Sequence[str], device) -> None:
    """A one-line ConfigError, before any trial, when the device has no kernel for one of ``schemes``."""
    for scheme in schemes:
        try:
            check_scheme(scheme, device)
        except ConfigError as e:
            raise ConfigError(f"{e} (--schemes)") from None
