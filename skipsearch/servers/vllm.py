"""vLLM: one OpenAI-compatible server (``vllm serve``, run by the Python of the venv vLLM is installed in) and its
``/v1/completions`` endpoint. vLLM pins its own torch and transformers, so it lives in a venv of its own
(``scripts/setup.sh --engines``); skipsearch only starts that venv's Python and talks to the server over HTTP.

Requests are greedy (temperature 0), the prompt given as token ids, ``return_token_ids`` on (vLLM 0.10.2 and later:
the generated ids come back under ``choices[0].token_ids``). vLLM reports no timings per request, so a completion's
time is the client's wall time of the request, prompt included. What speculation did comes from the server's
Prometheus counters (``/metrics``: ``vllm:spec_decode_num_draft_tokens_total`` and
``vllm:spec_decode_num_accepted_tokens_total``), read before and after.

Everything that goes wrong is a ``VllmError`` of one line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from skipsearch.servers import process
from skipsearch.servers.process import ServerError

ENV = "SKIPSEARCH_VLLM_PYTHON"  # the Python of the venv vLLM is installed in
INSTALL = "bash scripts/setup_engines.sh vllm"
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


class VllmError(ServerError):
    """A vLLM server that did not do what was asked. One line."""


@dataclass(frozen=True)
class Completion:
    """One ``/v1/completions`` answer: the generated ids, why it stopped, and the client's time for the request."""

    tokens: tuple[int, ...]
    finish_reason: str  # "length" (max_tokens reached) or "stop" (an EOS)
    prompt_tokens: int  # usage.prompt_tokens
    wall_ms: float  # the request's wall time, seen by the client: prompt and decode together


def find_python(explicit: str | None = None, *, env: dict | None = None) -> tuple[str | None, str | None]:
    """(the Python of vLLM's venv, None) or (None, one line saying why there is none): ``explicit`` (--vllm-python),
    else ``$SKIPSEARCH_VLLM_PYTHON``."""
    env = os.environ if env is None else env
    for given, where in ((explicit, "--vllm-python"), (env.get(ENV) or None, f"${ENV}")):
        if given is None:
            continue
        path = Path(given).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path.absolute()), None
        return None, f"{where} {given}: no such executable (the Python of the venv vLLM is installed in)"
    return None, (f"vLLM is not installed here: `{INSTALL}` installs its CPU build into .venv-vllm; then "
                  f"export {ENV}=$PWD/.venv-vllm/bin/python, or give --vllm-python")


def server_command(python: str | Path, model: str | Path, port: int, *, dtype: str = "float32",
                   max_model_len: int = 2048, speculative: dict | None = None, served_name: str = "model",
                   memory_fraction: float | None = None) -> list[str]:
    """The command that serves ``model`` (a checkpoint folder) on the loopback at ``port``: no prefix cache (every
    prompt computed, as every other engine here computes it), and ``speculative`` as vLLM's
    ``--speculative-config`` (what ``skipsearch export --engine vllm`` writes). ``memory_fraction``: vLLM's
    ``--gpu-memory-utilization``, which on its CPU backend is the share of the machine's memory it reserves, and
    checks is free at start (its 0.92 default fails on a machine where anything else holds memory)."""
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", served_name, "--host", process.HOST, "--port", str(int(port)), "--dtype", dtype,
           "--max-model-len", str(int(max_model_len)), "--no-enable-prefix-caching", "--seed", "0"]
    if memory_fraction is not None:
        cmd += ["--gpu-memory-utilization", f"{float(memory_fraction):g}"]
    if speculative:
        cmd += ["--speculative-config", json.dumps(speculative, sort_keys=True)]
    return cmd


def server_env(python: str | Path, *, threads: int | None = None) -> dict:
    """The server's environment: vLLM's CPU build wants its venv's OpenMP runtime loaded first (``lib/libiomp5.so``
    of the venv ``python`` lies in, where there is one: the venv's ``bin/python`` is a link to the system's
    interpreter, so the path is taken as given, never resolved). ``threads``: the CPUs its worker binds to, 0 to
    threads - 1 (``VLLM_CPU_OMP_THREADS_BIND``); None leaves vLLM's own choice, which on x86 keeps one CPU for
    its scheduler process, so that on a 2-core machine the model runs on one."""
    env = dict(os.environ)
    iomp = Path(os.path.abspath(python)).parent.parent / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), env.get("LD_PRELOAD", "")) if p)
    if threads is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{int(threads) - 1}" if threads > 1 else "0"
    return env


def request_body(prompt_ids: Sequence[int], max_new_tokens: int, *, served_name: str = "model") -> dict:
    """A greedy completion of ``prompt_ids`` (token ids, sent as they are) for at most ``max_new_tokens``."""
    return {"model": served_name, "prompt": [int(t) for t in prompt_ids], "max_tokens": int(max_new_tokens),
            "temperature": 0.0, "return_token_ids": True, "stream": False}


def parse_completion(answer: object, *, wall_ms: float) -> Completion:
    """The generated ids of a ``/v1/completions`` JSON answer; a malformed one raises ``VllmError``."""
    answer = process.answer_object(answer, error=VllmError)
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise VllmError("the answer has no single choice under 'choices'")
    tokens = choices[0].get("token_ids")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise VllmError("the answer has no list of token ids under 'choices[0].token_ids' "
                        "(a vLLM older than 0.10.2, without return_token_ids?)")
    usage = answer.get("usage")
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if isinstance(prompt, bool) or not isinstance(prompt, int) or prompt < 0:
        raise VllmError(f"usage.prompt_tokens is {prompt!r:.40}, not a count")
    return Completion(tuple(tokens), str(choices[0].get("finish_reason") or ""), prompt, float(wall_ms))


def serving(cmd: Sequence[str], port: int, *, log: Path, start_timeout: float = 900.0, poll: float = 0.5,
            env: dict | None = None):
    """``process.serving`` for a vLLM server: it answers ``/health`` once the model is loaded and warmed up."""
    return process.serving(cmd, port, log=log, start_timeout=start_timeout, poll=poll, name="vLLM server",
                           env=env, error=VllmError)


def complete(port: int, prompt_ids: Sequence[int], max_new_tokens: int, *, timeout: float = 600.0,
             alive: Callable[[], None] | None = None, served_name: str = "model") -> Completion:
    """POST one greedy completion to the server on ``port`` and parse its answer, timed by the client."""
    t = time.perf_counter()
    answer = process.post_json(port, "/v1/completions", request_body(prompt_ids, max_new_tokens,
                                                                      served_name=served_name),
                               timeout=timeout, name="the vLLM server", alive=alive, error=VllmError)
    return parse_completion(answer, wall_ms=1e3 * (time.perf_counter() - t))


def spec_counters(metrics: str | None) -> tuple[float, float]:
    """Draft tokens proposed and accepted so far, summed over the ``/metrics`` page's series (0, 0 where the page
    has none: no speculation configured, or no page)."""
    drafted = accepted = 0.0
    for raw in (metrics or "").splitlines():
        if raw.startswith("#") or not raw.strip():
            continue
        name, _, value = raw.rpartition(" ")
        base = name.split("{", 1)[0]
        try:
            number = float(value)
        except ValueError:
            continue
        if base == DRAFTED:
            drafted += number
        elif base == ACCEPTED:
            accepted += number
    return drafted, accepted


def read_spec_counters(port: int) -> tuple[float, float]:
    """``spec_counters`` of the server on ``port`` now."""
    return spec_counters(process.get_text(port, "/metrics"))


__all__ = ["ENV", "INSTALL", "Completion", "VllmError", "complete", "find_python", "parse_completion",
           "read_spec_counters", "request_body", "server_command", "server_env", "serving", "spec_counters"]
