"""What every picture skipsearch draws shares: a matplotlib figure made without pyplot (so drawing one never
changes the backend of the process that asked, a notebook's included), and a PNG written whole or not at all.

matplotlib is optional (``pip install 'skipsearch[notebooks]'``): it is imported only when a picture is asked for,
and its absence is one line.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import secrets
from pathlib import Path

from skipsearch.config import ConfigError
from skipsearch.files.targets import PLOT, check_target

DPI = 110  # modest: the committed pictures and notebooks stay small
NO_MATPLOTLIB = "--plot needs matplotlib: pip install 'skipsearch[notebooks]'"


def check_plot_target(path: str | os.PathLike, *, replace: bool) -> Path:
    """Before any work: ``path`` can take a PNG under the overwrite rule (``files.targets``: a directory, an unwritable
    place, another kind of file is one line, TargetError), and matplotlib is there to draw it (else ConfigError)."""
    target = check_target(path, PLOT, replace=replace)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(NO_MATPLOTLIB) from None
    return target


def finite(value) -> bool:
    """A number a plot can place: a hostile or broken record may hold NaN, infinity, a string or nothing."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@contextlib.contextmanager
def drawing(out: str | os.PathLike):
    """Whatever matplotlib refuses about the values being drawn (limits out of range) as one line (ConfigError)."""
    try:
        yield
    except (ValueError, OverflowError) as e:
        raise ConfigError(f"cannot draw {out}: {' '.join(str(e).split())}") from None


def new_figure(*, figsize: tuple[float, float]):
    """An empty ``matplotlib.figure.Figure``; it renders with the Agg canvas when saved, whatever pyplot's backend."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(NO_MATPLOTLIB) from None
    return Figure(figsize=figsize, layout="constrained")


def save_png(fig, out: str | os.PathLike, *, dpi: int = DPI) -> Path:
    """Write ``fig`` as a PNG to ``out``: rendered in memory first, then a temporary file beside ``out`` renamed over
    it, so that a failed write leaves no half-written picture. An unwritable path is one line (ConfigError)."""
    out = Path(out)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # honours the umask, unlike mkstemp
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, out)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"cannot write {out}: {e.strerror or e}") from None
    return out
