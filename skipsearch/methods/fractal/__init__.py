"""``fractal``: FractalLLM's 8-bit layers embedded in the model draft w+n+1 tokens in one pass.

``method_params`` are n (fractal layers), w (draft slots), the layers they sit in front of, the
quantization scheme and the slot token. The package holds the compressed copy
(``compressed.py``), the draft pass and drafter (``drafter.py``), the params (``params.py``), and its record
(``record.py``; ``surrogate.py`` makes it) and re-plan (``replan.py`` prices it under another device's costs); the
``fractal`` strategy (an (n, w) grid on Optuna's GridSampler, every point timed) searches it. As a hybrid's
fallback it drafts alone (where it drafts there it is timed: its record is of its own cycles).
"""

from __future__ import annotations

from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig
from skipsearch.methods.base import Method, ParamsError
from skipsearch.methods.fractal.params import MAX_W, SCHEMES, FractalParams, even_positions, resolve_scheme
from skipsearch.methods.fractal.record import FRACTAL_KEY, FractalRecord, fractal_from_dict, fractal_to_dict
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


def _replan_schemes(candidate: Candidate, device: str) -> tuple[str, ...]:
    # the compressed layers' scheme the drafter runs on ``device`` (auto resolved there); none for the ablation
    try:
        scheme = resolve_scheme(candidate.param("quantization", "auto"), device)
    except ConfigError:  # a scheme the device cannot run: there is nothing to measure there
        return ()
    return () if scheme == "none" else (scheme,)


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
    replan_schemes=_replan_schemes,
    drafts_alone=True,
    copies_weights=lambda candidate: True,
)


# The compressed copy (compressed.py) and the draft pass and drafter (drafter.py) load torch: import them from
# their modules.
__all__ = ["FRACTAL_KEY", "MAX_W", "METHOD", "SCHEMES", "FractalParams", "FractalRecord", "even_positions",
           "fractal_from_dict", "fractal_to_dict", "resolve_scheme"]
