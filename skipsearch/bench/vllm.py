"""The vLLM peer: vLLM's own server (``servers.vllm``: its CPU build from PyPI in a venv of its own, or the user's
vLLM on a GPU machine) decoding the bench's prompt ids, plain and with each speculative setting (a profile's
``export --engine vllm`` config, or vLLM's n-gram lookup), one server per setting, started and stopped here.

vLLM reports no timings per request: a setting's speed is its generated tokens over the client's wall time of the
requests (prompt included, after one warm-up request; with several in flight, the wall time of them all), its
drafts and acceptances from the server's counters. Every output is compared with HF greedy's on the same ids.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skipsearch.servers import vllm as vs
from skipsearch.servers.process import free_port


@dataclass(frozen=True)
class VllmRow:
    """One setting on vLLM's server, over every prompt."""

    setting: str  # "plain", or what drafted ("ngram 3-4 K 6", a profile's export)
    speculative: dict | None  # its --speculative-config; None: plain decoding
    tokens: int  # generated, over every prompt
    wall_ms: float  # the requests' wall time, seen by the client
    identical: int  # prompts whose output is HF greedy's, token for token
    prompts: int
    drafted: float = 0.0  # draft tokens vLLM proposed (its /metrics counters)
    accepted: float = 0.0
    outputs: tuple[tuple[int, ...], ...] = ()
    concurrency: int = 1  # requests in flight at once

    @property
    def tokens_per_s(self) -> float | None:
        return 1e3 * self.tokens / self.wall_ms if self.wall_ms > 0 else None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def _slug(setting: str) -> str:
    """A file name's part for a setting's label (an export's label can run to a sentence)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", setting).strip("-")[:60].rstrip("-") or "plain"


def _at(port: int, prompt_ids, reference, *, max_new_tokens: int, concurrency: int, timeout: float, alive,
        setting: str, speculative: dict | None) -> VllmRow:
    """Every prompt once with ``concurrency`` requests in flight (the prompts cycled to at least that many
    requests), on a server already warm: its tokens over the client's wall time of them all."""
    from concurrent.futures import ThreadPoolExecutor

    n = max(len(prompt_ids), concurrency)
    ids = [prompt_ids[i % len(prompt_ids)] for i in range(n)]
    refs = [reference[i % len(reference)] for i in range(n)]
    d0, a0 = vs.read_spec_counters(port)
    t = time.perf_counter()
    if concurrency == 1:
        done = [vs.complete(port, p, max_new_tokens, timeout=timeout, alive=alive) for p in ids]
        wall = sum(c.wall_ms for c in done)
    else:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            done = list(pool.map(lambda p: vs.complete(port, p, max_new_tokens, timeout=timeout, alive=alive), ids))
        wall = 1e3 * (time.perf_counter() - t)
    d1, a1 = vs.read_spec_counters(port)
    outputs = tuple(c.tokens for c in done)
    same = sum(tuple(o) == tuple(r) for o, r in zip(outputs, refs, strict=True))
    return VllmRow(setting, speculative, sum(len(o) for o in outputs), wall, same, len(outputs), d1 - d0, a1 - a0,
                   outputs, concurrency)


def run_levels(python: str | Path, model_dir: str | Path, setting: str, speculative: dict | None,
               prompt_ids: Sequence[Sequence[int]], reference: Sequence[Sequence[int]], *, max_new_tokens: int,
               log_dir: Path, levels: Sequence[int] = (1,), threads: int | None = None, max_model_len: int = 2048,
               start_timeout: float = 900.0, request_timeout: float = 600.0,
               memory_fraction: float | None = None) -> tuple[VllmRow, ...]:
    """Serve ``model_dir`` with ``speculative`` (None: plain), warm it up on the first prompt, then decode every
    prompt at each concurrency of ``levels`` in turn (one row each); the server is stopped on the way out. A server
    that will not start, dies, hangs or answers garbage raises ``VllmError`` (one line)."""
    port = free_port()
    cmd = vs.server_command(python, model_dir, port, max_model_len=max_model_len, speculative=speculative,
                            memory_fraction=memory_fraction)
    log = Path(log_dir) / f"vllm-{_slug(setting)}.log"
    with vs.serving(cmd, port, log=log, start_timeout=start_timeout,
                    env=vs.server_env(python, threads=threads)) as alive:
        vs.complete(port, prompt_ids[0], min(8, max_new_tokens), timeout=request_timeout, alive=alive)  # warm-up
        return tuple(_at(port, prompt_ids, reference, max_new_tokens=max_new_tokens, concurrency=int(c),
                         timeout=request_timeout, alive=alive, setting=setting, speculative=speculative)
                     for c in levels)


def run_setting(python: str | Path, model_dir: str | Path, setting: str, speculative: dict | None,
                prompt_ids: Sequence[Sequence[int]], reference: Sequence[Sequence[int]], *, max_new_tokens: int,
                log_dir: Path, threads: int | None = None, **server) -> VllmRow:
    """``run_levels`` at one request at a time."""
    return run_levels(python, model_dir, setting, speculative, prompt_ids, reference, max_new_tokens=max_new_tokens,
                      log_dir=log_dir, threads=threads, **server)[0]


__all__ = ["VllmRow", "run_levels", "run_setting"]
