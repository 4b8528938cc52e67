"""An engine's server process on this machine, for every engine of ``skipsearch.servers``: started from a command,
waited for until it answers its health check, stopped in ``finally``, and asked over HTTP on the loopback.

The server listens on 127.0.0.1 only, at a port the OS hands out; its log goes to a file (a pipe nobody reads would
fill and stall it). Every wait is bounded, and everything that goes wrong (a binary that will not start, a server
that dies or hangs, an answer that is not JSON) is a ``ServerError`` of one line, naming the engine.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

HOST = "127.0.0.1"  # loopback only: nothing outside this machine reaches the server

# urllib would send loopback requests through $http_proxy where no_proxy leaves 127.0.0.1 out
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerError(RuntimeError):
    """An engine's server that did not do what was asked. One line."""


def free_port() -> int:
    """A TCP port free on the loopback interface now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def log_line(log: Path) -> str:
    """The line of a server log that says most about a failure: the last that mentions an error, else the last."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    said = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "(empty log)")
    return said[:300]


@contextlib.contextmanager
def serving(cmd: Sequence[str], port: int, *, log: Path, name: str, start_timeout: float = 300.0, poll: float = 0.2,
            health: str = "/health", env: dict | None = None,
            error: type[ServerError] = ServerError) -> Iterator[Callable[[], None]]:
    """Run ``cmd`` (a server called ``name`` listening on ``port``) until it answers ``health``; yield a check that
    raises ``error`` if it has died since; stop it on the way out, whatever happened."""
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env)
        except OSError as e:
            raise error(f"cannot start {cmd[0]}: {e.strerror or e}") from None

        def alive() -> None:
            if proc.poll() is not None:
                raise error(f"{name} exited (status {proc.returncode}): {log_line(log)}")

        try:
            deadline = time.monotonic() + start_timeout  # a deadline, not a measurement
            while not _healthy(port, health):
                alive()
                if time.monotonic() > deadline:
                    raise error(f"{name} did not answer {health} within {start_timeout:g} s: {log_line(log)}")
                time.sleep(poll)
            yield alive
        finally:
            _stop(proc)


def _healthy(port: int, path: str) -> bool:
    try:
        with _OPENER.open(f"http://{HOST}:{port}{path}", timeout=2) as r:
            return r.status == 200
    except (OSError, ValueError):  # refused while starting, 503 while loading the model
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def _error_message(body: str) -> str:
    """The message of an error answer (``{"error": {"code", "message", "type"}}`` or ``{"error": "..."}``), else
    its first characters."""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        err = None
    message = err.get("message") if isinstance(err, dict) else err
    return str(message)[:300] if message else body.strip()[:200]


def post_json(port: int, path: str, body: dict, *, timeout: float, name: str,
              alive: Callable[[], None] | None = None, error: type[ServerError] = ServerError) -> object:
    """POST ``body`` as JSON to the server on ``port`` and return its parsed JSON answer. An HTTP error, no answer
    within ``timeout`` (a hung server) or an answer that is not JSON is one line; a server that died says why."""
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raise error(f"HTTP {e.code}: {_error_message(e.read().decode(errors='replace'))}") from None
    except (OSError, ValueError) as e:
        if alive is not None:
            alive()  # a server that died says why, from its log
        raise error(f"no answer from {name}: {e}") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise error(f"the answer is not JSON: {raw[:100]!r}") from None


def answer_object(answer: object, *, error: type[ServerError] = ServerError) -> dict:
    """A parsed answer as the JSON object every engine's completion is, where it carries no ``error`` field
    (``{"error": {"message": ...}}`` or ``{"error": "..."}``); else ``error`` of one line."""
    if not isinstance(answer, dict):
        raise error(f"the answer is {type(answer).__name__}, not a JSON object")
    if "error" in answer:
        err = answer["error"]
        raise error(f"server error: {err.get('message', err) if isinstance(err, dict) else err}")
    return answer


def get_text(port: int, path: str, *, timeout: float = 10.0) -> str | None:
    """A GET's body as text (a metrics page), or None where the server gives none."""
    try:
        with _OPENER.open(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
            return r.read().decode(errors="replace")
    except (OSError, ValueError):
        return None


__all__ = ["HOST", "ServerError", "answer_object", "free_port", "get_text", "log_line", "post_json", "serving"]
