"""Which warnings reach the terminal, and how: third-party deprecation notices only with --verbose, once."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from skipsearch.notices import route_warnings

ROOT = Path(__file__).resolve().parents[1]


def _warn_from(filename: str, message: str, category: type[Warning]) -> None:
    # a warning attributed to ``filename``, as one raised by code in that file is
    exec(compile(f"import warnings\nwarnings.warn({message!r}, {category.__name__}, stacklevel=1)", filename, "exec"))


THIRD_PARTY = "/venv/lib/python3.11/site-packages/somelib/deprecation.py"
OURS = str(ROOT / "skipsearch" / "models.py")


@pytest.mark.parametrize("verbose", [False, True])
def test_third_party_deprecations_only_with_verbose_and_once(verbose):
    lines: list[str] = []
    saved = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            route_warnings(lines.append, verbose=verbose)
            for _ in range(3):
                _warn_from(THIRD_PARTY, "`x` is deprecated and will be removed in 9.0", FutureWarning)
            _warn_from(THIRD_PARTY, "plain library warning", UserWarning)
    finally:
        warnings.showwarning = saved
    deprecations = [ln for ln in lines if "deprecated" in ln]
    assert deprecations == (["warning: `x` is deprecated and will be removed in 9.0 (from somelib; shown by --verbose)"]
                            if verbose else [])
    assert "warning: plain library warning" in lines


def test_a_deprecation_raised_from_our_code_is_shown_once():
    lines: list[str] = []
    saved = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            route_warnings(lines.append)
            for _ in range(2):
                _warn_from(OURS, "`y` is deprecated", DeprecationWarning)
    finally:
        warnings.showwarning = saved
    assert lines == ["warning: `y` is deprecated"]
