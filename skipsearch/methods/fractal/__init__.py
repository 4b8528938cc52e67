"""``fractal``: FractalLLM's 8-bit layers embedded in the model draft w+n+1 tokens in one pass.

``method_params`` are n (fractal layers), w (draft slots), the layers they sit in front of, the
quantization scheme and the slot token. The package holds the compressed copy
(``compressed.py``), the draft pass and drafter (``drafter.py``), the params (``params.py``), and its record
and re-plan (``surrogate.py`` makes the record, ``replan.py`` prices it under another device's costs); the
``fractal`` strategy (an (n, w) grid on Optuna's GridSampler, every point timed) searches it.
"""

from __future__ import annotations

from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig
from skipsearch.methods.base import Method, ParamsError
from skipsearch.methods.fractal.params import MAX_W, SCHEMES, FractalParams, even_positions, resolve_scheme
from skipsearch.methods.fractal.replan import RECORD, replan


def _drafter(candidate: Candidate, sm):
    from skipsearch.methods.fractal.drafter import FractalDrafter

    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    try:
        return FractalDrafter(sm, params, max_draft_tokens=candidate.draft.max_draft_tokens)
    except ParamsError:
        raise
    except ConfigError as e:  # the device cannot run the scheme, or the slot token is not in the vocabulary
        raise ParamsError(f"fractal: {e}") from None


def _measure_schemes(sm, context, schemes, *, repeats: int = 9):
    from skipsearch.methods.fractal.surrogate import measure_scheme_costs

    return measure_scheme_costs(sm, context, schemes, repeats=repeats)


def _example(num_layers: int) -> Candidate:
    params = FractalParams(n=1, w=2, layers=(num_layers // 2,))
    return METHOD.candidate(DraftConfig(max_draft_tokens=params.max_draft_tokens, exit=NO_EXIT), params)


METHOD = Method(
    name=FractalParams.method,
    summary="FractalLLM: 8-bit copies of the model's layers embedded in it draft w+n+1 tokens per pass",
    params=FractalParams,
    drafter=_drafter,
    example=_example,
    strategy="fractal",
    cost_schemes=tuple(s for s in SCHEMES if s != "none"),
    measure_schemes=_measure_schemes,
    record=RECORD,
    replan=replan,
)


# The compressed copy (compressed.py) and the draft pass and drafter (drafter.py) load torch: import them from
# their modules.
__all__ = ["MAX_W", "METHOD", "SCHEMES", "FractalParams", "even_positions", "resolve_scheme"]
