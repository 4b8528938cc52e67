"""How library warnings reach the terminal: one plain ``warning:`` line each, deprecations once, and a
third-party deprecation notice only with ``--verbose``; and how the library marks a long step (``long_step``).

A deprecation that skipsearch's own code triggers names a call of ours (the warning is attributed to
our frame), so it is shown, once per process: it is ours to fix at its source. One raised inside a
library about the library's own use of another (torch about torchao, transformers about torch) is no
one's to act on here, so it is kept off the terminal unless ``--verbose`` asks for it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
SAYS_DEPRECATED = "is deprecated"  # how a library's plain warning or log line announces a deprecation
_PACKAGE_DIR = Path(__file__).resolve().parent


@contextlib.contextmanager
def long_step(log: logging.Logger, message: str, *args) -> Iterator[None]:
    """Log ``message % args`` with the ``step`` marks a long step carries (``extra={"step": "start"}``, then
    ``"end"`` with its seconds appended), which the CLI shows as a ticking line on stderr (``cli.edge``)."""
    log.info(message, *args, extra={"step": "start"})
    t0 = time.perf_counter()
    yield
    log.info(f"{message} %.0f s", *args, time.perf_counter() - t0, extra={"step": "end"})


def ours(filename: str) -> bool:
    """Whether a warning attributed to ``filename`` was raised from skipsearch's own code."""
    try:
        return Path(filename).resolve().is_relative_to(_PACKAGE_DIR)
    except (OSError, ValueError):
        return False


def _origin(filename: str) -> str:
    # .../site-packages/transformers/utils/deprecation.py -> transformers
    parts = Path(filename).parts
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts and parts.index(anchor) + 1 < len(parts):
            return parts[parts.index(anchor) + 1].removesuffix(".py")
    return Path(filename).name


def _issuer(filename: str) -> str:
    """The package that issued the warning being shown: the first frame below the ``warnings`` machinery.
    A library's deprecation decorator warns with a stacklevel that names its caller's file (for transformers'
    ``past_key_values`` notice, torch's ``Module.__call__``), so ``filename`` alone would misname the library."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in ("warnings", "_py_warnings", __name__):
        frame = frame.f_back
    return _origin(frame.f_code.co_filename if frame is not None else filename)


def is_deprecation(message: object, category: type, filename: str) -> bool:
    """A deprecation notice: a warning of a deprecation category, or a library's plain ``UserWarning`` that says
    something "is deprecated" (torch's inductor warns ``TypedStorage is deprecated`` that way, about its own use)."""
    if issubclass(category, DEPRECATIONS):
        return True
    return issubclass(category, UserWarning) and not ours(filename) and SAYS_DEPRECATED in str(message)


class _DropDeprecations(logging.Filter):
    """Off a library's log handler: its own deprecation notices (transformers logs some, e.g. about how its
    assisted generation calls its own ``generate``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return SAYS_DEPRECATED not in record.getMessage()


_DROP = _DropDeprecations()
_ROUTED: dict[str, bool] = {}  # {"verbose": ...} once route_warnings has run


def route_library_logs() -> None:
    """transformers logs some deprecations instead of warning them: those, too, only with ``--verbose``. A no-op
    until ``route_warnings`` has run; called where skipsearch loads transformers (``loader.load_model``), so no
    command pays transformers' import before it has checked its input."""
    if "verbose" not in _ROUTED or "transformers" not in sys.modules:
        return
    from transformers.utils import logging as hf_logging

    for handler in hf_logging.get_logger("transformers").handlers:
        (handler.removeFilter if _ROUTED["verbose"] else handler.addFilter)(_DROP)


def quiet_optional_kernels() -> None:
    """torchao, imported by transformers and by the low-bit drafts, logs a warning per optional CUDA extension it
    cannot load on this machine, and torch one deprecation line per enum torchao registers: none of it is the user's
    concern (its errors still show). Called before anything imports torchao: by every command (``route_warnings``
    without ``--verbose``) and where a model loads."""
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _after_interrupt(record: logging.LogRecord) -> bool:
    """False for a library's log record of an error raised while an interrupt was being handled: the clean-up
    complaints that follow Ctrl-C, which the CLI reports itself (``interrupted``, exit 130). SQLAlchemy logs one,
    with a traceback, when Ctrl-C lands inside a query: it closes the connection, then cannot close the cursor
    ("Error closing cursor ... Cannot operate on a closed database"). Installed on Python's last-resort handler,
    which prints the records of loggers that have no handler of their own; every other record passes."""
    error, seen = record.exc_info[1] if record.exc_info else None, set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return False
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return True


def route_warnings(echo: Callable[[str], None], *, verbose: bool = False) -> None:
    """Send every warning to ``echo`` as one ``warning:`` line, by the rules above (replaces
    ``warnings.showwarning`` for the process). A deprecation is shown once per distinct message. A library's log
    record of an error raised while an interrupt was handled is dropped (``_after_interrupt``)."""
    seen: set[tuple[type, str]] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if is_deprecation(message, category, filename):
            if not verbose and not ours(filename):
                return
            key = (category, str(message))
            if key in seen:
                return
            seen.add(key)
            if not ours(filename):
                echo(f"warning: {message} (from {_issuer(filename)}; shown by --verbose)")
                return
        echo(f"warning: {message}")

    warnings.showwarning = show
    _ROUTED["verbose"] = verbose
    if logging.lastResort is not None and _after_interrupt not in logging.lastResort.filters:
        logging.lastResort.addFilter(_after_interrupt)
    if not verbose:
        quiet_optional_kernels()
    route_library_logs()  # where transformers is loaded already
    # Python hides DeprecationWarning outside __main__ by default: one raised from a skipsearch module is
    # let through (shown once, above), and --verbose asks for all of them.
    for category in (DeprecationWarning, PendingDeprecationWarning):
        if verbose:
            warnings.simplefilter("default", category)
        else:
            warnings.filterwarnings("default", category=category, module=r"skipsearch(\.|$)")
