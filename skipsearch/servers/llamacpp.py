"""llama.cpp: one ``llama-server`` process (``servers.process``) and its ``/completion`` endpoint, for the llama.cpp
peer (``bench.llamacpp``). Everything that goes wrong is a ``LlamaCppError`` of one line.

Requests are greedy (temperature 0, top-k 1), the prompt given as token ids, ``return_tokens`` on and the prompt
cache off. The response fields read (``tools/server``, ``server_task_result_cmpl_final::to_json_non_oaicompat``
and ``server_slot_stats::to_json`` of the llama.cpp vendored in llama-cpp-python 0.3.36): ``tokens``,
``stop_type`` and ``timings`` (``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``; ``draft_n`` and
``draft_n_accepted`` only when something was drafted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skipsearch.servers import process
from skipsearch.servers.process import HOST, ServerError, free_port, log_line


class LlamaCppError(ServerError):
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
    answer = process.answer_object(answer, error=LlamaCppError)
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


def serving(cmd: Sequence[str], port: int, *, log, start_timeout: float = 300.0, poll: float = 0.2):
    """``process.serving`` for a llama-server: it answers ``/health`` once its model is loaded."""
    return process.serving(cmd, port, log=log, start_timeout=start_timeout, poll=poll, name="llama-server",
                           error=LlamaCppError)


def complete(port: int, prompt_ids: Sequence[int], max_new_tokens: int, *, timeout: float = 600.0,
             alive: Callable[[], None] | None = None) -> Completion:
    """POST one greedy completion to the server on ``port`` and parse its answer."""
    answer = process.post_json(port, "/completion", request_body(prompt_ids, max_new_tokens), timeout=timeout,
                               name="llama-server", alive=alive, error=LlamaCppError)
    return parse_completion(answer)


__all__ = ["HOST", "Completion", "LlamaCppError", "complete", "free_port", "log_line", "parse_completion",
           "request_body", "serving"]
