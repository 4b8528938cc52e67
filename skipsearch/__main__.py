"""``python -m skipsearch`` and the ``skipsearch`` console script.

Ctrl-C (or SIGTERM) at any moment is ``interrupted`` on stderr and exit 130, with no traceback: while the CLI's own
modules (torch, transformers, optuna: seconds) import, inside a command (its handlers write what was
finished first), inside native code that turns it into another error (a command's bad-input line is then
``interrupted``), and where it lands in a finalizer, which Python would otherwise swallow
("Exception ignored in ...") and run on, the command's last moments included.
"""

import sys


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _interrupt_again(unraisable) -> None:
    # A KeyboardInterrupt raised inside a finalizer cannot propagate. Deliver it again a moment later, from a
    # timer signal, in the main thread's own code (should that land in a finalizer too, this comes round again).
    import signal
    import threading

    if (unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt)
            and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGALRM, _raise_interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        return
    sys.__unraisablehook__(unraisable)


def _import_app():
    """The CLI, imported with Ctrl-C held back: an interrupt raised inside a C extension's module initialisation
    (numpy's, under scipy) can leave that module half made and surface as an unrelated error. One that arrives
    meanwhile is delivered as soon as the imports are done."""
    from skipsearch.interrupts import held_interrupt

    pending: list[int] = []
    with held_interrupt(pending):
        from skipsearch.cli import app
    if pending:
        raise KeyboardInterrupt
    return app


def collect_less() -> None:
    """The cycle collector's youngest generation collected every 10,000 net allocations, not 700: importing torch and
    transformers and loading a model allocate millions of objects that live as long as the process, and at 700 the
    collector ran about 1,600 times over them, 1.4 s of a warm 6.9 s ``decode`` (Zen 5, 2 cores;
    studies/startup-cpu.md). Cyclic garbage waits a little longer; reference counting frees the rest as always.
    Called first by ``main``, and by the test suite's ``conftest.py``."""
    import gc

    gc.set_threshold(10_000, *gc.get_threshold()[1:])


def main() -> None:
    import signal

    from skipsearch.interrupts import INTERRUPTS, raise_interrupt

    collect_less()
    sys.unraisablehook = _interrupt_again
    for sig in INTERRUPTS:  # Ctrl-C, and SIGTERM taken as it: Python's own handler, that also records it
        signal.signal(sig, raise_interrupt)
    try:
        app = _import_app()
        try:
            app()
        finally:
            _deliver_pending()
    except KeyboardInterrupt:
        _taken()
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    finally:
        _leaving()


def _deliver_pending() -> None:
    """A Ctrl-C that landed in a finalizer waits 10 ms for its re-delivery (``_interrupt_again``). A command that ended
    meanwhile ends interrupted all the same: otherwise it would exit with the timer armed, and the timer's signal,
    whose handler Python's exit resets, would kill the process (exit -14) or the interrupt be lost (exit 0)."""
    import signal

    if hasattr(signal, "getitimer") and signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise KeyboardInterrupt


def _leaving() -> None:
    """The command is over and the process exits: Python's exit would run its cycle collector over every object
    torch, transformers, sympy and the model made, several passes that took 1.1-1.3 s of a warm ``decode``'s 7.4 s
    (Zen 5, 2 cores; studies/startup-cpu.md). Frozen, they are left to the exit's reference counting and its exit
    handlers, which still run: files are written and closed with their ``with`` blocks, temporary folders go with
    their finalizers, and the standard streams are flushed as always."""
    import gc

    sys.unraisablehook = _quiet_interrupts  # a Ctrl-C in a finalizer from here on: the command is over, let it exit
    gc.freeze()


def _taken() -> None:
    """The interrupt is taken: as the process exits, nothing delivers it again. A re-delivery ``_interrupt_again``
    had pending, or one it would set for a finalizer the exit runs, would otherwise end the exit by SIGINT after the
    ``interrupted`` line (seen under heavy load), not with exit 130."""
    import signal

    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0)
    sys.unraisablehook = _quiet_interrupts


def _quiet_interrupts(unraisable) -> None:
    if unraisable.exc_type is None or not issubclass(unraisable.exc_type, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)


if __name__ == "__main__":
    main()
