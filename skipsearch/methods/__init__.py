"""The method registry: every draft method skipsearch can search, ship, decode and re-plan.

Each method is a package here (``layer_skip/``, ``clasp_dynamic/``, ``fractal/``, ``hierarchical/``,
``precision/``, ``hybrid/``) or, when light, one module (``ngram.py``) that exports one ``METHOD`` record; what
they share (the record, ``Params``, ``ParamsError``, the validators, the record and re-plan types, the registry's
functions) is in ``base.py``. Adding a method is its package plus one ``register(...)`` line below.
"""

from __future__ import annotations

from skipsearch.config import Candidate
from skipsearch.methods.base import (
    REGISTRY,
    DraftModel,
    Keeping,
    Kept,
    Lookup,
    Method,
    Params,
    ParamsError,
    Record,
    Replanned,
    Replanning,
    Setting,
    Speculation,
    Traced,
    Tracing,
    batch_drafter,
    batch_methods,
    build_drafter,
    candidate_for,
    check_batchable,
    check_kernel_fits,
    check_keys,
    check_target,
    choice_param,
    copies_weights,
    get,
    int_param,
    layers_param,
    measure_scheme_costs,
    names,
    record_keys,
    record_reader,
    register,
    replan_schemes,
    scheme_draft,
    scheme_method,
    setting_of,
    unregister,
)

__all__ = ["PLAIN", "REGISTRY", "DraftModel", "Keeping", "Kept", "Lookup", "Method", "Params", "ParamsError",
           "Record", "Replanned", "Replanning", "Setting", "Speculation", "Traced", "Tracing", "batch_drafter",
           "batch_methods", "build_drafter", "candidate_for", "check_batchable", "check_keys", "check_kernel_fits",
           "check_target", "choice_param", "copies_weights", "get",
           "int_param", "is_plain", "layers_param", "measure_scheme_costs", "names", "record_keys", "record_reader",
           "register", "replan_schemes", "scheme_draft", "scheme_method", "setting_of", "unregister"]

# The registry: one line per method (its package, then its record).
from skipsearch.methods import layer_skip; register(layer_skip.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import clasp_dynamic; register(clasp_dynamic.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import fractal; register(fractal.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import hierarchical; register(hierarchical.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import ngram; register(ngram.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import hybrid; register(hybrid.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import precision; register(precision.METHOD)  # noqa: E402, E702, I001

# The plain method: a bare DraftConfig's (skip sets, K and exit rule, nothing more), so its acceptance is its skip
# set's traces. Studies made before trials recorded their method hold its candidates, and what reads a study's skip
# sets (re-ranking under other costs, the hierarchy planner's levels) reads its trials.
PLAIN = layer_skip.METHOD.name


def is_plain(candidate: Candidate | None) -> bool:
    """Whether ``candidate`` is of the plain method (a bare draft config)."""
    return candidate is not None and candidate.method == PLAIN
