"""Hybrid drafts on a grid: the lookup's suffix lengths and K, times a short list of fallback drafts.

The fallbacks are ``none`` (the lookup alone), precision drafts (every sublayer and the head in one of
``schemes``, K = the grid point's), and layer-skip drafts: the warm start's configs first
(``--warm-start``: the best skip sets another search found), then the space's probe points, each with
the full LM head and with trimmed heads of ``vocab_sizes`` tokens (FR-Spec; 0 is the full head). A
fallback keeps its own skip sets, exit rule and K (capped at the grid point's K, which bounds the
lookup's drafts). The trimmed heads' token ids are the most frequent tokens of the calibration prompts
and their greedy continuations (``layer_skip.frequent_tokens``), fixed in ``prepare``; before it (a test
without a model) they are the lowest ids, the same rule with no data.

Every point has a surrogate (the lookup replayed exactly, the fallback over its traces), so the default
two-stage search scores the grid and times the shortlist; "none" competes with every fallback, and
optimize ships plain decoding when nothing beats it. Grid labels name the configs they stand for, so a
resumed study means the same points only with the same warm start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig
from skipsearch.methods import Method
from skipsearch.methods.hybrid import METHOD as HYBRID
from skipsearch.methods.hybrid import NONE, HybridParams
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.layer_skip import LayerSkipParams, frequent_tokens
from skipsearch.methods.ngram import check_n_range
from skipsearch.methods.precision import METHOD as PRECISION
from skipsearch.methods.precision import SCHEMES, PrecisionParams
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies._base import Option, seed_points
from skipsearch.search.strategies._grid import GridStrategy
from skipsearch.search.strategies.ngram import N_VALUES

# V' of the trimmed draft head (0: the full head). smollm2-135m's head is about a fifth of its weights, so
# keeping a sixth of its 49k rows can cut a draft step by about 15%; widen the search with vocab_sizes.
VOCAB_SIZES = (0, 8192)


class HybridStrategy(GridStrategy):
    name = HYBRID.name
    methods = (HYBRID,)
    options = (
        N_VALUES,
        Option("vocab_sizes", int, VOCAB_SIZES, "trimmed heads of the layer-skip fallbacks to try, the V' most "
               "frequent tokens (0: the full head)", many=True, low=0),
        Option("schemes", str, ("fp16",), "weight formats of the precision fallbacks", many=True,
               choices=tuple(SCHEMES)),
    )
    warm_starts = True  # a warm start's skip sets are the first fallback drafts tried
    quantized_target = {"vocab_sizes": (0,)}  # no trimmed head: the int8 target's head holds no fp32 rows to copy

    def __init__(self, space: SearchSpace, *, method: Method | None = None, seed: int = 0,
                 warm_start: Sequence[DraftConfig] = (), n_values: Sequence[int] = (1, 2, 3, 4),
                 vocab_sizes: Sequence[int] = VOCAB_SIZES, schemes: Sequence[str] = ("fp16",)) -> None:
        super().__init__(space, method=method, seed=seed, warm_start=warm_start)
        self.n_values = tuple(sorted(set(n_values)))
        for n in self.n_values:
            check_n_range(self.method.name, n, n)  # every value is valid, or fail before anything runs
        # make_strategy checked the sizes' types and bound (``options``)
        self.vocab_sizes = tuple(sorted(set(vocab_sizes), key=lambda v: (v != 0, -v)))  # full head first
        # the fallback drafts, by grid label: warm start first, then the probes (seed_points' order)
        self.fallbacks: dict[str, DraftConfig] = {}
        for config in seed_points(self.space, self.warm_start):
            if config.skip_attn or config.skip_mlp:
                self.fallbacks.setdefault(_label(config), config)
        self.schemes = tuple(dict.fromkeys(schemes))
        for scheme in self.schemes:
            PrecisionParams(scheme=scheme)  # every value is valid, or fail before anything runs
        # the precision fallbacks, by grid label ("precision fp16", as studies record them) -> scheme
        self.precision_fallbacks = {f"{PRECISION.name} {s}": s for s in self.schemes}
        self._vocab: int | None = None  # the model's, once prepared
        self._heads: dict[int, LayerSkipParams] = {}  # V' -> the trimmed head's params

    def grid(self) -> dict[str, list[Any]]:
        ranges = [f"{a}-{b}" for a in self.n_values for b in self.n_values if a <= b]
        fallbacks = [NONE, *self.precision_fallbacks,
                     *(f"{label} v{v}" for label in self.fallbacks for v in self.vocab_sizes)]
        return {"n_range": ranges, "k": list(self.space.max_draft_tokens), "fallback": fallbacks}

    def prepare(self, sm, calibration, *, say: Callable[[str], None]) -> None:
        from skipsearch.methods.precision import build_drafts_aside, check_scheme

        for scheme in self.schemes:  # a precision fallback the device cannot run is refused before any trial
            try:
                check_scheme(scheme, sm.device)
            except ConfigError as e:
                raise ConfigError(f"{e} (hybrid's precision fallbacks: --schemes)") from None
        build_drafts_aside(sm, self.schemes)  # the surrogate times each compiled: built side by side, now
        self._vocab = sm.vocab_size
        data = [*calibration.prompts, *calibration.continuations]
        self._heads = {v: LayerSkipParams.trimmed(frequent_tokens(data, v, self._vocab))
                       for v in self.vocab_sizes if 0 < v < self._vocab}
        tokens = sum(map(len, data))
        say(f"{self.name}: {len(self.fallbacks)} fallback drafts; trimmed heads of "
            f"{', '.join(map(str, self._heads)) or 'no'} tokens, ranked by frequency in {tokens} calibration tokens")

    def head(self, size: int) -> LayerSkipParams:
        """The layer-skip params of a draft head of ``size`` tokens (0, or the whole vocabulary: the full head)."""
        if size == 0 or (self._vocab is not None and size >= self._vocab):
            return LayerSkipParams()
        if size not in self._heads:  # not prepared: the lowest ids
            self._heads[size] = LayerSkipParams.trimmed(range(size))
        return self._heads[size]

    def candidate(self, point: dict[str, Any]) -> Candidate:
        low, high = (int(x) for x in point["n_range"].split("-"))
        k = point["k"]
        if point["fallback"] == NONE:
            return self.propose(DraftConfig(max_draft_tokens=k, exit=NO_EXIT),
                                HybridParams(min_n=low, max_n=high, fallback=NONE))
        scheme = self.precision_fallbacks.get(point["fallback"])
        if scheme is not None:
            params = HybridParams(min_n=low, max_n=high, fallback=PRECISION.name, fallback_k=k,
                                  fallback_params=PrecisionParams(scheme=scheme).to_pairs())
            return self.propose(DraftConfig(max_draft_tokens=k, exit=NO_EXIT), params)
        label, size = point["fallback"].rsplit(" v", 1)
        config = self.fallbacks[label]
        params = HybridParams(min_n=low, max_n=high, fallback=LAYER_SKIP.name,
                              fallback_k=min(config.max_draft_tokens, k),
                              fallback_params=self.head(int(size)).to_pairs())
        return self.propose(replace(config, max_draft_tokens=k), params)


def _label(config: DraftConfig) -> str:
    """A grid value naming a layer-skip draft: its skips, K and exit rule (JSON-safe, stable)."""
    ex = config.exit
    exit_rule = f"g{ex.threshold:g}{'a' if ex.adaptive else ''}"
    return (f"attn{','.join(map(str, config.skip_attn))}|mlp{','.join(map(str, config.skip_mlp))}"
            f"|k{config.max_draft_tokens}|{exit_rule}")
