"""What every ``skipsearch`` command shares at the edge: bad input as one line and exit 2 (Ctrl-C: 130), the bound
checker of numeric options, library warnings and log lines on stderr, a progress bar that opens late, and writes
that lose nothing: every file a command writes goes through one of the writers here, each of which applies the one
overwrite rule (``skipsearch.files.targets.check_target``) first."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from pathlib import Path

import typer

from skipsearch.checkpoints import ModelError
from skipsearch.config import ConfigError
from skipsearch.data import DataError
from skipsearch.files import targets
from skipsearch.files.errors import ProfileError, StudyError, TargetError
from skipsearch.interrupts import interrupt_seen
from skipsearch.notices import route_warnings
from skipsearch.profile import save_profile

USER_ERRORS: tuple[type[Exception], ...] = (ProfileError, ModelError, DataError, ConfigError, StudyError)


def line(text: object) -> str:
    """``text`` as one printable line: runs of whitespace collapsed, and any other control character (a terminal
    escape carried in from a shared file, a model name, a study) shown escaped rather than sent to the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(str(text).split()))


def finite(value: float | None) -> float | None:
    """A float option's callback: its value is a finite number. Its range is declared beside it (``min=``/``max=``,
    shown in --help), but click's range lets nan and inf through."""
    if value is not None and not math.isfinite(value):
        import typer

        raise typer.BadParameter(f"{value} is not a finite number")
    return value


@contextlib.contextmanager
def user_errors():
    """Turn known bad input into one line on stderr and exit 2; Ctrl-C into exit 130 (also where native code turned
    the interrupt into an error that reads as bad input)."""
    try:
        yield
    except USER_ERRORS as exc:
        if interrupt_seen():
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        typer.echo(f"error: {line(exc)}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None


class _CurrentStderr(logging.Handler):
    """A log line to whatever sys.stderr is when it is logged (a StreamHandler keeps the stream it was made with,
    which a second in-process run, e.g. typer's CliRunner, may have closed since).

    A long step the library marks (``extra={"step": "start"}`` ... ``"end"``, e.g. compiling a kernel) shows its
    seconds as they pass on a terminal (one line, rewritten each second), and its total when it ends."""

    def __init__(self) -> None:
        super().__init__()
        self._ticker: Elapsed | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            step = getattr(record, "step", None)
            if self._ticker is not None:
                self._ticker.stop()
                self._ticker = None
            if step == "start":
                self._ticker = Elapsed(self.format(record))
                self._ticker.start()
            else:
                sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never fail a run
            self.handleError(record)


class Elapsed:
    """``what`` on stderr, followed on a terminal by the seconds since it began, rewritten in place each second
    (elsewhere, a log or a pipe, the line alone: the step's end says its total)."""

    def __init__(self, what: str, *, every: float = 1.0) -> None:
        import threading

        self.what, self.every = what, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._stream = sys.stderr
        self._live = bool(getattr(self._stream, "isatty", lambda: False)())

    def start(self) -> None:
        if not self._live:
            self._stream.write(self.what + "\n")
            return
        self._stream.write(self.what)
        self._stream.flush()
        self._thread.start()

    def _tick(self) -> None:
        import time

        began = time.monotonic()
        while not self._stop.wait(self.every):
            self._stream.write(f"\r{self.what} {time.monotonic() - began:.0f} s")
            self._stream.flush()

    def stop(self) -> None:
        if self._live:
            self._stop.set()
            self._thread.join()
            self._stream.write("\r\x1b[2K")  # the live line gives way to the step's own end line
            self._stream.flush()


VERBOSE = False  # set by `skipsearch --verbose` (the app's callback), for every command of that run


def warnings_to_stderr() -> None:
    # Library warnings (e.g. a forced fingerprint mismatch) as one plain line each (third-party deprecation
    # notices only with --verbose: notices.py), and skipsearch's own informational lines (where a model is
    # placed, and why) likewise.
    route_warnings(lambda text: typer.echo(line(text), err=True), verbose=VERBOSE)
    log = logging.getLogger("skipsearch")
    if not any(getattr(h, "skipsearch_cli", False) for h in log.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.skipsearch_cli = True
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class LazyProgress:
    """A rich progress bar that opens at the library's first report (``stage``), so that nothing is drawn while
    the input is checked and the model loads, and closes with the ``with`` block.

    Where stderr is not a terminal (a log, a pipe) rich draws the bar once, at the end: there each stage says so in
    a line as it opens, its count is written again every ``every`` seconds, so that a slow step is never silent,
    and a line says how long it took when it closes."""

    def __init__(self, *columns, every: float = 30.0, **kwargs) -> None:
        self._columns, self._kwargs = columns, kwargs
        self.progress = None  # rich.progress.Progress, once a stage has opened
        self.task = None  # the last stage's task
        self._every, self._said = every, 0.0

    def stage(self, title: str, total: int | None, **fields):
        if self.progress is None:
            from rich.progress import Progress

            self.progress = Progress(*self._columns, **self._kwargs)
            self.progress.start()
        self._close_stage()
        self.task = self.progress.add_task(title, total=total, **fields)
        self._say(self.task, force=True)
        return self.task

    def _close_stage(self) -> None:
        """The open stage ends where the next opens (or the block closes): its clock stops there, and where stderr
        is not a terminal a line says how long it took."""
        if self.task is None:
            return
        self.progress.stop_task(self.task)
        t = next((t for t in self.progress.tasks if t.id == self.task), None)
        if t is not None and not self.progress.console.is_terminal:
            self.progress.console.print(f"{line(t.description)}: done in {t.elapsed or 0:.0f} s", markup=False,
                                        highlight=False, soft_wrap=True)
        self.task = None

    def update(self, task, **changes) -> None:
        self.progress.update(task, **changes)
        self._say(task)

    def _say(self, task, *, force: bool = False) -> None:
        import time

        if self.progress.console.is_terminal or (not force and time.monotonic() - self._said < self._every):
            return
        self._said = time.monotonic()
        t = next((t for t in self.progress.tasks if t.id == task), None)
        if t is not None:
            count = f"{t.completed:g}/{t.total:g}" if t.total else f"{t.completed:g}"
            self.progress.console.print(f"{line(t.description)}: {count}", markup=False, highlight=False,
                                        soft_wrap=True)

    def __enter__(self) -> LazyProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self._close_stage()
            self.progress.stop()


def write_text(path: Path, text: str, *, kind: str, replace: bool, flag: str = "--force") -> None:
    """Write a report of ``kind`` (files.targets) atomically (a temporary file beside it, renamed over it), under the
    overwrite rule: a failed write leaves no empty or half-written file. An unwritable path is one line."""
    import os
    import tempfile

    targets.check_target(path, kind, replace=replace, flag=flag)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def save_costs_checked(cp, path: Path, *, replace: bool) -> Path:
    """costs.save_costs under the overwrite rule: a cost file replaces only a cost file, and only when asked."""
    from skipsearch.files.cost_profile import save_costs

    targets.check_target(path, targets.COSTS, replace=replace)
    return save_costs(cp, path)


def draw_plot(plan, path: Path, *, replace: bool) -> None:
    """The (m, n) plan drawn to a PNG at ``path``, under the overwrite rule (a plot replaces only a plot)."""
    from skipsearch.methods.hierarchical.closed_form import plot_plan

    targets.check_target(path, targets.PLOT, replace=replace)
    plot_plan(plan, str(path))


def save_profile_kept(profile, path: Path, *, replace: bool, keep_in: str | Path | None = None) -> Path:
    """save_profile under the overwrite rule, where a write error (a full disk, a read-only folder, a file that
    appeared at the path while the command ran) never loses a profile that took a search to make: it is written to
    ``keep_in`` (the study directory) or the temporary folder instead, and the one-line error says where (exit 2)."""
    import tempfile

    try:
        targets.check_target(path, targets.PROFILE, replace=replace)
        return save_profile(profile, path)
    except TargetError as e:
        reason = str(e).removeprefix(f"{path}: ")
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
    kept = None
    for place in [*([Path(keep_in)] if keep_in else []), Path(tempfile.gettempdir())]:
        try:
            kept = save_profile(profile, _unused(place / f"{path.stem}.unsaved{path.suffix or '.yaml'}"))
            break
        except OSError:
            continue
    where = (f"the profile was written to {kept} instead" if kept else
             "it could not be written anywhere: free some space and run the same command again (the study keeps "
             "every trial)")
    raise ConfigError(f"cannot write {path}: {reason}; {where}")


def _unused(path: Path) -> Path:
    """``path``, or the first ``<stem>.<n><suffix>`` beside it that holds nothing: a kept profile never replaces
    another."""
    candidate, n = path, 1
    while candidate.exists() or candidate.is_symlink():
        candidate, n = path.with_name(f"{path.stem}.{n}{path.suffix}"), n + 1
    return candidate
