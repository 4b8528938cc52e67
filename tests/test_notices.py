"""Which warnings reach the terminal, and how: third-party deprecation notices only with --verbose, once."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from skipsearch.notices import route_warnings

ROOT = Path(__file__).resolve().parents[1]


def _warn_from(filename: str, message: str, category: type[Warning], module: str | None = None) -> None:
    # a warning attributed to ``filename`` (and, given ``module``, to that module), as one raised by code there is
    code = compile(f"import warnings\nwarnings.warn({message!r}, {category.__name__}, stacklevel=1)", filename, "exec")
    exec(code, {"__name__": module} if module else None)


THIRD_PARTY = "/venv/lib/python3.11/site-packages/somelib/deprecation.py"
OURS = str(ROOT / "skipsearch" / "model" / "skippable.py")


@contextlib.contextmanager
def _routed(*, verbose: bool = False):
    """Warnings routed into the list it yields, every warning let through; Python's own hook restored after."""
    lines: list[str] = []
    saved = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            route_warnings(lines.append, verbose=verbose)
            yield lines
    finally:
        warnings.showwarning = saved


@pytest.mark.parametrize("verbose", [False, True])
def test_third_party_deprecations_only_with_verbose_and_once(verbose):
    with _routed(verbose=verbose) as lines:
        for _ in range(3):
            _warn_from(THIRD_PARTY, "`x` is deprecated and will be removed in 9.0", FutureWarning)
        _warn_from(THIRD_PARTY, "plain library warning", UserWarning)
    deprecations = [ln for ln in lines if "deprecated" in ln]
    assert deprecations == (["warning: `x` is deprecated and will be removed in 9.0 (from somelib; shown by --verbose)"]
                            if verbose else [])
    assert "warning: plain library warning" in lines


def test_a_library_user_warning_that_says_deprecated_is_a_deprecation_notice():
    # torch's inductor warns "TypedStorage is deprecated ..." as a plain UserWarning, about its own use of torch
    with _routed() as lines:
        _warn_from(THIRD_PARTY, "TypedStorage is deprecated. It will be removed in the future", UserWarning)
        _warn_from(OURS, "this draft is deprecated here", UserWarning)  # ours: always shown
    assert lines == ["warning: this draft is deprecated here"]


@pytest.mark.parametrize("verbose", [False, True])
def test_a_deprecation_transformers_logs_is_shown_only_with_verbose(verbose):
    from transformers.utils import logging as hf_logging

    saved = warnings.showwarning
    handler = hf_logging.get_logger("transformers").handlers[0]
    try:
        route_warnings(lambda _line: None, verbose=verbose)
        deprecation = logging.LogRecord("transformers.generation.utils", logging.WARNING, __file__, 1,
                                        "Passing `x` together with `y` is deprecated and will be removed", None, None)
        other = logging.LogRecord("transformers.generation.utils", logging.WARNING, __file__, 1, "a plain notice",
                                  None, None)
        assert bool(handler.filter(deprecation)) is verbose
        assert handler.filter(other)
    finally:
        warnings.showwarning = saved
        route_warnings(lambda _line: None, verbose=True)  # leave the handler as it was
        warnings.showwarning = saved


def test_a_deprecation_raised_from_our_code_is_shown_once():
    with _routed() as lines:
        for _ in range(2):
            _warn_from(OURS, "`y` is deprecated", DeprecationWarning)
    assert lines == ["warning: `y` is deprecated"]


def test_python_default_filters_keep_our_deprecation_and_drop_a_libraries():
    # As in a plain `skipsearch` process: DeprecationWarning is ignored outside __main__ unless a filter lets it in.
    lines: list[str] = []
    saved = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            warnings.simplefilter("ignore", DeprecationWarning)
            route_warnings(lines.append)
            _warn_from(OURS, "`ours` is deprecated", DeprecationWarning, module="skipsearch.model.skippable")
            _warn_from(THIRD_PARTY, "`theirs` is deprecated", DeprecationWarning, module="somelib.deprecation")
            _warn_from(THIRD_PARTY, "a library's own warning", UserWarning, module="somelib.deprecation")
    finally:
        warnings.showwarning = saved
    assert lines == ["warning: `ours` is deprecated", "warning: a library's own warning"]


# -- end to end: the real transformers notice, through the CLI -------------------------------------------------
def _decode_with_the_old_cache_name(checkpoint: Path, *flags: str) -> subprocess.CompletedProcess:
    # A deterministic trigger: the adapter passes the KV cache as `past_key_values`, the name transformers
    # 5.24-5.39 still takes but warns about on every forward (README command 1 once printed that notice 7 times).
    script = textwrap.dedent(f"""
        import sys
        import skipsearch.kv_cache
        skipsearch.kv_cache.cache_parameter = lambda forward: "past_key_values"
        sys.argv = ["skipsearch", *{list(flags)!r}, "decode", "--model", {str(checkpoint)!r},
                    "--prompt", "def fib ( n ) :", "--max-new-tokens", "6", "--device", "cpu"]
        from skipsearch.__main__ import main
        main()
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


def test_a_transformers_deprecation_stays_off_the_terminal_unless_verbose(tiny_checkpoint):
    from transformers import LlamaForCausalLM

    if "cache" not in inspect.signature(LlamaForCausalLM.forward).parameters:
        pytest.skip("this transformers has no `cache` argument, so `past_key_values` is not deprecated in it")
    plain = _decode_with_the_old_cache_name(tiny_checkpoint)
    verbose = _decode_with_the_old_cache_name(tiny_checkpoint, "--verbose")
    assert plain.returncode == 0 and verbose.returncode == 0, plain.stderr + verbose.stderr
    assert plain.stdout == verbose.stdout and plain.stdout.strip()  # the same decode either way
    assert "past_key_values" not in plain.stderr and "deprecat" not in plain.stderr.lower(), plain.stderr
    notices = [ln for ln in verbose.stderr.splitlines() if "past_key_values" in ln]
    # once, although every forward warns, and named after the library that issued it
    assert len(notices) == 1, verbose.stderr
    assert notices[0].startswith("warning: `past_key_values` is deprecated")
    assert notices[0].endswith("(from transformers; shown by --verbose)")


def test_a_librarys_clean_up_error_after_ctrl_c_is_not_printed_and_other_errors_are():
    # Ctrl-C inside one of SQLAlchemy's queries (seen in test_hostile's interrupted search): it closes the
    # connection, cannot close the cursor, and logs that with a traceback through Python's last-resort handler,
    # after which the CLI says `interrupted`. That record is dropped; a record of any other error still prints. In
    # a process of its own, as the CLI's: pytest's log capture would take the records first.
    script = textwrap.dedent("""
        import logging, sqlite3
        from skipsearch.notices import route_warnings

        route_warnings(lambda text: None)
        log = logging.getLogger("sqlalchemy.pool.impl.QueuePool")  # no handler of its own, as in the CLI
        try:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
        except sqlite3.ProgrammingError:
            log.error("Error closing cursor after Ctrl-C", exc_info=True)
        try:
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
        except sqlite3.ProgrammingError:
            log.error("Error closing cursor", exc_info=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("Error closing cursor\nTraceback") and "closed database" in done.stderr
    assert "after Ctrl-C" not in done.stderr and "KeyboardInterrupt" not in done.stderr
