"""One ``llama-server`` process and its ``/completion`` endpoint, for the llama.cpp peer (``bench.llamacpp``).

The server listens on 127.0.0.1 only, at a port the OS hands out; its log goes to a file (a pipe nobody reads
would fill and stall it); it is stopped in ``finally``. Every wait is bounded, and everything that goes wrong
(a binary that will not start, a server that dies, an answer without tokens) is a ``LlamaCppError`` of one line.

Requests are greedy (temperature 0, top-k 1), the prompt given as token ids, ``return_tokens`` on and the prompt
cache off. The response fields read (``tools/server``, ``server_task_result_cmpl_final::to_json_non_oaicompat``
and ``server_slot_stats::to_json`` of the llama.cpp vendored in llama-cpp-python 0.3.36): ``tokens``,
``stop_type`` and ``timings`` (``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``; ``draft_n`` and
``draft_n_accepted`` only when something was drafted).
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
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"  # loopback only: nothing outside this machine reaches the server

# urllib would send loopback requests through $http_proxy where no_proxy leaves 127.0.0.1 out
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LlamaCppError(RuntimeError):
    """A llama-server that did not do what was asked. One line."""


@dataclass(frozen=True)
class Completion:
    """One ``/completion`` answer: the tokens and the server's own counters for them."""

    tokens: tuple[int, ...]  # generated token ids
    predicted_n: int  # tokens the server generated
    predicted_ms: float  # the server's time generating them
    prompt_n: int  # prompt tokens it processed
    prompt_ms: float  # its time processing them
    drafted: int = 0  # timings.draft_n: draft tokens proposed
    accepted: int = 0  # timings.draft_n_accepted: draft tokens kept
    stop_type: str = ""  # "limit" (n_predict reached), "eos", "word", "none"


def request_body(prompt_ids: Sequence[int], max_new_tokens: int) -> dict:
    """A greedy completion of ``prompt_ids`` (token ids, sent as they are) for at most ``max_new_tokens``."""
    return {"prompt": [int(t) for t in prompt_ids], "n_predict": int(max_new_tokens), "temperature": 0.0,
            "top_k": 1, "cache_prompt": False, "return_tokens": True, "stream": False}


def parse_completion(answer: object) -> Completion:
    """The tokens and timings of a ``/completion`` JSON answer; a malformed one raises ``LlamaCppError``."""
    if not isinstance(answer, dict):
        raise LlamaCppError(f"the answer is {type(answer).__name__}, not a JSON object")
    if "error" in answer:
        err = answer["error"]
        raise LlamaCppError(f"server error: {err.get('message', err) if isinstance(err, dict) else err}")
    tokens, timings = answer.get("tokens"), answer.get("timings")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise LlamaCppError("the answer has no list of token ids under 'tokens'")
    if not isinstance(timings, dict):
        raise LlamaCppError("the answer has no 'timings'")
    if not tokens and timings.get("predicted_n"):
        raise LlamaCppError("the answer has no token ids for its predicted tokens (a server without return_tokens?)")

    def number(key: str, kind: type, default=None):
        value = timings.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise LlamaCppError(f"timings.{key} is {value!r:.40}, not a count or a duration")
        if kind is int and value != int(value):
            raise LlamaCppError(f"timings.{key} is {value!r:.40}, not a count")
        return kind(value)

    return Completion(tuple(tokens), number("predicted_n", int), number("predicted_ms", float),
                      number("prompt_n", int), number("prompt_ms", float), number("draft_n", int, 0),
                      number("draft_n_accepted", int, 0), str(answer.get("stop_type", "")))


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
def serving(cmd: Sequence[str], port: int, *, log: Path, start_timeout: float = 300.0,
            poll: float = 0.2) -> Iterator[Callable[[], None]]:
    """Run ``cmd`` (a llama-server listening on ``port``) until it answers ``/health``; yield a check that raises
    if it has died since; stop it on the way out, whatever happened."""
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        except OSError as e:
            raise LlamaCppError(f"cannot start {cmd[0]}: {e.strerror or e}") from None

        def alive() -> None:
            if proc.poll() is not None:
                raise LlamaCppError(f"llama-server exited (status {proc.returncode}): {log_line(log)}")

        try:
            deadline = time.monotonic() + start_timeout  # a deadline, not a measurement
            while not _healthy(port):
                alive()
                if time.monotonic() > deadline:
                    raise LlamaCppError(f"llama-server did not answer /health within {start_timeout:g} s: "
                                        f"{log_line(log)}")
                time.sleep(poll)
            yield alive
        finally:
            _stop(proc)


def _healthy(port: int) -> bool:
    try:
        with _OPENER.open(f"http://{HOST}:{port}/health", timeout=2) as r:
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
    """The message of an error answer (``{"error": {"code", "message", "type"}}``), else its first characters."""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        err = None
    message = err.get("message") if isinstance(err, dict) else err
    return str(message)[:300] if message else body.strip()[:200]


def complete(port: int, prompt_ids: Sequence[int], max_new_tokens: int, *, timeout: float = 600.0,
             alive: Callable[[], None] | None = None) -> Completion:
    """POST one greedy completion to the server on ``port`` and parse its answer."""
    req = urllib.request.Request(f"http://{HOST}:{port}/completion",
                                 data=json.dumps(request_body(prompt_ids, max_new_tokens)).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raise LlamaCppError(f"HTTP {e.code}: {_error_message(e.read().decode(errors='replace'))}") from None
    except (OSError, ValueError) as e:
        if alive is not None:
            alive()  # a server that died says why, from its log
        raise LlamaCppError(f"no answer from llama-server: {e}") from None
    try:
        answer = json.loads(raw)
    except ValueError:
        raise LlamaCppError(f"the answer is not JSON: {raw[:100]!r}") from None
    return parse_completion(answer)


__all__ = ["HOST", "Completion", "LlamaCppError", "complete", "free_port", "log_line", "parse_completion",
           "request_body", "serving"]
