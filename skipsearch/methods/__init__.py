"""The method registry: every draft method skipsearch can search, ship and decode.

Each method is a package here (``layer_skip/``, ``clasp_dynamic/``, ``fractal/``, ``hierarchical/``) or,
when light, one module (``ngram.py``, ``hybrid.py``) that exports one ``METHOD`` record; what they share
(the record, ``Params``, ``ParamsError``, the validators, the registry's functions) is in ``base.py``.
Adding a method is its package plus one ``register(...)`` line below.
"""

from __future__ import annotations

from skipsearch.methods.base import (
    REGISTRY,
    Method,
    Params,
    ParamsError,
    build_drafter,
    check_keys,
    choice_param,
    get,
    int_param,
    layers_param,
    measure_scheme_costs,
    names,
    register,
    replan_schemes,
    scheme_method,
    unregister,
)

__all__ = ["REGISTRY", "Method", "Params", "ParamsError", "build_drafter", "check_keys", "choice_param", "get",
           "int_param", "layers_param", "measure_scheme_costs", "names", "register", "replan_schemes", "scheme_method",
           "unregister"]

# The registry: one line per method (its package, then its record).
from skipsearch.methods import layer_skip; register(layer_skip.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import clasp_dynamic; register(clasp_dynamic.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import fractal; register(fractal.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import hierarchical; register(hierarchical.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import ngram; register(ngram.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import hybrid; register(hybrid.METHOD)  # noqa: E402, E702, I001
from skipsearch.methods import precision; register(precision.METHOD)  # noqa: E402, E702, I001
